"""The batched purge of prunable guest favorites (SPEC 5).

One run is a loop of batch transactions on one connection. Each batch is one statement::

    WITH batch AS MATERIALIZED (
        SELECT ctid, id, updated_at FROM favorites.favorites
         WHERE user_id IS NULL AND updated_at < :cutoff
           AND updated_at >= :after_updated_at                        -- keyset, after batch 1
           AND (updated_at, id) > (:after_updated_at, :after_id)
         ORDER BY updated_at, id LIMIT :batch_size
           FOR UPDATE SKIP LOCKED),
    deleted AS (
        DELETE FROM favorites.favorites USING batch
         WHERE user_id IS NULL AND updated_at < :cutoff
           AND favorites.ctid = batch.ctid AND favorites.id = batch.id
        RETURNING 1)
    SELECT (SELECT count(*) FROM batch), (SELECT count(*) FROM deleted), <last (updated_at, id)>

- ``MATERIALIZED`` evaluates the candidate SELECT exactly once, so the DELETE cannot re-run a
  ``LIMIT`` subquery and take more than ``batch_size`` rows; the DELETE repeats the guard and the
  cutoff (defence in depth).
- The DELETE reaches the batch's rows by their ``ctid`` (row address) with a TID scan, not by a
  primary-key index descent per row, and checks the primary key as well: never a bare ``ctid``.
  The address is stable because the rows are locked by this very transaction: no one can
  update, delete or move them before the DELETE (unlike Laravel's unlocked
  ``ctid IN (SELECT ...)``). On a
  partitioned table, where addresses repeat across partitions, or for a role without ``SELECT``
  on ``ctid`` (the least-privilege role of ``least_privilege.sql`` grants three columns), the
  DELETE matches by primary key instead.
- ``SKIP LOCKED`` lets N purges (or a purge and user transactions) run side by side: each takes
  rows nobody else holds, so no row is deleted twice and nobody waits.
- The keyset ``(updated_at, id) > last`` starts each batch past the previous one, so the index
  scan never re-walks the dead entries earlier batches left behind (the dead-tuple snowball of
  LIMIT-only loops). The redundant ``updated_at >=`` bound gives the planner the range on the
  leading column, so it keeps to the partial index instead of walking the plain ``updated_at``
  index through account rows. Rows the keyset passes over (locked by someone else at the time)
  are left for the next run and show up in the backlog.
- The ids never leave the server: memory does not grow with the rows deleted.

Each batch transaction sets ``lock_timeout`` and ``statement_timeout`` with ``SET LOCAL``
semantics, so the server, not only this process, bounds how long a batch can hold or wait for a
lock. A shorter limit already in force for the session (set on the role, the database or the
URL by whoever runs the database) is kept: the job tightens limits, it never loosens them.
Batches commit with ``synchronous_commit = off`` unless asked otherwise: the delete is
idempotent, so a commit lost to a server crash only returns its rows to the backlog
(``favorites-maintenance bench`` measures what it saves). The loop repeats while batches come
back full, and stops between batches on the run's time budget or on a stop request; an error
rolls back only the open batch.
"""

from __future__ import annotations

import datetime as dt
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP

from favorites_maintenance.retention.database import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    limit_transaction,
)
from favorites_maintenance.retention.errors import ErrorDescription, describe
from favorites_maintenance.retention.rule import delete_prunable, favorites, prunable
from favorites_maintenance.settings import DATABASE_URL_VAR

log = logging.getLogger(__name__)


class StopReason(str, enum.Enum):
    """Why a purge ended without error (SPEC 6, metadata ``stopReason``)."""

    EXHAUSTED = "exhausted"
    """A batch came back less than full: nothing prunable and unlocked is left past the cursor."""
    MAX_RUN_DURATION = "max_run_duration"
    """The run's time budget ran out; the backlog is left for the next run."""
    STOP_REQUESTED = "stop_requested"
    """A stop was requested (run termination, SIGTERM); honoured between batches."""


