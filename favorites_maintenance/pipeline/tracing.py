"""Traces of the cleanup runs: OpenTelemetry SDK setup and the span of each purge.

:func:`setup` installs a tracer provider that exports over OTLP/HTTP only when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; the
exporter reads the standard ``OTEL_EXPORTER_OTLP_*`` variables (headers, timeout,
certificates), the resource ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``. Otherwise
it installs nothing, and the OpenTelemetry API stays on its no-op path: the spans below and the
retention core's batch spans cost a call each and record nothing.

:func:`run_span` is the span of one purge (one attempt of a policy's purge op), named
``<policy>.cleanup``; the retention core's batch spans (:mod:`favorites_maintenance.retention.
spans`) are its children. docs/traces.md lists every attribute.

This module imports no Dagster: the op passes what it knows of the run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import threading
from collections.abc import Iterator, Mapping

import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from favorites_maintenance.retention.errors import DatabaseError
from favorites_maintenance.retention.report import PurgeReport
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.spans import table_attributes

#: ``service.name`` when neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` sets one.
DEFAULT_SERVICE_NAME = "favorites-maintenance"

#: Either variable turns the export on (the second for traces alone).
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

#: How long the end of a run waits for its spans to leave the process, in milliseconds: a step
#: process may exit without running the exit handlers that would flush them.
FLUSH_TIMEOUT_MS = 5000

_lock = threading.Lock()
_provider = None  # the SDK provider setup() installed, if any
_tracer = trace.get_tracer(__name__)


def export_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for an OTLP export: an endpoint variable is set and not
    empty, and ``OTEL_SDK_DISABLED`` is not ``true``."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARS)


def setup() -> bool:
    """Install the SDK tracer provider (resource, ``BatchSpanProcessor``, OTLP/HTTP exporter)
    as the global one when :func:`export_configured`; idempotent and thread-safe.

    Nothing is installed when no endpoint is set, or when a tracer provider is already
    installed (by an earlier call, or by whoever embeds the job, e.g.
    ``opentelemetry-instrument``): that one is used as it is.

    Returns:
        Whether spans are exported through the provider this function installed.
    """
    global _provider
    with _lock:
        if _provider is not None:
            return True
        if not export_configured():
            return False
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return False
        # Imported here: without an endpoint the SDK and the exporter are never loaded.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create()
        if resource.attributes.get(SERVICE_NAME, "").startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _provider = provider
        return True


def flush() -> None:
    """Export the spans still queued by the provider :func:`setup` installed (at most
    :data:`FLUSH_TIMEOUT_MS`); nothing when it installed none."""
    if _provider is not None:
        _provider.force_flush(FLUSH_TIMEOUT_MS)


@contextlib.contextmanager
def run_span(policy: str, engine: sa.Engine, rule: RetentionRule, *, run_id: str,
             partition: str | None, retry_number: int, cutoff: dt.datetime,
             retention_days: int, batch_size: int) -> Iterator[trace.Span]:
    """The span ``<policy>.cleanup`` of one purge, current inside the block, ended and
    flushed (see :func:`flush`) on leaving it.

    An exception leaving the block is not recorded by the span (its text could hold anything);
    call :func:`run_failed` for what may be said. Attributes at the start: ``dagster.run_id``,
    ``dagster.partition`` (when the run has one), ``dagster.retry_number``,
    ``retention.policy``, ``retention.cutoff`` (ISO 8601), ``retention.retention_days``,
    ``retention.batch_size`` and the table's ``db.*`` (see :func:`~favorites_maintenance.
    retention.spans.table_attributes`).
    """
    try:
        with _tracer.start_as_current_span(f"{policy}.cleanup", record_exception=False,
                                           set_status_on_exception=False) as span:
            if span.is_recording():
                span.set_attributes({
                    **table_attributes(engine, rule),
                    "dagster.run_id": run_id,
                    **({"dagster.partition": partition} if partition else {}),
                    "dagster.retry_number": retry_number,
                    "retention.policy": policy,
                    "retention.cutoff": cutoff.isoformat(),
                    "retention.retention_days": retention_days,
                    "retention.batch_size": batch_size,
                })
            yield span
    finally:
        flush()


def run_done(span: trace.Span, report: PurgeReport) -> None:
    """Record what the purge did on its span: ``retention.deleted_total``,
    ``retention.batches``, ``retention.stop_reason``, ``retention.skipped_rows``,
    ``retention.batch_size_max``, ``retention.paused_ms``, ``retention.duration_ms``."""
    if span.is_recording():
        span.set_attributes({
            "retention.deleted_total": report.deleted_total,
            "retention.batches": report.batches,
            "retention.stop_reason": report.stop_reason.value,
            "retention.skipped_rows": report.skipped_rows,
            "retention.batch_size_max": report.batch_size_max,
            "retention.paused_ms": report.paused_ms,
            "retention.duration_ms": report.duration_ms,
        })


def run_failed(span: trace.Span, exc: BaseException) -> None:
    """Record a failed purge on its span: status error, ``error.type`` (the database error's
    kind, e.g. ``statement_timeout``, else the exception's class), its SQLSTATE as
    ``db.response.status_code``, and what the purge had committed before (``retention.
    deleted_total``, ``retention.batches``, ``retention.skipped_rows``) when it says so."""
    if not span.is_recording():
        return
    kind = str(exc.kind) if isinstance(exc, DatabaseError) else type(exc).__name__
    span.set_attribute("error.type", kind)
    if isinstance(exc, DatabaseError) and exc.error.sqlstate:
        span.set_attribute("db.response.status_code", exc.error.sqlstate)
    report = getattr(exc, "report", None)
    if isinstance(report, PurgeReport):
        span.set_attributes({"retention.deleted_total": report.deleted_total,
                             "retention.batches": report.batches,
                             "retention.skipped_rows": report.skipped_rows})
    span.set_status(Status(StatusCode.ERROR, kind))
