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

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from favorites_maintenance.retention.report import PurgeReport


class ErrorKind(enum.StrEnum):
    """What went wrong with a database statement, as an operator can act on it: PostgreSQL's
    condition names where they are clear (``statement_timeout``, ``connection_lost``, ...);
    ``database_error`` when the SQLSTATE is not one of the known ones.

    A ``str``: a member equals its value (``ErrorKind.CONNECTION_LOST == "connection_lost"``),
    and ``str()``, f-strings and ``%s`` render the value, so messages, metadata and span
    attributes read as plain names.
    """

    STATEMENT_TIMEOUT = "statement_timeout"
    QUERY_CANCELED = "query_canceled"
    LOCK_NOT_AVAILABLE = "lock_not_available"
    PERMISSION_DENIED = "permission_denied"
    UNDEFINED_TABLE = "undefined_table"
    UNDEFINED_COLUMN = "undefined_column"
    UNDEFINED_SCHEMA = "undefined_schema"
    DEADLOCK_DETECTED = "deadlock_detected"
    SERIALIZATION_FAILURE = "serialization_failure"
    READ_ONLY = "read_only"
    AUTHENTICATION_FAILED = "authentication_failed"
    UNKNOWN_DATABASE = "unknown_database"
    CONNECTION_LOST = "connection_lost"
    TLS_ERROR = "tls_error"  # client-side: a certificate refused, a TLS file missing
    TOO_MANY_CONNECTIONS = "too_many_connections"
    INSUFFICIENT_RESOURCES = "insufficient_resources"
    STALE_STATEMENT = "stale_statement"
    FEATURE_NOT_SUPPORTED = "feature_not_supported"
    OBJECT_NOT_IN_PREREQUISITE_STATE = "object_not_in_prerequisite_state"
    INVALID_COLUMN_REFERENCE = "invalid_column_reference"
    RESTRICT_VIOLATION = "restrict_violation"
    FOREIGN_KEY_VIOLATION = "foreign_key_violation"
    NOT_NULL_VIOLATION = "not_null_violation"
    UNIQUE_VIOLATION = "unique_violation"
    CHECK_VIOLATION = "check_violation"
    EXCLUSION_VIOLATION = "exclusion_violation"
    INTEGRITY_CONSTRAINT_VIOLATION = "integrity_constraint_violation"
    RAISE_EXCEPTION = "raise_exception"
    PLPGSQL_ERROR = "plpgsql_error"
    DATA_EXCEPTION = "data_exception"
    TRIGGERED_ACTION_EXCEPTION = "triggered_action_exception"
    TRIGGERED_DATA_CHANGE_VIOLATION = "triggered_data_change_violation"
    GENERATED_ALWAYS = "generated_always"
    DATABASE_ERROR = "database_error"


