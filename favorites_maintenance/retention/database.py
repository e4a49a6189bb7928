"""Engines for the favorites database (SQLAlchemy Core over psycopg 3).

Every engine of the project is made here so that the same safety settings always apply:
bound parameters are hidden from error messages (a failing statement must never print an
anonymous id or a note), passwords are never rendered, the connection identifies itself to
``pg_stat_activity`` as ``favorites-maintenance``, connections that go stale while pooled (a
server restart) are replaced on checkout, no network wait is unbounded, and ``timestamptz``
infinities and BC instants load as :data:`MIN_UTC` / :data:`MAX_UTC` instead of failing, and a
:class:`BinaryArray` is bound in PostgreSQL's binary form.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import sqlalchemy as sa
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types.datetime import DatetimeDumper, TimestamptzLoader
from sqlalchemy.engine import URL, make_url

from favorites_maintenance.retention.errors import (
    ConnectOptionError,
    DatabaseError,
    ErrorKind,
    describe,
)

APPLICATION_NAME = "favorites-maintenance"

#: Client-side bounds on network waits (libpq parameters), unless the URL sets them.
NETWORK_LIMITS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}

#: What ``'-infinity'`` / ``'infinity'`` (and BC instants) of a ``timestamptz`` become in Python.
MIN_UTC = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
MAX_UTC = dt.datetime.max.replace(tzinfo=dt.timezone.utc)


class _ServerInstant(dt.datetime):
    """:data:`MIN_UTC` or :data:`MAX_UTC` standing for an instant Python cannot hold, with the
    server's own text of it (``raw``), which is what is bound when it is sent back."""

    raw: bytes


def _server_instant(value: dt.datetime, raw: bytes) -> _ServerInstant:
    instant = _ServerInstant(value.year, value.month, value.day, value.hour, value.minute,
                             value.second, value.microsecond, tzinfo=value.tzinfo)
    instant.raw = raw
    return instant


class _InfinityTimestamptzLoader(TimestamptzLoader):
    """Loads ``-infinity`` and BC instants as :data:`MIN_UTC`, ``infinity`` as :data:`MAX_UTC`.

    ``updated_at`` is ``timestamptz NOT NULL``, so ``'-infinity'`` is a legal value of a row the
    rule must delete; Python's datetime cannot hold it, and psycopg would fail every batch that
    reads it back. The value keeps the server's text, so a keyset position taken from such a
    row is bound back exactly (two BC instants both load as :data:`MIN_UTC`).
    """

    def load(self, data):
        raw = bytes(data)
        if raw == b"-infinity" or raw.endswith(b" BC"):
            return _server_instant(MIN_UTC, raw)
        if raw == b"infinity":
            return _server_instant(MAX_UTC, raw)
        value = super().load(data)
        if value == MIN_UTC or value == MAX_UTC:
            # Indistinguishable from the infinities once loaded: keep the server's text.
            return _server_instant(value, raw)
        return value


class _InfinityDatetimeDumper(DatetimeDumper):
    """Binds an instant loaded by :class:`_InfinityTimestamptzLoader` back as the server's own
    text of it, and :data:`MIN_UTC` / :data:`MAX_UTC` given by hand as ``-infinity`` /
    ``infinity``."""

    def dump(self, obj):
        raw = getattr(obj, "raw", None)
        if raw is not None:
            return raw
        if obj == MIN_UTC:
            return b"-infinity"
        if obj == MAX_UTC:
            return b"infinity"
        return super().dump(obj)


@dataclasses.dataclass(frozen=True)
class BinaryArray:
    """An array in PostgreSQL's binary form (what the server's ``array_send`` returns) and the
    oid of its array type, bound as such by the engines made here: the server reads it without
    parsing each element's text (a 10,000-element ``bigint[]`` in about a third of the time).

    Attributes:
        data: the array's binary form, element type and all.
        oid: the array type's oid (``pg_type.oid``, e.g. 1016 for ``bigint[]``).
    """

    data: bytes = dataclasses.field(repr=False)  # never shown: the elements may name rows
    oid: int


