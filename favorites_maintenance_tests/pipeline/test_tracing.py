"""Traces of a cleanup run: one span per purge, a child span per batch transaction, read back
from real runs of the job through Dagster (in-process executor, so the spans end in this
process), and the OTLP export wired by the standard ``OTEL_*`` variables alone."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    OLD,
    PARTITION,
    SENTINEL_ANON,
    SENTINEL_NOTE,
    delete_trigger,
    run_job,
)
from favorites_maintenance_tests.reliability.test_poison_rows import (
    guest_rows_with_sentinels,
    nth_oldest,
    reference,
)

ROOT = Path(__file__).resolve().parents[2]
BATCH_NAME = "DELETE favorites.favorites"
RUN_NAME = "guest_favorites.cleanup"


@pytest.fixture(scope="session")
def _exporter() -> InMemorySpanExporter:
    """An in-memory exporter on this process's tracer provider (installed once: the global
    provider cannot be replaced)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture
def spans(_exporter):
    """The spans finished during the test, oldest first."""
    _exporter.clear()
    yield _exporter.get_finished_spans
    _exporter.clear()


def run_and_batches(finished):
    [run] = [s for s in finished() if s.name == RUN_NAME]
    batches = sorted((s for s in finished() if s.name == BATCH_NAME), key=lambda s: s.start_time)
    return run, batches


def assert_no_private_value(finished) -> None:
    """No attribute, event or status of any span quotes an anonymous id or a note."""
    for span in finished():
        texts = [repr(dict(span.attributes)), span.status.description or ""]
        texts += [f"{e.name} {dict(e.attributes)!r}" for e in span.events]
        for text in texts:
            assert SENTINEL_ANON not in text and SENTINEL_NOTE not in text, span.name


def test_a_run_is_one_span_with_a_child_span_per_batch(db_url, rows, monkeypatch, spans):
    guest_rows_with_sentinels(rows, 25)
    rows.add_many(3, updated_at=OLD, user_id=7)

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch, batch_size=10)
    assert result.success

    run, batches = run_and_batches(spans)
    database = sa.make_url(db_url).database
    assert dict(run.attributes) == {
        "db.system.name": "postgresql",
        "db.namespace": database,
        "db.collection.name": "favorites.favorites",
        **{k: run.attributes[k] for k in ("server.address", "server.port")
           if k in run.attributes},
        "dagster.run_id": result.run_id,
        "dagster.partition": PARTITION,
        "dagster.retry_number": 0,
        "retention.policy": "guest_favorites",
        "retention.cutoff": CUTOFF.isoformat(),
        "retention.retention_days": 365,
        "retention.batch_size": 10,
        "retention.deleted_total": 25,
        "retention.batches": 3,
        "retention.stop_reason": "exhausted",
        "retention.skipped_rows": 0,
        "retention.batch_size_max": 10,
        "retention.paused_ms": 0,
        "retention.duration_ms": run.attributes["retention.duration_ms"],
    }
    assert run.status.status_code is StatusCode.UNSET

    # 10 + 10 + 5 rows: the third batch comes back short and ends the purge.
    assert [(b.attributes["retention.batch.no"], b.attributes["retention.batch.selected"],
             b.attributes["retention.batch.deleted"]) for b in batches] == [
        (1, 10, 10), (2, 10, 10), (3, 5, 5)]
    for batch in batches:
        assert batch.parent is not None and batch.parent.span_id == run.context.span_id
        assert batch.context.trace_id == run.context.trace_id
        assert batch.kind is SpanKind.CLIENT
        assert run.start_time <= batch.start_time <= batch.end_time <= run.end_time
        assert batch.status.status_code is StatusCode.UNSET
        attributes = batch.attributes
        assert (attributes["db.system.name"], attributes["db.namespace"],
                attributes["db.collection.name"], attributes["db.operation.name"]) == (
            "postgresql", database, "favorites.favorites", "DELETE")
        assert attributes["retention.batch.limit"] == 10
        assert attributes["retention.batch.rolled_back"] is False
        assert attributes["retention.batch.duration_ms"] >= 0
        # The statement's text with its placeholders, never a bound value.
        assert "DELETE FROM favorites.favorites" in attributes["db.query.text"]
        assert CUTOFF.strftime("%Y-%m-%d") not in attributes["db.query.text"]
    # Nothing can refuse the lock (no row-level security, the role may UPDATE): every batch,
    # the first one too, is optimistic.
    assert [b.attributes["retention.batch.optimistic"] for b in batches] == [True, True, True]
    assert_no_private_value(spans)