@dataclass(frozen=True)
class BatchResult:
    """One committed batch transaction.

    Attributes:
        batch_no: 1-based number of the batch transaction in this run (empty ones included).
        deleted: rows the batch deleted (0..batch_size).
        duration_s: wall time of the transaction, BEGIN to COMMIT, in seconds.
        deleted_total: rows deleted by the run so far, this batch included.
    """

    batch_no: int
    deleted: int
    duration_s: float
    deleted_total: int


@dataclass(frozen=True)
class PurgeReport:
    """What one purge did.

    Attributes:
        cutoff: the UTC instant rows had to be older than.
        deleted_total: rows deleted, all batches together.
        batches: batch transactions that deleted at least one row (an empty run has 0).
        duration_s: wall time of the whole purge, in seconds.
        stop_reason: why it ended.
        batch_max_s: the longest batch transaction, in seconds (0.0 when none ran).
    """

    cutoff: dt.datetime
    deleted_total: int
    batches: int
    duration_s: float
    stop_reason: StopReason
    batch_max_s: float = 0.0

    @property
    def duration_ms(self) -> int:
        """:attr:`duration_s` in whole milliseconds."""
        return round(self.duration_s * 1000)


class PurgeError(RuntimeError):
    """A purge could not start or could not finish."""


class _DatabaseError(PurgeError):
    """A purge error caused by the database, described without private data."""

    def __init__(self, message: str, error: ErrorDescription):
        super().__init__(message)
        self.error = error

    @property
    def kind(self) -> str:
        """The error kind, e.g. ``statement_timeout`` or ``connection_lost``."""
        return self.error.kind

    @property
    def transient(self) -> bool:
        """Whether the same statement may succeed if run again a little later."""
        return self.error.transient


class StandbyError(PurgeError):
    """The connection reached a hot standby (``pg_is_in_recovery()``); nothing was deleted."""


class BatchError(_DatabaseError):
    """A batch transaction failed and was rolled back whole; earlier batches stay committed.

    Attributes:
        batch_no: the batch that failed (1-based).
        report: what the run had committed before it (``stop_reason`` is that of an interrupted
            run and meaningless here; read ``deleted_total`` and ``batches``).
        error: the database error, described without private data
            (:class:`~favorites_maintenance.retention.errors.ErrorDescription`).

    The driver's exception is not chained: its text may quote row values (``DETAIL``,
    ``CONTEXT``), and whatever records this error (Dagster's event log, a traceback) would
    record them too.
    """

    def __init__(self, batch_no: int, report: PurgeReport, error: ErrorDescription):
        super().__init__(f"batch {batch_no} failed and was rolled back "
                         f"({report.deleted_total} rows in {report.batches} earlier batches stay "
                         f"deleted): {error}", error)
        self.batch_no = batch_no
        self.report = report


class ConnectError(_DatabaseError):
    """No usable connection to the favorites database; nothing was deleted.

    Attributes:
        error: the database error, described without private data.
    """

    def __init__(self, error: ErrorDescription):
        super().__init__(f"could not open a session on the favorites database (check "
                         f"{DATABASE_URL_VAR} and the server): {error}", error)