class _BinaryArrayDumper(Dumper):
    """Binds a :class:`BinaryArray` as its bytes, typed by its own oid (a dumper per oid)."""

    format = Format.BINARY

    def get_key(self, obj: BinaryArray, format):
        return (BinaryArray, obj.oid)

    def upgrade(self, obj: BinaryArray, format) -> "_BinaryArrayDumper":
        dumper = _BinaryArrayDumper(BinaryArray)
        dumper.oid = obj.oid
        return dumper

    def dump(self, obj: BinaryArray) -> bytes:
        return obj.data


def _adapt_types(dbapi_connection, _record) -> None:
    dbapi_connection.adapters.register_loader("timestamptz", _InfinityTimestamptzLoader)
    dbapi_connection.adapters.register_dumper(dt.datetime, _InfinityDatetimeDumper)
    dbapi_connection.adapters.register_dumper(_ServerInstant, _InfinityDatetimeDumper)
    dbapi_connection.adapters.register_dumper(BinaryArray, _BinaryArrayDumper)


#: psycopg's own connection options (not libpq's) that a URL's query may set.
_PSYCOPG_OPTIONS = {"prepare_threshold"}
#: psycopg options the job cannot run with: it manages its own transactions and row types.
_REFUSED_OPTIONS = {"autocommit", "row_factory", "cursor_factory", "context"}
_INT_OPTIONS = {"connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
                "keepalives_count", "tcp_user_timeout"}
_CHOICES = {
    "sslmode": {"disable", "allow", "prefer", "require", "verify-ca", "verify-full"},
    "target_session_attrs": {"any", "read-write", "read-only", "primary", "standby",
                             "prefer-standby"},
    "gssencmode": {"disable", "prefer", "require"},
}


def connect_options(url: URL | str) -> tuple[URL, dict[str, Any]]:
    """Split a database URL into the URL libpq reads and psycopg's own connect arguments.

    The query of a SQLAlchemy URL reaches the driver as strings. libpq parses its own keywords
    (``sslmode``, ``connect_timeout``, ``options``, ...) from text, but psycopg compares
    ``prepare_threshold`` with an integer, so it is converted here: a whole number >= 0, or
    ``None``/``none``/empty for "never prepare". When the URL does not set it the result is
    ``None``: no server-side prepared statement, which a transaction-mode pooler (PgBouncer,
    RDS Proxy, Supavisor, Odyssey) would hand to another server connection.

    Returns:
        ``(url, connect_args)``: the URL without psycopg's options, and the arguments for
        ``psycopg.connect``.

    Raises:
        ConnectOptionError: an option libpq does not know, one the job cannot run with
            (``autocommit``, ...), or a value of the wrong type (``connect_timeout=soon``).
    """
    from psycopg import pq

    url = make_url(url)
    known = {o.keyword.decode() for o in pq.Conninfo.get_defaults()}
    connect_args: dict[str, Any] = {"prepare_threshold": None}
    for key, value in url.query.items():
        if key in _REFUSED_OPTIONS:
            raise ConnectOptionError(key, "is not supported: the job manages its own "
                                          "transactions and result rows")
        if key not in known and key not in _PSYCOPG_OPTIONS:
            raise ConnectOptionError(key, "is not a libpq or psycopg connection option")
        if isinstance(value, tuple) and key not in {"host", "hostaddr", "port"}:
            raise ConnectOptionError(key, "is given more than once")
        if key == "prepare_threshold":
            connect_args[key] = _prepare_threshold(value)
        elif key == "dbname":
            raise ConnectOptionError(key, "is not taken here: name the database in the URL's "
                                          "path (postgresql+psycopg://user@host/DATABASE)")
        elif key in _INT_OPTIONS and not _whole_number(value):
            raise ConnectOptionError(key, f"must be a whole number >= 0, got {value!r}")
        elif key in _CHOICES and value not in _CHOICES[key]:
            raise ConnectOptionError(key, f"must be one of {', '.join(sorted(_CHOICES[key]))}; "
                                          f"got {value!r}")
    return url.difference_update_query(_PSYCOPG_OPTIONS), connect_args