#: SQLSTATE (or class prefix) -> kind. The server writes these messages from fixed templates
#: that name objects (a table, a role) but never row values.
_KINDS: dict[str, ErrorKind] = {
    # query_canceled: refined below (statement vs. user cancel)
    "57014": ErrorKind.STATEMENT_TIMEOUT,
    "55P03": ErrorKind.LOCK_NOT_AVAILABLE,  # lock_timeout
    "42501": ErrorKind.PERMISSION_DENIED,
    "42P01": ErrorKind.UNDEFINED_TABLE,
    "42703": ErrorKind.UNDEFINED_COLUMN,
    "3F000": ErrorKind.UNDEFINED_SCHEMA,
    "40P01": ErrorKind.DEADLOCK_DETECTED,
    "40001": ErrorKind.SERIALIZATION_FAILURE,
    "25006": ErrorKind.READ_ONLY,
    "28000": ErrorKind.AUTHENTICATION_FAILED,
    "28P01": ErrorKind.AUTHENTICATION_FAILED,
    "3D000": ErrorKind.UNKNOWN_DATABASE,
    # admin_shutdown: pg_terminate_backend, smart/fast shutdown
    "57P01": ErrorKind.CONNECTION_LOST,
    "57P02": ErrorKind.CONNECTION_LOST,  # crash_shutdown
    "57P03": ErrorKind.CONNECTION_LOST,  # cannot_connect_now: starting or shutting down
    "08": ErrorKind.CONNECTION_LOST,
    "53300": ErrorKind.TOO_MANY_CONNECTIONS,
    "53": ErrorKind.INSUFFICIENT_RESOURCES,
    # A prepared or plan-cached statement outlived a schema change (or a pooler moved the
    # session): running it again re-plans it.
    "26000": ErrorKind.STALE_STATEMENT,
    # A feature the statement needs is refused for this table (e.g. a DELETE rule, which
    # PostgreSQL does not apply to a DELETE ... RETURNING in WITH).
    "0A000": ErrorKind.FEATURE_NOT_SUPPORTED,
    # A table the statement needs is not in the state it requires, e.g. one in a publication
    # that publishes deletes and has no replica identity: PostgreSQL refuses every DELETE.
    "55000": ErrorKind.OBJECT_NOT_IN_PREREQUISITE_STATE,
    # A column the statement relies on is refused, e.g. a publication's row filter on a column
    # outside the table's replica identity: PostgreSQL refuses every DELETE on it.
    "42P10": ErrorKind.INVALID_COLUMN_REFERENCE,
    # A value written into a generated column or a GENERATED ALWAYS identity: the message names
    # the column, never the value.
    "428C9": ErrorKind.GENERATED_ALWAYS,
    # Row-level errors: one row of a batch cannot be deleted (a foreign key, a trigger, a
    # cascade into another table); the rest of the batch could.
    "23001": ErrorKind.RESTRICT_VIOLATION,
    "23503": ErrorKind.FOREIGN_KEY_VIOLATION,
    "23502": ErrorKind.NOT_NULL_VIOLATION,
    "23505": ErrorKind.UNIQUE_VIOLATION,
    "23514": ErrorKind.CHECK_VIOLATION,
    "23P01": ErrorKind.EXCLUSION_VIOLATION,
    "23": ErrorKind.INTEGRITY_CONSTRAINT_VIOLATION,
    # Raised by triggers and functions: their messages are the author's text, which may quote
    # the row, so only the kind is told.
    "P0001": ErrorKind.RAISE_EXCEPTION,
    "P0": ErrorKind.PLPGSQL_ERROR,
    "22": ErrorKind.DATA_EXCEPTION,
    "09": ErrorKind.TRIGGERED_ACTION_EXCEPTION,
    "27": ErrorKind.TRIGGERED_DATA_CHANGE_VIOLATION,
}

#: Kinds whose primary message names schema objects only (the templates of integrity errors).
#: Any other kind found by the row-level classes below is told by class and SQLSTATE alone:
#: a trigger's ``RAISE`` or a data exception may quote row values.
_SAFE_MESSAGE_KINDS = frozenset({
    ErrorKind.STATEMENT_TIMEOUT, ErrorKind.QUERY_CANCELED, ErrorKind.LOCK_NOT_AVAILABLE,
    ErrorKind.PERMISSION_DENIED, ErrorKind.UNDEFINED_TABLE, ErrorKind.UNDEFINED_COLUMN,
    ErrorKind.UNDEFINED_SCHEMA, ErrorKind.DEADLOCK_DETECTED, ErrorKind.SERIALIZATION_FAILURE,
    ErrorKind.READ_ONLY, ErrorKind.AUTHENTICATION_FAILED, ErrorKind.UNKNOWN_DATABASE,
    ErrorKind.CONNECTION_LOST, ErrorKind.TLS_ERROR, ErrorKind.TOO_MANY_CONNECTIONS,
    ErrorKind.INSUFFICIENT_RESOURCES,
    ErrorKind.STALE_STATEMENT, ErrorKind.FEATURE_NOT_SUPPORTED,
    ErrorKind.OBJECT_NOT_IN_PREREQUISITE_STATE, ErrorKind.INVALID_COLUMN_REFERENCE,
    ErrorKind.GENERATED_ALWAYS,
    ErrorKind.RESTRICT_VIOLATION, ErrorKind.FOREIGN_KEY_VIOLATION, ErrorKind.NOT_NULL_VIOLATION,
    ErrorKind.CHECK_VIOLATION, ErrorKind.EXCLUSION_VIOLATION,
    ErrorKind.INTEGRITY_CONSTRAINT_VIOLATION,
})

#: SQLSTATE classes raised by something about one row: integrity constraints (23), data
#: exceptions in a trigger (22), PL/pgSQL ``RAISE`` (P0), triggered actions (09, 27) and
#: routines (2F, 38, 39). A batch failing with one of them is worth splitting.
ROW_LEVEL_CLASSES = frozenset({"23", "22", "P0", "09", "27", "2F", "38", "39"})

