"""Engines for the favorites database (SQLAlchemy Core over psycopg 3).

Every engine of the project is made here so that the same safety settings always apply:
bound parameters are hidden from error messages (a failing statement must never print an
anonymous id or a note), passwords are never rendered, and the connection identifies itself to
``pg_stat_activity`` as ``favorites-maintenance``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

APPLICATION_NAME = "favorites-maintenance"


def create_engine(url: URL | str, *, application_name: str = APPLICATION_NAME,
                  **kwargs: Any) -> sa.Engine:
    """Create an engine for the favorites database.

    Args:
        url: SQLAlchemy URL with the ``postgresql+psycopg`` driver (see
            :func:`favorites_maintenance.settings.parse_database_url`).
        application_name: shown in ``pg_stat_activity``; tests use it to find our sessions.
        **kwargs: passed to :func:`sqlalchemy.create_engine`.

    Returns:
        An engine whose connections open lazily: creating it never touches the server.
    """
    url = make_url(url)
    connect_args = {"application_name": application_name, **kwargs.pop("connect_args", {})}
    return sa.create_engine(
        url,
        hide_parameters=True,
        pool_pre_ping=True,
        connect_args=connect_args,
        **kwargs,
    )


# SQLSTATEs worth a retry: the same statement can succeed a moment later.
TRANSIENT_SQLSTATES = {
    "40001": "serialization_failure",
    "40P01": "deadlock_detected",
    "55P03": "lock_not_available",  # lock_timeout
    "57P01": "admin_shutdown",  # server restart, pg_terminate_backend
    "57P02": "crash_shutdown",
    "57P03": "cannot_connect_now",  # server starting up
    "53300": "too_many_connections",
}


def transient_error_kind(exc: BaseException) -> str | None:
    """Name the transient database error in ``exc`` or its causes, else ``None``.

    Transient: a lost or refused connection, a serialization failure, a deadlock, a lock
    timeout (:data:`TRANSIENT_SQLSTATES`). Not transient: ``statement_timeout``
    (``query_canceled``), a missing table or privilege, bad SQL: retrying would fail the same way.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, sa.exc.DBAPIError):
            if exc.connection_invalidated:
                return "connection_lost"
            orig = exc.orig
            state = getattr(orig, "sqlstate", None)
            if state in TRANSIENT_SQLSTATES:
                return TRANSIENT_SQLSTATES[state]
            if isinstance(exc, sa.exc.OperationalError) and state is None:
                return "connection_lost"  # no SQLSTATE: the client lost the server
        exc = exc.__cause__ or exc.__context__
    return None


def error_summary(exc: BaseException) -> str:
    """``"<ExceptionType>: <first line of its message>"``, fit for a log line.

    The first line of a database error is the server's message; the SQL and (hidden) parameters
    that SQLAlchemy appends on later lines are left out.
    """
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