def _whole_number(value: str) -> bool:
    return value.isascii() and value.isdigit()


def _prepare_threshold(value: str) -> int | None:
    if value.strip().lower() in {"", "none", "null"}:
        return None
    if not _whole_number(value.strip()):
        raise ConnectOptionError("prepare_threshold", "must be a whole number >= 0 or None "
                                                      f"(never prepare), got {value!r}")
    return int(value)


def create_engine(url: URL | str, *, application_name: str = APPLICATION_NAME,
                  **kwargs: Any) -> sa.Engine:
    """Create an engine for the favorites database.

    Args:
        url: SQLAlchemy URL with the ``postgresql+psycopg`` driver (see
            :func:`favorites_maintenance.config.parsers.parse_database_url`).
        application_name: shown in ``pg_stat_activity``; tests use it to find our sessions.
        **kwargs: passed to :func:`sqlalchemy.create_engine`.

    Returns:
        An engine whose connections open lazily: creating it never touches the server. Its
        connections prepare no server-side statement unless the URL sets ``prepare_threshold``
        (see :func:`connect_options`).

    Raises:
        ConnectOptionError: an option of the URL's query the driver cannot take.
    """
    url, driver_args = connect_options(url)
    # libpq waits without limit by default: for a host that drops packets or accepts and never
    # answers (connect), and for a peer that vanished mid-statement (keepalives; TCP only).
    # Values in the URL's query win, so an operator can still tune them there.
    network_limits = {k: v for k, v in NETWORK_LIMITS.items() if k not in url.query}
    connect_args = {"application_name": application_name, **network_limits, **driver_args,
                    **kwargs.pop("connect_args", {})}
    engine = sa.create_engine(
        url,
        hide_parameters=True,
        pool_pre_ping=True,
        connect_args=connect_args,
        **kwargs,
    )
    sa.event.listen(engine, "connect", _adapt_types)
    return engine


#: Server-side limits of every transaction the job opens on the favorites table.
DEFAULT_LOCK_TIMEOUT = dt.timedelta(seconds=2)
DEFAULT_STATEMENT_TIMEOUT = dt.timedelta(seconds=30)

# Tighten, never loosen: a limit the DBA set on the role, the database or the connection that is
# shorter than ours stays in force (0 means "no limit" and is always tightened). One statement
# sets every value, so a batch pays one round trip for them.
_SET_LIMITS = sa.text("""
    SELECT set_config(name, CASE WHEN NOT is_limit THEN ours
                                 WHEN current_setting(name)::interval > interval '0'
                                  AND current_setting(name)::interval < CAST(ours AS interval)
                                 THEN current_setting(name) ELSE ours END, true)
      FROM (VALUES ('lock_timeout', CAST(:lock_timeout AS text), true),
                   ('statement_timeout', CAST(:statement_timeout AS text), true),
                   ('synchronous_commit', CAST(:synchronous_commit AS text), false),
                   ('enable_incremental_sort', CAST(:incremental_sort AS text), false),
                   ('enable_hashjoin', CAST(:other_joins AS text), false),
                   ('enable_mergejoin', CAST(:other_joins AS text), false),
                   ('max_parallel_workers_per_gather', CAST(:parallel_workers AS text), false),
                   ('enable_seqscan', CAST(:seqscan AS text), false),
                   ('enable_indexscan', CAST(:other_scans AS text), false),
                   ('enable_indexonlyscan', CAST(:other_scans AS text), false),
                   ('enable_bitmapscan', CAST(:other_scans AS text), false))
           AS limits(name, ours, is_limit)
     WHERE is_limit OR ours IS NOT NULL
""")