_ROUTINE = re.compile(r"PL/pgSQL function ([^\s(]+)\(")
#: The column a generated-always message names (the server sets no column field for it).
_GENERATED_COLUMN = re.compile(r'column "(.*)"')

#: libpq's words for a TLS session that cannot be set up: a server certificate refused (another
#: authority, another host name, expired), a certificate or key file of the URL missing, no
#: protocol in common. The same connection fails the same way until the URL or the server's
#: certificate changes, unlike a connection lost mid-session over TLS ("SSL SYSCALL error",
#: "SSL connection has been closed unexpectedly").
_TLS_FAILURE = re.compile(r"certificate|does not match host name|ssl(v3)? alert|tlsv1(\.\d)? "
                          r"alert|private key file|SSL support is not compiled", re.IGNORECASE)

#: Kinds worth retrying as they are: the same statement may well succeed a moment later.
TRANSIENT_KINDS = frozenset({
    ErrorKind.CONNECTION_LOST, ErrorKind.DEADLOCK_DETECTED, ErrorKind.SERIALIZATION_FAILURE,
    ErrorKind.LOCK_NOT_AVAILABLE, ErrorKind.TOO_MANY_CONNECTIONS, ErrorKind.STALE_STATEMENT,
})


@dataclass(frozen=True)
class ErrorDescription:
    """What may be said about a database error.

    Attributes:
        kind: the :class:`ErrorKind`, e.g. ``statement_timeout``, ``lock_not_available``,
            ``connection_lost``, ``permission_denied`` (PostgreSQL's condition names where
            they are clear); ``database_error`` when the SQLSTATE is not one of the known
            ones. Equal to its name as a string.
        error_class: the driver's exception class, e.g. ``QueryCanceled``.
        sqlstate: the five-character SQLSTATE, or ``None`` (client-side errors).
        message: the server's primary message for the known kinds, else ``None``.
        schema: schema of the object the server names (``diag.schema_name``), or ``None``.
        table: table the server names (``diag.table_name``), or ``None``.
        constraint: constraint the server names (``diag.constraint_name``), or ``None``.
        column: column the server names (``diag.column_name``), or ``None``.
        routine: the PL/pgSQL function that raised (from the context line), or ``None``.
    """

    kind: ErrorKind
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
        text = str(self.kind) if self.kind != ErrorKind.DATABASE_ERROR else self.error_class
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
            kind = ErrorKind.QUERY_CANCELED
        if sqlstate == "0A000" and primary == "cached plan must not change result type":
            kind = ErrorKind.STALE_STATEMENT
    elif _is_disconnect(exc, orig):
        # libpq's own text ("server closed the connection unexpectedly", "connection to server
        # ... failed: Connection refused"): client-side, never row data nor a password.
        kind = (ErrorKind.TLS_ERROR if _TLS_FAILURE.search(str(orig))
                else ErrorKind.CONNECTION_LOST)
        primary = _first_line(orig)
    objects = _schema_objects(diag)
    if kind is ErrorKind.GENERATED_ALWAYS and not objects.get("column") and primary:
        found = _GENERATED_COLUMN.search(primary)
        objects["column"] = found.group(1) if found else None
    if kind is None:
        return ErrorDescription(ErrorKind.DATABASE_ERROR, type(orig).__name__, sqlstate, None,
                                **objects)
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
    def kind(self) -> ErrorKind:
        """The error kind, e.g. ``statement_timeout`` or ``connection_lost`` (an
        :class:`ErrorKind`, equal to that string)."""
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


class TableChangedError(PurgeError, TableShapeError):
    """The table's shape changed during the run into one the rule cannot use (a migration
    between two batches); the batch that met it was rolled back, earlier batches stay
    committed.

    Attributes:
        column: the column at fault.
        batch_no: the batch (1-based) that was rolled back.
        report: what the run had committed before it.
    """

    def __init__(self, message: str, column: str | None, batch_no: int, report: PurgeReport):
        TableShapeError.__init__(self, message, column)
        self.batch_no = batch_no
        self.report = report


