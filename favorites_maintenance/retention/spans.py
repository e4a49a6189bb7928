"""OpenTelemetry spans of the purge's batch transactions, through the API alone.

The API records nothing until a tracer provider is installed (the job installs one only when an
OTLP endpoint is configured, see ``favorites_maintenance.pipeline.tracing``). Without one, a batch costs
one call returning a non-recording span: no attribute is computed, no context is attached.

Each batch transaction, BEGIN to COMMIT or ROLLBACK, is one span of kind ``CLIENT`` named
``DELETE <schema>.<table>``, the child of whatever span is current (the run's). Its attributes
follow OpenTelemetry's database conventions (``db.*``) where they apply, plus ``retention.
batch.*``. A batch that fails records the error's kind (``error.type``) and SQLSTATE
(``db.response.status_code``) and sets the span's status to error; never the error's message,
never a bound parameter or a row value.
"""

from __future__ import annotations

import re
import time

import sqlalchemy as sa
from opentelemetry import context, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from favorites_maintenance.retention.errors import ErrorDescription
from favorites_maintenance.retention.rule import RetentionRule

_tracer = trace.get_tracer(__name__)

#: How SQLAlchemy renders a parameter it inlines at execution (the LIMIT): shown as a placeholder.
_POSTCOMPILE = re.compile(r"__\[POSTCOMPILE_(\w+)\]")


def table_attributes(engine: sa.Engine, rule: RetentionRule) -> dict[str, str | int]:
    """The database conventions' attributes of ``rule``'s table: ``db.system.name``,
    ``db.namespace`` (the database name), ``db.collection.name`` (``schema.table``), and
    ``server.address`` / ``server.port`` when the URL names them. Never the user or password."""
    url = engine.url
    attributes: dict[str, str | int] = {"db.system.name": "postgresql",
                                        "db.collection.name": rule.qualified_name}
    if url.database:
        attributes["db.namespace"] = url.database
    if url.host:
        attributes["server.address"] = url.host
    if url.port:
        attributes["server.port"] = url.port
    return attributes


class BatchSpans:
    """Starts the span of each batch transaction of one purge.

    Args:
        engine: the purge's engine: its dialect renders ``db.query.text``, its URL gives
            ``db.namespace`` and ``server.*``.
        rule: the purged table (``db.collection.name``, the span name).
    """

    def __init__(self, engine: sa.Engine, rule: RetentionRule):
        self._engine = engine
        self._rule = rule
        self._name = f"DELETE {rule.qualified_name}"
        self._common: dict | None = None
        self._texts: dict[int, str] = {}

    def start(self, batch_no: int, limit: int, optimistic: bool,
              statement: sa.Executable) -> "BatchSpan":
        """Start the span of batch ``batch_no`` (at most ``limit`` rows; ``optimistic``: the
        form without ``FOR UPDATE SKIP LOCKED``) and make it current; ``statement`` is the
        batch statement, recorded as parameterized text."""
        span = _tracer.start_span(self._name, kind=SpanKind.CLIENT, record_exception=False,
                                  set_status_on_exception=False)
        if not span.is_recording():
            return BatchSpan(span, None)
        if self._common is None:
            self._common = {**table_attributes(self._engine, self._rule),
                            "db.operation.name": "DELETE"}
        span.set_attributes({**self._common,
                             "db.query.text": self._text(statement),
                             "retention.batch.no": batch_no,
                             "retention.batch.limit": limit,
                             "retention.batch.optimistic": optimistic})
        return BatchSpan(span, context.attach(trace.set_span_in_context(span)))

    def _text(self, statement: sa.Executable) -> str:
        # Rendered once per statement form: placeholders stay placeholders (no bound value).
        key = id(statement)
        if key not in self._texts:
            text = str(statement.compile(dialect=self._engine.dialect))
            self._texts[key] = _POSTCOMPILE.sub(r"%(\1)s", text)
        return self._texts[key]


class BatchSpan:
    """The span of one batch transaction; ended by :meth:`committed`, :meth:`failed` or
    :meth:`end`, whichever comes first."""

    def __init__(self, span: trace.Span, token: object | None):
        self._span = span
        self._token = token
        self._started = time.monotonic()

    def committed(self, selected: int, deleted: int, rolled_back: bool = False) -> None:
        """The transaction ended without error: ``selected`` candidates, ``deleted`` rows
        deleted by its statement (undone when ``rolled_back``: an optimistic batch that met a
        moved or held row)."""
        if self._token is not None:
            self._span.set_attributes({"retention.batch.selected": selected,
                                       "retention.batch.deleted": 0 if rolled_back else deleted,
                                       "retention.batch.rolled_back": rolled_back})
        self.end()

    def failed(self, error: ErrorDescription) -> None:
        """The transaction failed and was rolled back: record the kind and SQLSTATE of
        ``error``, nothing of its message, and set the status to error."""
        if self._token is not None:
            self._span.set_attribute("error.type", str(error.kind))
            if error.sqlstate:
                self._span.set_attribute("db.response.status_code", error.sqlstate)
            self._span.set_attribute("retention.batch.rolled_back", True)
            self._span.set_status(Status(StatusCode.ERROR, str(error.kind)))
        self.end()

    def end(self) -> None:
        """End the span (once), with ``retention.batch.duration_ms``."""
        if self._token is None:
            return
        self._span.set_attribute("retention.batch.duration_ms",
                                 round((time.monotonic() - self._started) * 1000, 3))
        context.detach(self._token)
        self._token = None
        self._span.end()