def limit_transaction(conn: sa.Connection, *,
                      lock_timeout: dt.timedelta = DEFAULT_LOCK_TIMEOUT,
                      statement_timeout: dt.timedelta = DEFAULT_STATEMENT_TIMEOUT,
                      synchronous_commit: bool | None = None,
                      incremental_sort: bool | None = None,
                      nested_loop_joins_only: bool = False,
                      serial: bool = False,
                      tid_scans_only: bool = False,
                      seqscan: bool = True) -> None:
    """Bound how long the open transaction of ``conn`` may wait for a lock or run a statement.

    ``SET LOCAL`` semantics: the limits end with the transaction. A shorter limit already in
    force for the session (role, database, URL) is kept. Without this a statement queued behind
    a migration's ``ACCESS EXCLUSIVE`` lock waits as long as the migration holds it.

    Args:
        conn: a connection with a transaction open.
        lock_timeout, statement_timeout: the limits, rounded to whole milliseconds (>= 1 ms).
        synchronous_commit: ``False`` also sets ``synchronous_commit = off`` for the
            transaction, in the same statement; ``None`` or ``True`` leaves the session's value.
        incremental_sort: ``False`` sets ``enable_incremental_sort = off`` for the
            transaction; ``None`` or ``True`` leaves the session's value.
        nested_loop_joins_only: ``True`` sets ``enable_hashjoin`` and ``enable_mergejoin``
            off for the transaction.
        serial: ``True`` sets ``max_parallel_workers_per_gather`` to 0 for the transaction: no
            statement of it is split across parallel workers (a page-order batch reads its
            range in address order, which a parallel scan would not).
        tid_scans_only: ``True`` sets ``enable_seqscan``, ``enable_indexscan``,
            ``enable_indexonlyscan`` and ``enable_bitmapscan`` off for the transaction: the
            planner then reads the table by row address only (a page-order batch's TID range
            scan returns its rows in address order; an index scan would return them in the
            index's order).
        seqscan: ``False`` sets ``enable_seqscan`` off for the transaction: a batch that reads
            through the rule's index keeps to it even when the table's statistics (after a
            backlog was cleared, they still expect a year's backlog) make a sequential scan
            of the whole table look cheaper.
    """
    conn.execute(_SET_LIMITS, {"lock_timeout": _ms(lock_timeout),
                               "statement_timeout": _ms(statement_timeout),
                               "synchronous_commit": "off" if synchronous_commit is False
                               else None,
                               "incremental_sort": "off" if incremental_sort is False
                               else None,
                               "other_joins": "off" if nested_loop_joins_only else None,
                               "parallel_workers": "0" if serial else None,
                               "other_scans": "off" if tid_scans_only else None,
                               "seqscan": "off" if tid_scans_only or not seqscan else None})


def _ms(value: dt.timedelta) -> str:
    return f"{max(1, round(value.total_seconds() * 1000))}ms"


def transient_error_kind(exc: BaseException) -> ErrorKind | None:
    """Name the transient database error in ``exc`` or its causes (its
    :class:`~favorites_maintenance.retention.errors.ErrorKind`, equal to the kind's name as a
    string), else ``None``.

    Transient (:data:`~favorites_maintenance.retention.errors.TRANSIENT_KINDS`): a lost or
    refused connection, a serialization failure, a deadlock, a lock timeout, too many
    connections. Not transient: ``statement_timeout``, a missing table or privilege, bad SQL:
    retrying would fail the same way. The core's database errors
    (:class:`~favorites_maintenance.retention.errors.DatabaseError`: ``BatchError``,
    ``ConnectError``, ``BacklogError``, ...) say so themselves (``transient``, ``kind``); raw
    SQLAlchemy and driver errors are described on the spot.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DatabaseError):
            return exc.kind if exc.transient else None
        if is_database_error(exc):
            error = describe(exc)
            return error.kind if error.transient else None
        exc = exc.__cause__ or exc.__context__
    return None


def error_summary(exc: BaseException) -> str:
    """``"<ExceptionType>: <message>"`` on one line, fit for a log line.

    A database error is told by :func:`~favorites_maintenance.retention.errors.describe` (kind,
    class, SQLSTATE; never the DETAIL or CONTEXT lines, which may quote row values); any other
    exception by the first line of its message.
    """
    if is_database_error(exc):
        return f"{type(exc).__name__}: {describe(exc)}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def is_database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a SQLAlchemy ``DBAPIError`` or a psycopg error, of any database."""
    if isinstance(exc, sa.exc.DBAPIError):
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return False
    return isinstance(exc, psycopg.Error)
