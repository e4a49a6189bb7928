"""The errors the retention core raises, and database errors told without private data.

Every exception the core raises is a :class:`RetentionError`. Its ``transient`` says whether
the same work may succeed if run again a little later; only a :class:`DatabaseError` (a
database error the core caught and described) can be transient.

PostgreSQL error text is not safe to log as it comes: ``DETAIL`` and ``CONTEXT`` lines may quote
row values (``Key (...)=(...)``, ``Failing row contains (...)``, a trigger's ``RAISE`` of
``OLD.note``), and psycopg puts all of them in ``str(error)``. Every database error that leaves
the retention core is therefore described here from its SQLSTATE: a short *kind* an operator can
act on, the driver's error class, the SQLSTATE and, only for errors whose text the server writes
from a fixed template (timeouts, permissions, a missing table, a lost connection), the primary
message. Anything else is named by class and SQLSTATE alone.

The schema objects the server names in its diagnostic fields (``schema_name``, ``table_name``,
``constraint_name``, ``column_name``) and the PL/pgSQL function in its context line are told as
well: they are names from the schema, never values from a row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from favorites_maintenance.retention.defaults import DATABASE_URL_VAR

if TYPE_CHECKING:
    from favorites_maintenance.retention.report import PurgeReport

#: SQLSTATE (or class prefix) -> kind. The server writes these messages from fixed templates
#: that name objects (a table, a role) but never row values.
_KINDS: dict[str, str] = {
    "57014": "statement_timeout",  # query_canceled: refined below (statement vs. user cancel)
    "55P03": "lock_not_available",  # lock_timeout
    "42501": "permission_denied",
    "42P01": "undefined_table",
    "42703": "undefined_column",
    "3F000": "undefined_schema",
    "40P01": "deadlock_detected",
    "40001": "serialization_failure",
    "25006": "read_only",
    "28000": "authentication_failed",
    "28P01": "authentication_failed",
    "3D000": "unknown_database",
    "57P01": "connection_lost",  # admin_shutdown: pg_terminate_backend, smart/fast shutdown
    "57P02": "connection_lost",  # crash_shutdown
    "57P03": "connection_lost",  # cannot_connect_now: starting up or shutting down
    "08": "connection_lost",
    "53300": "too_many_connections",
    "53": "insufficient_resources",
    # A prepared or plan-cached statement outlived a schema change (or a pooler moved the
    # session): running it again re-plans it.
    "26000": "stale_statement",
    # A feature the statement needs is refused for this table (e.g. a DELETE rule, which
    # PostgreSQL does not apply to a DELETE ... RETURNING in WITH).
    "0A000": "feature_not_supported",
    # Row-level errors: one row of a batch cannot be deleted (a foreign key, a trigger, a
    # cascade into another table); the rest of the batch could.
    "23001": "restrict_violation",
    "23503": "foreign_key_violation",
    "23502": "not_null_violation",
    "23505": "unique_violation",
    "23514": "check_violation",
    "23P01": "exclusion_violation",
    "23": "integrity_constraint_violation",
    # Raised by triggers and functions: their messages are the author's text, which may quote
    # the row, so only the kind is told.
    "P0001": "raise_exception",
    "P0": "plpgsql_error",
    "22": "data_exception",
    "09": "triggered_action_exception",
    "27": "triggered_data_change_violation",
}

#: Kinds whose primary message names schema objects only (the templates of integrity errors).
#: Any other kind found by the row-level classes below is told by class and SQLSTATE alone:
#: a trigger's ``RAISE`` or a data exception may quote row values.
_SAFE_MESSAGE_KINDS = frozenset({
    "statement_timeout", "query_canceled", "lock_not_available", "permission_denied",
    "undefined_table", "undefined_column", "undefined_schema", "deadlock_detected",
    "serialization_failure", "read_only", "authentication_failed", "unknown_database",
    "connection_lost", "too_many_connections", "insufficient_resources", "stale_statement",
    "feature_not_supported",
    "restrict_violation", "foreign_key_violation", "not_null_violation", "check_violation",
    "exclusion_violation", "integrity_constraint_violation",
})

#: SQLSTATE classes raised by something about one row: integrity constraints (23), data
#: exceptions in a trigger (22), PL/pgSQL ``RAISE`` (P0), triggered actions (09, 27) and
#: routines (2F, 38, 39). A batch failing with one of them is worth splitting.
ROW_LEVEL_CLASSES = frozenset({"23", "22", "P0", "09", "27", "2F", "38", "39"})

_ROUTINE = re.compile(r"PL/pgSQL function ([^\s(]+)\(")

#: Kinds worth retrying as they are: the same statement may well succeed a moment later.
TRANSIENT_KINDS = frozenset({"connection_lost", "deadlock_detected", "serialization_failure",
                             "lock_not_available", "too_many_connections", "stale_statement"})


@dataclass(frozen=True)
class ErrorDescription:
    """What may be said about a database error.

    Attributes:
        kind: e.g. ``statement_timeout``, ``lock_not_available``, ``connection_lost``,
            ``permission_denied`` (PostgreSQL's condition names where they are clear);
            ``database_error`` when the SQLSTATE is not one of the known ones.
        error_class: the driver's exception class, e.g. ``QueryCanceled``.
        sqlstate: the five-character SQLSTATE, or ``None`` (client-side errors).
        message: the server's primary message for the known kinds, else ``None``.
        schema: schema of the object the server names (``diag.schema_name``), or ``None``.
        table: table the server names (``diag.table_name``), or ``None``.
        constraint: constraint the server names (``diag.constraint_name``), or ``None``.
        column: column the server names (``diag.column_name``), or ``None``.
        routine: the PL/pgSQL function that raised (from the context line), or ``None``.
    """

    kind: str
    error_class: str
    sqlstate: str | None
    message: str | None
    schema: str | None = None
    table: str | None = None
    constraint: str | None = None
    column: str | None = None
    routine: str | None = None

    @property
    def transient(self) -> bool:
        """Whether running the same work again a little later may succeed."""
        return self.kind in TRANSIENT_KINDS

    @property
    def row_level(self) -> bool:
        """Whether the error is about a row of the statement (see :data:`ROW_LEVEL_CLASSES`):
        the same statement without that row may succeed."""
        return bool(self.sqlstate) and self.sqlstate[:2] in ROW_LEVEL_CLASSES

    @property
    def cause(self) -> str:
        """The error told by what raised it, e.g. ``restrict_violation (SQLSTATE 23001) from
        constraint favorites.refs_favorite_fk on favorites.refs``: kind, SQLSTATE and schema
        objects only, the same for every row it stops (one log line per distinct cause)."""
        text = self.kind if self.kind != "database_error" else self.error_class
        if self.sqlstate:
            text += f" (SQLSTATE {self.sqlstate})"
        where = []
        if self.constraint:
            where.append(f"constraint {self._qualified(self.constraint)}")
        if self.routine:
            where.append(f"function {self.routine}()")
        if where:
            text += " from " + " in ".join(where)
        if self.table:
            text += f" on {self._qualified(self.table)}"
            if self.column:
                text += f".{self.column}"
        return text

    def _qualified(self, name: str) -> str:
        return f"{self.schema}.{name}" if self.schema else name

    def __str__(self) -> str:
        text = f"{self.kind}: {self.error_class}"
        if self.sqlstate:
            text += f" (SQLSTATE {self.sqlstate})"
        if self.message:
            text += f": {self.message}"
        objects = [f"{label} {value}" for label, value in (
            ("schema", self.schema), ("table", self.table), ("constraint", self.constraint),
            ("column", self.column), ("function", self.routine)) if value]
        if objects:
            text += f" [{', '.join(objects)}]"
        return text


def describe(exc: BaseException) -> ErrorDescription:
    """Describe ``exc`` (a SQLAlchemy ``DBAPIError`` or a driver error) without private data."""
    orig = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc
    sqlstate = getattr(orig, "sqlstate", None)
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    kind = None
    if sqlstate:
        kind = _KINDS.get(sqlstate) or _KINDS.get(sqlstate[:2])
        if sqlstate == "57014" and "statement timeout" not in (primary or ""):
            kind = "query_canceled"
        if sqlstate == "0A000" and primary == "cached plan must not change result type":
            kind = "stale_statement"
    elif _is_disconnect(exc, orig):
        # libpq's own text ("server closed the connection unexpectedly", "connection to server
        # ... failed: Connection refused"): client-side, never row data nor a password.
        kind = "connection_lost"
        primary = _first_line(orig)
    objects = _schema_objects(diag)
    if kind is None:
        return ErrorDescription("database_error", type(orig).__name__, sqlstate, None, **objects)
    message = primary if kind in _SAFE_MESSAGE_KINDS else None
    return ErrorDescription(kind, type(orig).__name__, sqlstate, message, **objects)


def _schema_objects(diag) -> dict[str, str | None]:
    if diag is None:
        return {}
    context = getattr(diag, "context", None) or ""
    # The context lists frames innermost first: the first PL/pgSQL function is the one that
    # raised.
    routines = _ROUTINE.findall(context)
    return {
        "schema": getattr(diag, "schema_name", None),
        "table": getattr(diag, "table_name", None),
        "constraint": getattr(diag, "constraint_name", None),
        "column": getattr(diag, "column_name", None),
        "routine": routines[0] if routines else None,
    }


def _is_disconnect(exc: BaseException, orig: BaseException) -> bool:
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return False
    return isinstance(orig, psycopg.OperationalError)


def _first_line(exc: BaseException) -> str | None:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else None


class RetentionError(Exception):
    """Base of every exception the retention core raises.

    Attributes:
        transient: whether running the same work again a little later may succeed; ``False``
            unless the error is a :class:`DatabaseError` of a transient kind.
    """

    transient: bool = False


class InvalidArgumentError(RetentionError, ValueError):
    """An argument out of range or of the wrong kind (e.g. ``batch_size <= 0``, a naive
    datetime). Still a ``ValueError``, as callers validating input expect."""


class ConnectOptionError(InvalidArgumentError):
    """An option in a database URL's query that the driver cannot take.

    Attributes:
        option: the query key at fault, e.g. ``prepare_threshold``.
    """

    def __init__(self, option: str, message: str):
        super().__init__(f"option {option!r} {message}")
        self.option = option


class DatabaseError(RetentionError):
    """A database error the core caught, described without private data.

    The driver's exception is not chained: its text may quote row values (``DETAIL``,
    ``CONTEXT``), and whatever records this error (Dagster's event log, a traceback) would
    record them too.

    Attributes:
        error: the description (:class:`ErrorDescription`).
    """

    def __init__(self, message: str, error: ErrorDescription):
        super().__init__(message)
        self.error = error

    @property
    def kind(self) -> str:
        """The error kind, e.g. ``statement_timeout`` or ``connection_lost``."""
        return self.error.kind

    @property
    def transient(self) -> bool:
        """Whether the same statement may succeed if run again a little later (the kind is
        one of :data:`TRANSIENT_KINDS`)."""
        return self.error.transient


class TableShapeError(RetentionError):
    """The table does not have the shape the rule needs; nothing was deleted.

    Attributes:
        column: the column at fault (``None`` when the table itself is missing).
    """

    def __init__(self, message: str, column: str | None = None):
        super().__init__(message)
        self.column = column


class BacklogError(DatabaseError):
    """The backlog could not be measured. ``error`` describes the database error."""

    def __init__(self, error: ErrorDescription):
        super().__init__(f"could not measure the backlog: {error}", error)


class PurgeError(RetentionError):
    """A purge could not start or could not finish."""


class StandbyError(PurgeError):
    """The connection reached a hot standby (``pg_is_in_recovery()``); nothing was deleted."""


class BatchError(PurgeError, DatabaseError):
    """A batch transaction failed and was rolled back whole; earlier batches stay committed.

    Attributes:
        batch_no: the batch that failed (1-based).
        report: what the run had committed before it (``stop_reason`` is that of an interrupted
            run and meaningless here; read ``deleted_total`` and ``batches``).
        error: the database error, described without private data.
    """

    def __init__(self, batch_no: int, report: PurgeReport, error: ErrorDescription):
        super().__init__(f"batch {batch_no} failed and was rolled back "
                         f"({report.deleted_total} rows in {report.batches} earlier batches stay "
                         f"deleted): {error}", error)
        self.batch_no = batch_no
        self.report = report


class ConnectError(PurgeError, DatabaseError):
    """No usable connection to the favorites database; nothing was deleted.

    Attributes:
        error: the database error, described without private data.
    """

    def __init__(self, error: ErrorDescription):
        super().__init__(f"could not open a session on the favorites database (check "
                         f"{DATABASE_URL_VAR} and the server): {error}", error)


class TableCheckError(PurgeError, DatabaseError):
    """The table's shape could not be read before the first batch (a migration's lock held
    past ``lock_timeout``, a lost connection); nothing was deleted.

    Attributes:
        error: the database error, described without private data.
    """

    def __init__(self, error: ErrorDescription, table: str):
        super().__init__(f"could not read the shape of {table} before the first batch "
                         f"(nothing deleted): {error}", error)


class SkippedRowsError(PurgeError):
    """Rows the rule matches could not be deleted, and not just a few:
    :data:`~favorites_maintenance.retention.purge.BLOCKED_AFTER` candidates in a row failed
    with nothing deleted between them (a whole table blocked by a constraint or a trigger), or
    more rows failed than a run may skip. What was deleted before stays deleted.

    Attributes:
        report: what the run did, ``skipped_rows`` and ``skipped_causes`` included.
    """

    def __init__(self, message: str, report: PurgeReport):
        super().__init__(message)
        self.report = report


class NoProgressError(PurgeError):
    """The rule matches rows that no other session holds, yet the batches deleted none of them
    (or far fewer than they selected): something swallows the deletes. What was deleted before
    stays deleted.

    Attributes:
        report: what the run did.
        causes: the mechanisms found on the table that can swallow deletes (row-level
            security, ``BEFORE DELETE`` triggers, rules), named; empty when none is visible.
    """

    def __init__(self, message: str, report: PurgeReport, causes: tuple[str, ...]):
        super().__init__(message)
        self.report = report
        self.causes = causes
