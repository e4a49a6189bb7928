"""Database errors told without private data.

PostgreSQL error text is not safe to log as it comes: ``DETAIL`` and ``CONTEXT`` lines may quote
row values (``Key (...)=(...)``, ``Failing row contains (...)``, a trigger's ``RAISE`` of
``OLD.note``), and psycopg puts all of them in ``str(error)``. Every database error that leaves
the retention core is therefore described here from its SQLSTATE: a short *kind* an operator can
act on, the driver's error class, the SQLSTATE and, only for errors whose text the server writes
from a fixed template (timeouts, permissions, a missing table, a lost connection), the primary
message. Anything else is named by class and SQLSTATE alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

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
}

#: Kinds worth retrying as they are: the same statement may well succeed a moment later.
TRANSIENT_KINDS = frozenset({"connection_lost", "deadlock_detected", "serialization_failure",
                             "lock_not_available", "too_many_connections"})


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
    """

    kind: str
    error_class: str
    sqlstate: str | None
    message: str | None

    @property
    def transient(self) -> bool:
        """Whether running the same work again a little later may succeed."""
        return self.kind in TRANSIENT_KINDS

    def __str__(self) -> str:
        text = f"{self.kind}: {self.error_class}"
        if self.sqlstate:
            text += f" (SQLSTATE {self.sqlstate})"
        if self.message:
            text += f": {self.message}"
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
    elif _is_disconnect(exc, orig):
        # libpq's own text ("server closed the connection unexpectedly", "connection to server
        # ... failed: Connection refused"): client-side, never row data nor a password.
        kind = "connection_lost"
        primary = _first_line(orig)
    if kind is None:
        return ErrorDescription("database_error", type(orig).__name__, sqlstate, None)
    return ErrorDescription(kind, type(orig).__name__, sqlstate, primary)


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