def _batch_statement(cutoff: dt.datetime, batch_size: int, keyset: bool,
                     by_ctid: bool = True) -> sa.Select:
    where = [prunable(cutoff)]
    if keyset:
        after_updated_at = sa.bindparam("after_updated_at", type_=TIMESTAMP(timezone=True))
        where += [
            # Redundant with the row comparison, but it gives the planner the range on the
            # leading column, so it prefers the partial index to walking the plain updated_at
            # index through the account rows (and re-sorting them by id).
            favorites.c.updated_at >= after_updated_at,
            sa.tuple_(favorites.c.updated_at, favorites.c.id)
            > sa.tuple_(after_updated_at, sa.bindparam("after_id")),
        ]
    batch = (
        sa.select(*([favorites.c.ctid] if by_ctid else []), favorites.c.id, favorites.c.updated_at)
        .where(*where)
        .order_by(favorites.c.updated_at, favorites.c.id)
        .limit(batch_size)
        .with_for_update(skip_locked=True)
        .cte("batch")
        .prefix_with("MATERIALIZED")
    )
    if by_ctid:
        # The batch's rows are locked by this transaction, so no one can update, delete or
        # move them before the DELETE: their ctid (row address) names exactly the locked row
        # versions. A TID scan per address reaches each without a primary-key index descent;
        # the id is matched too, so a row is only ever deleted by its address *and* its key,
        # and the guard is checked again on each.
        match = sa.and_(favorites.c.ctid == batch.c.ctid, favorites.c.id == batch.c.id)
    else:
        # A partitioned table repeats row addresses across partitions, and a role may lack
        # SELECT on ctid: match by primary key.
        match = favorites.c.id == batch.c.id
    deleted = (
        delete_prunable(cutoff, match)
        .returning(sa.literal_column("1"))
        .cte("deleted")
    )
    last_updated_at = sa.select(sa.func.max(batch.c.updated_at)).scalar_subquery()
    last_id = (
        sa.select(batch.c.id)
        .where(batch.c.updated_at == last_updated_at)
        .order_by(batch.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    return sa.select(
        sa.select(sa.func.count()).select_from(batch).scalar_subquery().label("selected"),
        sa.select(sa.func.count()).select_from(deleted).scalar_subquery().label("deleted"),
        last_updated_at.label("last_updated_at"),
        last_id.label("last_id"),
    )


#: Per batch transaction (``SET LOCAL`` semantics), unless ``synchronous_commit`` is asked for.
_ASYNC_COMMIT = sa.text("SELECT set_config('synchronous_commit', 'off', true)")


def assert_primary(conn: sa.Connection) -> None:
    """Raise :class:`StandbyError` if ``conn`` is on a hot standby (``pg_is_in_recovery()``)."""
    if conn.execute(sa.text("SELECT pg_is_in_recovery()")).scalar_one():
        raise StandbyError("the favorites database connection reached a hot standby "
                           "(pg_is_in_recovery() is true); point FAVORITES_DATABASE_URL at the "
                           "primary")


def _match_by_ctid(conn: sa.Connection) -> bool:
    """Whether the DELETE may reach the batch's rows by ``ctid``: not on a partitioned table
    (addresses repeat across partitions), nor for a role that may not read the column."""
    table = f"{favorites.schema}.{favorites.name}"
    return conn.execute(sa.text(
        "SELECT relkind <> 'p' AND has_column_privilege(oid, 'ctid', 'SELECT') "
        "FROM pg_class WHERE oid = to_regclass(:table)"), {"table": table}).scalar() or False


def purge(
    engine: sa.Engine,
    cutoff: dt.datetime,
    *,
    batch_size: int,
    max_run_duration: dt.timedelta,
    should_stop: Callable[[], bool] = lambda: False,
    on_batch: Callable[[BatchResult], None] | None = None,
    lock_timeout: dt.timedelta = DEFAULT_LOCK_TIMEOUT,
    statement_timeout: dt.timedelta = DEFAULT_STATEMENT_TIMEOUT,
    synchronous_commit: bool = False,
) -> PurgeReport:
    """Delete every prunable row older than ``cutoff``, one batch transaction at a time.

    Args:
        engine: engine on the favorites database (the primary).
        cutoff: timezone-aware UTC instant (see :func:`~favorites_maintenance.retention.rule.
            compute_cutoff`).
        batch_size: at most this many rows per batch transaction, > 0.
        max_run_duration: time budget; checked between batches, after the first. When it runs
            out the purge returns normally with ``stop_reason=max_run_duration``.
        should_stop: polled before each batch; ``True`` ends the purge with
            ``stop_reason=stop_requested``. An open batch is never torn.
        on_batch: called after each committed batch (progress, logs, metrics).
        lock_timeout, statement_timeout: server-side limits of each batch transaction; a
            shorter limit of the session (role, database, URL) wins.
        synchronous_commit: wait for each batch's commit to be flushed to disk (and to
            synchronous standbys). Off by default: the delete is idempotent, so a batch whose
            commit a server crash loses only comes back as backlog for the next run; the cost
            is that ``deleted_total`` may then count rows that are still there.

    Returns:
        The :class:`PurgeReport`.

    Raises:
        StandbyError: the connection is on a hot standby; nothing was deleted.
        ConnectError: no session could be opened (or checked); nothing was deleted.
        BatchError: a batch failed; it was rolled back, earlier batches stay committed. The
            database error is described in its ``error`` (never chained: see the class).
        ValueError: ``batch_size`` or ``max_run_duration`` not > 0, or a naive ``cutoff``.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size!r}")
    if max_run_duration <= dt.timedelta(0):
        raise ValueError(f"max_run_duration must be > 0, got {max_run_duration!r}")
    first = _batch_statement(cutoff, batch_size, keyset=False)
    following = _batch_statement(cutoff, batch_size, keyset=True)

    started = time.monotonic()
    deadline = started + max_run_duration.total_seconds()
    deleted_total = batches = batch_no = 0
    batch_max_s = 0.0
    after: dict | None = None

    def report(reason: StopReason) -> PurgeReport:
        return PurgeReport(cutoff=cutoff, deleted_total=deleted_total, batches=batches,
                           duration_s=time.monotonic() - started, stop_reason=reason,
                           batch_max_s=batch_max_s)

    try:
        conn = engine.connect()
    except sa.exc.DBAPIError as exc:
        raise _connect_error(exc) from None
    with conn:
        try:
            assert_primary(conn)
            if not _match_by_ctid(conn):
                first = _batch_statement(cutoff, batch_size, keyset=False, by_ctid=False)
                following = _batch_statement(cutoff, batch_size, keyset=True, by_ctid=False)
            conn.rollback()  # end the autobegun transaction of the check
        except sa.exc.DBAPIError as exc:
            raise _connect_error(exc) from None
        while True:
            if should_stop():
                return report(StopReason.STOP_REQUESTED)
            # The first batch always runs, so every run makes progress however small its budget.
            if batch_no and time.monotonic() >= deadline:
                return report(StopReason.MAX_RUN_DURATION)
            batch_no += 1
            t0 = time.monotonic()
            try:
                with conn.begin():
                    limit_transaction(conn, lock_timeout=lock_timeout,
                                      statement_timeout=statement_timeout)
                    if not synchronous_commit:
                        conn.execute(_ASYNC_COMMIT)
                    row = conn.execute(first if after is None else following, after or {}).one()
            except sa.exc.DBAPIError as exc:
                error = describe(exc)
                log.error("batch %d failed and was rolled back: %s", batch_no, error)
                raise BatchError(batch_no, report(StopReason.EXHAUSTED), error) from None
            elapsed = time.monotonic() - t0
            batch_max_s = max(batch_max_s, elapsed)
            deleted_total += row.deleted
            if row.deleted:
                batches += 1
            log.debug("batch %d deleted %d rows in %.1f ms", batch_no, row.deleted,
                      elapsed * 1000)
            if on_batch is not None:
                on_batch(BatchResult(batch_no, row.deleted, elapsed, deleted_total))
            if row.selected < batch_size:
                return report(StopReason.EXHAUSTED)
            after = {"after_updated_at": row.last_updated_at, "after_id": row.last_id}


def _connect_error(exc: sa.exc.DBAPIError) -> ConnectError:
    error = describe(exc)
    log.error("no session on the favorites database: %s", error)
    return ConnectError(error)