class ReplicationRoleError(PurgeError):
    """The session runs with ``session_replication_role = replica``: no trigger and no foreign
    key fires, so a DELETE would leave rows referencing a deleted row (``ON DELETE RESTRICT``)
    and skip the cascades; nothing was deleted.

    Attributes:
        source: where the value comes from, as ``pg_settings.source`` says (``database``,
            ``user``, ``database user``, ``client``, ``configuration file``, ...).
    """

    def __init__(self, message: str, source: str):
        super().__init__(message)
        self.source = source


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
    """No usable connection to the policy's database; nothing was deleted. (The core knows
    the engine, not the variable its URL came from: the Dagster layer names that.)

    Attributes:
        error: the database error, described without private data.
    """

    def __init__(self, error: ErrorDescription):
        super().__init__(f"could not open a session on the database (check its URL and the "
                         f"server): {error}", error)


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
    :data:`~favorites_maintenance.retention.run_counts.BLOCKED_AFTER` candidates in a row failed
    with nothing deleted between them (a whole table blocked by a constraint or a trigger), or
    more rows failed than a run may skip. What was deleted before stays deleted.

    Attributes:
        report: what the run did, ``skipped_rows`` and ``skipped_causes`` included.
        batch_no: the batch (1-based) whose outcome ended the run.
    """

    def __init__(self, message: str, report: PurgeReport, batch_no: int = 0):
        super().__init__(message)
        self.report = report
        self.batch_no = batch_no


class NoProgressError(PurgeError):
    """The rule matches rows that no other session holds, yet the batches deleted none of them
    (or far fewer than they selected): something swallows the deletes. What was deleted before
    stays deleted.

    Attributes:
        report: what the run did.
        causes: the mechanisms found on the table that can swallow deletes (row-level
            security, ``BEFORE DELETE`` triggers, rules), named; empty when none is visible.
        batch_no: the batch (1-based) after which the run was judged.
    """

    def __init__(self, message: str, report: PurgeReport, causes: tuple[str, ...],
                 batch_no: int = 0):
        super().__init__(message)
        self.report = report
        self.causes = causes
        self.batch_no = batch_no


class ArchiveError(PurgeError):
    """A policy's archive cannot take the rows its purge deletes; nothing was deleted (or, when
    the table changed during the run, the open batch was rolled back and no batch follows).

    Raised before the first batch when the archive table's columns or types do not match the
    table's, a column of the table bears the name of an archive column, the archive has a
    constraint that could refuse an archived row, a generated column it would compute otherwise
    than the table, or a ``BEFORE INSERT`` row trigger or ``ON INSERT`` rule that could take an
    archived row elsewhere, or it is missing and this role may not create it; the message names
    the column (or constraint, trigger, rule) and the fix. A trigger or rule that appears
    during the run rolls back the batch that met it.

    Attributes:
        column: the column at fault, or ``None``.
    """

    def __init__(self, message: str, column: str | None = None):
        super().__init__(message)
        self.column = column


class ArchivePruneError(DatabaseError):
    """Deleting archived rows past the archive's retention failed; the batch in flight rolled
    back, earlier ones stay committed.

    Attributes:
        deleted_total: archived rows deleted before the failure.
        error: the database error, described without private data.
    """

    def __init__(self, archive: str, deleted_total: int, error: ErrorDescription):
        super().__init__(f"deleting rows of {archive} past the archive's retention failed "
                         f"({deleted_total} deleted before stay deleted): {error}", error)
        self.deleted_total = deleted_total


class ArchiveCountError(DatabaseError):
    """The archived rows past the archive's retention could not be counted.

    Attributes:
        error: the database error, described without private data.
    """

    def __init__(self, archive: str, error: ErrorDescription):
        super().__init__(f"could not count the rows of {archive} past the archive's retention: "
                         f"{error}", error)


class RestoreError(RetentionError):
    """A restore was refused or could not finish. When refused (an unknown run id, restored
    rows the rule would prune again, an archive that does not match the table), nothing was
    moved; otherwise (e.g. a batch the table's insert did not return whole, rolled back) the
    batches committed before it stay restored.

    Attributes:
        report: what the restore did (or would do) before it stopped, or ``None``.
    """

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


class RestoreBatchError(RestoreError, DatabaseError):
    """A restore batch failed and was rolled back whole: its rows stay in the archive; earlier
    batches stay restored.

    Attributes:
        batch_no: the batch that failed (1-based).
        report: what the restore had committed before it.
        error: the database error, described without private data.
    """

    def __init__(self, batch_no: int, report, error: ErrorDescription):
        DatabaseError.__init__(
            self, f"restore batch {batch_no} failed and was rolled back, its rows left in the "
                  f"archive ({report.restored_rows} rows restored before stay restored): "
                  f"{error}", error)
        self.batch_no = batch_no
        self.report = report