def test_a_failed_batch_is_an_error_span_with_its_kind_and_sqlstate(
        db_url, engine, rows, monkeypatch, spans):
    guest_rows_with_sentinels(rows, 20)
    poison = nth_oldest(engine, 5)
    reference(engine, poison)

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch, batch_size=10)
    assert result.success
    assert rows.ids() == {poison}

    run, batches = run_and_batches(spans)
    failed = [b for b in batches if b.status.status_code is StatusCode.ERROR]
    # 10 rows, then 5, 2 and 1 around the referenced row: each of those transactions failed.
    assert len(failed) >= 4
    for batch in failed:
        assert batch.attributes["error.type"] == "restrict_violation"
        assert batch.attributes["db.response.status_code"] == "23001"
        assert batch.attributes["retention.batch.rolled_back"] is True
        assert batch.status.description == "restrict_violation"
        assert "retention.batch.deleted" not in batch.attributes
        assert not batch.events  # no exception recorded: its text may quote the row
    assert sum(b.attributes.get("retention.batch.deleted", 0) for b in batches) == 19
    # The run went on past the row: a success that skipped one.
    assert run.status.status_code is StatusCode.UNSET
    assert (run.attributes["retention.deleted_total"],
            run.attributes["retention.skipped_rows"]) == (19, 1)
    assert_no_private_value(spans)


def test_a_batch_that_fails_the_run_makes_both_spans_errors(db_url, engine, rows, monkeypatch,
                                                             spans):
    guest_rows_with_sentinels(rows, 5)
    # Not a row-level error, so not split: the run fails at the first batch. The message
    # quotes the row; neither span may.
    delete_trigger(engine, "refuse_all", """
        RAISE EXCEPTION 'refused %% %%', OLD.note, OLD.anonymous_id
            USING ERRCODE = 'insufficient_privilege';""")

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
    assert not result.success
    assert rows.count() == 5

    run, [batch] = run_and_batches(spans)
    assert batch.status.status_code is StatusCode.ERROR
    assert (batch.attributes["error.type"], batch.attributes["db.response.status_code"]) == (
        "permission_denied", "42501")
    assert run.status.status_code is StatusCode.ERROR
    assert (run.attributes["error.type"], run.attributes["db.response.status_code"],
            run.attributes["retention.deleted_total"]) == ("permission_denied", "42501", 0)
    assert "retention.stop_reason" not in run.attributes
    assert not run.events
    assert_no_private_value(spans)


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps each request's path and decoded spans."""

    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.received.append((self.path, resource.get("service.name"), span.name))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def collector():
    _Collector.received = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", _Collector.received
    server.shutdown()
    server.server_close()


SETUP_TWICE = """
import sys
from opentelemetry import trace
from favorites_maintenance.pipeline import tracing
installed = tracing.setup()
provider = trace.get_tracer_provider()
assert tracing.setup() is installed and trace.get_tracer_provider() is provider
with trace.get_tracer("probe").start_as_current_span("probe"):
    pass
tracing.flush()
print(installed, type(provider).__name__, "opentelemetry.sdk" in sys.modules)
"""


def run_setup(env: dict[str, str]) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ.update(env, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", SETUP_TWICE], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_endpoint_variable_alone_turns_the_export_on(collector):
    url, received = collector
    assert run_setup({"OTEL_EXPORTER_OTLP_ENDPOINT": url}) == "True TracerProvider True"
    # Once, although setup() ran twice, under the default service name.
    assert received == [("/v1/traces", "favorites-maintenance", "probe")]

    received.clear()
    run_setup({"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_SERVICE_NAME": "purge-eu"})
    assert received == [("/v1/traces", "purge-eu", "probe")]


def test_without_an_endpoint_nothing_is_installed_nor_loaded():
    # The API's proxy stays in place and the SDK is never imported: the no-op path.
    assert run_setup({}) == "False ProxyTracerProvider False"
    assert run_setup({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
                      "OTEL_SDK_DISABLED": "true"}) == "False ProxyTracerProvider False"
