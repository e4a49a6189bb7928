"""The batched purge of the rows a retention rule finds prunable.

One run is a loop of batch transactions on one connection. Each batch is one statement, shown
here for the guest-favorites rule (another rule names its own table, key, age and guard
columns)::

    WITH retention_batch AS MATERIALIZED (
        SELECT ctid, id, updated_at FROM favorites.favorites
         WHERE user_id IS NULL AND updated_at < :cutoff
           AND updated_at >= :after_age                               -- keyset, after batch 1
           AND (updated_at, id) > (:after_age, :after_key)
         ORDER BY updated_at, id LIMIT :batch_size
           FOR UPDATE SKIP LOCKED),
    retention_deleted AS (
        DELETE FROM favorites.favorites USING retention_batch
         WHERE user_id IS NULL AND updated_at < :cutoff
           AND favorites.ctid = retention_batch.ctid AND favorites.id = retention_batch.id
        RETURNING 1)
    SELECT <rows in batch>, (SELECT count(*) FROM retention_deleted),
           <last (updated_at, id) of batch>

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

After the first batch, batches are *optimistic*: the same statement without ``FOR UPDATE SKIP
LOCKED``, so each row is written once (deleted) rather than twice (locked, then deleted), under
a ``lock_timeout`` of :data:`OPTIMISTIC_LOCK_TIMEOUT`. The DELETE locks each row as it deletes it
and re-checks the guard and the cutoff on the row's newest version, so a row claimed by an
account meanwhile is left alone. If the DELETE meets a row another session holds (it gives up
after a few milliseconds) or deletes fewer rows than it read (a row moved, was claimed, or a
trigger or policy swallowed the delete), the batch is rolled back and taken again in the locking
form above, which then serves the next :data:`_LOCKING_AFTER_CONFLICT` batches. The first batch
always locks first, so a role that may delete but not lock what the rule matches (row-level
security without an UPDATE policy) fails the run at once, not only under contention.

When the table has the partial index on ``(updated_at, id) WHERE user_id IS NULL``, each batch
also turns ``enable_incremental_sort`` off for its transaction: the planner then takes that index,
which yields the batch in keyset order, rather than a plain ``updated_at`` index plus an
incremental sort, which it tends to cost lower though it reads every account row in the range
too (1.1-1.6 ms against 2.5-3.0 ms for the candidates of one 1000-row batch, ``EXPLAIN
ANALYZE`` at 1 M rows). It also turns hash and merge joins off: from about 7,000 rows a batch
the planner would join the DELETE to the batch by hashing a bitmap scan of *every* prunable
row, rather than reaching each batch row by its address (10,000 rows: 92 ms against 37-44 ms).

Each batch transaction sets ``lock_timeout`` and ``statement_timeout`` with ``SET LOCAL``
semantics, so the server, not only this process, bounds how long a batch can hold or wait for a
lock. A shorter limit already in force for the session (set on the role, the database or the
URL by whoever runs the database) is kept: the job tightens limits, it never loosens them.
Batches commit with ``synchronous_commit = off`` unless asked otherwise: the delete is
idempotent, so a commit lost to a server crash only returns its rows to the backlog
(``favorites-maintenance bench`` measures what it saves). The loop repeats while batches come
back full, and stops between batches on the run's time budget or on a stop request; an error
rolls back only the open batch.

The batch size adapts to a target time per batch when one is given
(:mod:`~favorites_maintenance.retention.batch_size`): it grows while batches stay well under
the target, shrinks at once when one goes over or when another session waited on a lock the
batch held. Before batches, at a bounded rate, the database's health is read
(:mod:`~favorites_maintenance.retention.health`: replication lag, a VACUUM on the table, WAL
rate); while an indicator is over its threshold the purge pauses with no transaction open.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

import sqlalchemy as sa

from favorites_maintenance.retention.batch_size import BatchSizeController
from favorites_maintenance.retention.database import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    limit_transaction,
)
from favorites_maintenance.retention.diagnosis import (
    NO_PROGRESS_SAMPLE,
    SWALLOWED,
    check_zero_progress,
    no_progress,
)
from favorites_maintenance.retention.errors import (
    BatchError,
    ConnectError,
    ErrorKind,
    InvalidArgumentError,
    SkippedRowsError,
    TableCheckError,
    describe,
)
from favorites_maintenance.retention.health import HealthLimits, HealthMonitor, LockWatch, Outcome
from favorites_maintenance.retention.report import BatchResult, PurgeReport, StopReason
from favorites_maintenance.retention.rule import GUEST_FAVORITES, RetentionRule
from favorites_maintenance.retention.spans import BatchSpans
from favorites_maintenance.retention.statements import (
    BatchStatements,
    assert_primary,
    match_by_ctid,
)
from favorites_maintenance.retention.table_check import check_table

log = logging.getLogger(__name__)


#: How many rows one run may skip before it fails instead.
DEFAULT_MAX_SKIPPED_ROWS = 100

#: Candidates in a row that fail, nothing deleted between them, before the purge takes the
#: table for blocked and fails rather than trying every row one at a time.
BLOCKED_AFTER = 10

#: ``lock_timeout`` of an optimistic batch: how long its DELETE may wait for a row someone
#: else holds before the batch is rolled back and taken again with ``SKIP LOCKED``.
OPTIMISTIC_LOCK_TIMEOUT = dt.timedelta(milliseconds=5)

#: Batches run in the locking form after an optimistic batch met a held or moved row.
_LOCKING_AFTER_CONFLICT = 16

#: Runs of the same batch, in the locking form, after rows moved across partitions under it
#: (SQLSTATE 40001) before the error is raised.
_MOVED_ROW_RETRIES = 5

#: Runs of the same batch after a stale statement before the error is raised.
_STALE_RETRIES = 3

#: Another session holds a row, or moved it to another partition since it was read.
_CONFLICT_KINDS = frozenset({ErrorKind.LOCK_NOT_AVAILABLE, ErrorKind.SERIALIZATION_FAILURE})


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
    max_skipped_rows: int = DEFAULT_MAX_SKIPPED_ROWS,
    optimistic: bool = True,
    batch_size_max: int | None = None,
    target_batch_duration: dt.timedelta = dt.timedelta(0),
    health: HealthLimits | None = None,
    rule: RetentionRule = GUEST_FAVORITES,
) -> PurgeReport:
    """Delete every prunable row older than ``cutoff``, one batch transaction at a time.

    Before the first batch the table is checked (:func:`~favorites_maintenance.retention.
    table_check.check_table`): a shape the rule cannot use is refused, a missing partial index
    is logged as a warning.

    A batch that fails on a row-level error (a foreign key ``RESTRICT``/``NO ACTION``, a
    trigger that raises, a violation raised by a cascade) is run again in halves, each in its
    own transaction, from the same keyset position, down to single rows; a single row that
    still fails is skipped for this run (its key logged at WARNING when it is a number, never
    another column) and the purge goes on past it. Rows a batch locked but whose DELETE had no
    effect are skipped the same way. A batch that fails because a schema change made a prepared statement or a
    cached plan stale is run again at once on a new connection.

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
        max_skipped_rows: rows one run may skip before it fails with
            :class:`SkippedRowsError`.
        optimistic: run batches after the first in the optimistic form (see the module's
            docstring); ``False`` locks every batch's rows before deleting them.
        batch_size_max: the largest size the adaptive batch size may reach, rows (``None`` or
            below ``batch_size``: ``batch_size``).
        target_batch_duration: wall time each batch transaction aims at; after every full
            batch the next size moves toward it (see :class:`~favorites_maintenance.retention.
            batch_size.BatchSizeController`), and it halves when another session waited on a
            lock the batch held. Zero (the default): every batch has ``batch_size`` rows.
        health: thresholds of the database health indicators read before batches (see
            :mod:`~favorites_maintenance.retention.health`): while one is over, the purge
            pauses with no transaction open, honouring ``should_stop`` and the time budget, and
            ends with ``stop_reason=db_unhealthy`` when the pause lasts too long. ``None`` (the
            default): not read.
        rule: the table and predicate to purge (default: the guest-favorites rule).

    Returns:
        The :class:`PurgeReport`.

    Raises:
        StandbyError: the connection is on a hot standby; nothing was deleted.
        ConnectError: no session could be opened (or checked); nothing was deleted.
        TableCheckError: the table's shape could not be read (a lock held past
            ``lock_timeout``, a lost connection); nothing was deleted.
        TableShapeError: the table lacks a column the rule needs or has the wrong type;
            nothing was deleted.
        BatchError: a batch failed; it was rolled back, earlier batches stay committed. The
            database error is described in its ``error`` (never chained: see the class).
        SkippedRowsError: :data:`BLOCKED_AFTER` candidates in a row failed (a blocked table),
            or more than ``max_skipped_rows`` did.
        NoProgressError: the rule matches rows no other session holds, yet the batches deleted
            none of them or far fewer than they selected.
        InvalidArgumentError: ``batch_size``, ``max_run_duration`` or ``max_skipped_rows`` out
            of range, or a naive ``cutoff``.
    """
    if batch_size <= 0:
        raise InvalidArgumentError(f"batch_size must be > 0, got {batch_size!r}")
    if max_run_duration <= dt.timedelta(0):
        raise InvalidArgumentError(f"max_run_duration must be > 0, got {max_run_duration!r}")
    if max_skipped_rows < 0:
        raise InvalidArgumentError(f"max_skipped_rows must be >= 0, got {max_skipped_rows!r}")
    rule.prunable(cutoff)  # a naive cutoff is refused before any connection

    started = time.monotonic()
    deadline = started + max_run_duration.total_seconds()
    deleted_total = batches = batch_no = selected_total = 0
    batch_max_s = 0.0
    skipped = isolation_batches = retried_batches = stale_retries = failed_in_a_row = 0
    causes: dict[str, int] = {}
    after: dict | None = None
    sizes = BatchSizeController(batch_size, batch_size_max or batch_size, target_batch_duration)
    size = sizes.size  # below sizes.size while failed batches are split
    size_max = lock_waits = 0
    # Asked just before a batch's commit: always when the batch is slow, else at a bounded rate.
    lock_watch = LockWatch(slow_after=sizes.target_s / 2) if sizes.adaptive else None
    monitor = HealthMonitor(health, rule=rule) if health is not None else None

    def report(reason: StopReason) -> PurgeReport:
        return PurgeReport(cutoff=cutoff, deleted_total=deleted_total, batches=batches,
                           duration_s=time.monotonic() - started, stop_reason=reason,
                           batch_max_s=batch_max_s, skipped_rows=skipped,
                           skipped_causes=tuple(causes), isolation_batches=isolation_batches,
                           retried_batches=retried_batches, batch_size_first=batch_size,
                           batch_size_max=size_max, lock_waits=lock_waits,
                           **(_health_report(monitor) if monitor is not None else {}))

    def skip(count: int, cause: str, key=None) -> None:
        nonlocal skipped, failed_in_a_row
        skipped += count
        if key is not None:
            failed_in_a_row += count
        if cause not in causes:
            log.warning("rows skipped: %s", cause)
        causes[cause] = causes.get(cause, 0) + count
        if key is not None:
            # Only a number (a surrogate key) is logged: another policy's key may be a uuid or
            # text that identifies a person (an anonymous id), which is never logged.
            shown = key if isinstance(key, int) and not isinstance(key, bool) else "(not shown)"
            log.warning("skipped row %s=%s (%s)", rule.key.name, shown, cause)

    def check_skipped() -> None:
        if failed_in_a_row >= BLOCKED_AFTER:
            raise SkippedRowsError(
                f"the last {failed_in_a_row} prunable rows the purge tried all failed, with "
                f"nothing deleted between them ({deleted_total} rows deleted before): the table "
                f"looks blocked: {_causes_text(causes)}", report(StopReason.EXHAUSTED)) from None
        if skipped > max_skipped_rows:
            raise SkippedRowsError(
                f"more than {max_skipped_rows} prunable rows could not be deleted in one run "
                f"({deleted_total} were): {_causes_text(causes)}",
                report(StopReason.EXHAUSTED)) from None

    conn = _connect(engine)
    try:
        try:
            assert_primary(conn)
            conn.rollback()  # end the autobegun transaction of the check
        except sa.exc.DBAPIError as exc:
            raise _connect_error(exc) from None
        try:
            with conn.begin():
                # Reading the catalogs locks the table like a batch does: bounded the same way.
                limit_transaction(conn, lock_timeout=lock_timeout,
                                  statement_timeout=statement_timeout)
                findings = check_table(conn, rule)
                by_ctid = match_by_ctid(conn, rule)
        except sa.exc.DBAPIError as exc:
            error = describe(exc)
            log.error("could not check the table before the first batch: %s", error)
            raise TableCheckError(error, rule.qualified_name) from None
        for warning in findings.warnings:
            log.warning("%s", warning)
        statements = BatchStatements.build(rule, cutoff, by_ctid)
        fast_lock_timeout = min(lock_timeout, OPTIMISTIC_LOCK_TIMEOUT)
        spans = BatchSpans(engine, rule)
        locking_left = 0  # batches to run in the locking form after a conflict
        moved_retries = 0  # runs of this batch that met a row moved across partitions
        again = False  # the same batch runs again: its number stays
        while True:
            if should_stop():
                return report(StopReason.STOP_REQUESTED)
            # The first batch always runs, so every run makes progress however small its budget.
            if batch_no and time.monotonic() >= deadline:
                return report(StopReason.MAX_RUN_DURATION)
            if monitor is not None:
                # No transaction is open here: a pause holds no lock and no snapshot.
                outcome = monitor.wait(conn, should_stop=should_stop, deadline=deadline)
                if outcome is Outcome.STOP_REQUESTED:
                    return report(StopReason.STOP_REQUESTED)
                if outcome is Outcome.UNHEALTHY:
                    return report(StopReason.DB_UNHEALTHY)
            if not (stale_retries or again):
                batch_no += 1
            again = False
            limit = size
            size_max = max(size_max, limit)
            key = None
            # The first batch always locks first: it proves the role may lock what the rule
            # matches (the form every later batch falls back to), so row-level security
            # without an UPDATE policy fails the run at once rather than under contention.
            fast = (optimistic and after is not None and limit > 1 and size == sizes.size
                    and not locking_left)
            statement = statements.batch(keyset=after is not None, fast=fast)
            waiters = 0
            span = spans.start(batch_no, limit, fast, statement)
            t0 = time.monotonic()
            try:
                with conn.begin() as tx:
                    limit_transaction(conn,
                                      lock_timeout=fast_lock_timeout if fast else lock_timeout,
                                      statement_timeout=statement_timeout,
                                      synchronous_commit=synchronous_commit,
                                      incremental_sort=False if findings.keyset_index else None,
                                      nested_loop_joins_only=True)
                    if limit == 1:
                        key = conn.execute(statements.next_key(keyset=after is not None),
                                           after or {}).first()
                    row = conn.execute(statement, {**(after or {}), "batch_size": limit}).one()
                    if fast and row.deleted < row.selected:
                        tx.rollback()  # a row moved or was held: the locking form decides
                    if tx.is_active and lock_watch is not None and lock_watch.due(
                            time.monotonic() - t0):
                        waiters = lock_watch.waiters(conn)
                span.committed(row.selected, row.deleted,
                               rolled_back=fast and row.deleted < row.selected)
            except sa.exc.DBAPIError as exc:
                error = describe(exc)
                span.failed(error)
                if fast and error.kind in _CONFLICT_KINDS:
                    # Another session holds a row of the batch, or moved it to another
                    # partition meanwhile: take the batch again with SKIP LOCKED, and keep to
                    # that form for a while.
                    locking_left, again = _LOCKING_AFTER_CONFLICT, True
                    continue
                if (error.kind is ErrorKind.SERIALIZATION_FAILURE
                        and moved_retries < _MOVED_ROW_RETRIES):
                    # A row of the batch moved to another partition as it was locked (an
                    # update of its partition key): a new transaction reads where it went.
                    moved_retries += 1
                    again = True
                    log.info("batch %d met a row moved by a concurrent update (%s); taking it "
                             "again", batch_no, error)
                    continue
                if (error.kind is ErrorKind.STALE_STATEMENT
                        and stale_retries < _STALE_RETRIES):
                    # A prepared statement or cached plan outlived a schema change: a new
                    # connection plans the same statement afresh.
                    stale_retries += 1
                    retried_batches += 1
                    log.warning("batch %d ran into a stale statement after a schema change; "
                                "running it again on a new connection: %s", batch_no, error)
                    conn = _reconnect(engine, conn)
                    continue
                stale_retries = 0
                if error.row_level:
                    if size < sizes.size:
                        isolation_batches += 1
                    if limit > 1:
                        # Split: the same keyset position, half the rows, own transaction.
                        size = max(1, limit // 2)
                        log.info("batch %d failed on a row-level error (%s); splitting it into "
                                 "batches of %d rows", batch_no, error.cause, size)
                        continue
                    if key is not None:
                        skip(1, error.cause, key.key)
                        check_skipped()
                        after = {"after_age": key.age, "after_key": key.key}
                        continue
                log.error("batch %d failed and was rolled back: %s", batch_no, error)
                raise BatchError(batch_no, report(StopReason.EXHAUSTED), error) from None
            finally:
                span.end()  # any other exception: the span still ends
            stale_retries = moved_retries = 0
            if fast and row.deleted < row.selected:
                locking_left, again = _LOCKING_AFTER_CONFLICT, True
                continue
            if locking_left and size == sizes.size:
                locking_left -= 1
            elapsed = time.monotonic() - t0
            batch_max_s = max(batch_max_s, elapsed)
            deleted_total += row.deleted
            selected_total += row.selected
            if size < sizes.size:
                isolation_batches += 1
                # A piece went through: grow back toward the adaptive size (which does not
                # change while a failed batch is split).
                size = min(sizes.size, size * 2)
            elif row.selected >= limit and not waiters:
                size = sizes.after_batch(row.selected, elapsed)
            elif row.selected >= limit:
                # Someone waited on this batch's locks: whatever its time, the next is smaller.
                lock_waits += 1
                size = sizes.lock_waiters(waiters)
                log.info("batch %d held a lock %d other sessions waited on; next batch %d rows",
                         batch_no, waiters, size)
            if row.deleted:
                batches += 1
                failed_in_a_row = 0
            if row.selected:
                log.debug("batch %d deleted %d rows of at most %d in %.1f ms; next batch %d rows",
                          batch_no, row.deleted, limit, elapsed * 1000, size)
            if on_batch is not None:
                on_batch(BatchResult(batch_no, row.deleted, elapsed, deleted_total, limit))
            if row.deleted < row.selected:
                skip(row.selected - row.deleted, SWALLOWED)
                if deleted_total * 2 < selected_total:
                    # Mostly swallowed: judged as no progress (which names the mechanisms)
                    # once enough rows were selected, or at the end of the run.
                    if selected_total >= max(batch_size, NO_PROGRESS_SAMPLE):
                        raise no_progress(conn, rule, report(StopReason.EXHAUSTED), selected_total)
                else:
                    check_skipped()
            if row.selected < limit:
                break
            after = {"after_age": row.last_age, "after_key": row.last_key}

        final = report(StopReason.EXHAUSTED)
        if deleted_total * 2 < selected_total:
            raise no_progress(conn, rule, final, selected_total)
        if not selected_total:
            check_zero_progress(conn, rule, cutoff, final, batch_size)
        return final
    finally:
        conn.close()


def _health_report(monitor: HealthMonitor) -> dict:
    return {"paused_s": monitor.paused_s, "pauses": monitor.pauses,
            "throttled_by": str(monitor.throttled_by) if monitor.throttled_by else None,
            "health_unreadable": tuple(f"{name}: {why}"
                                       for name, why in monitor.unreadable.items())}


def _causes_text(causes: dict[str, int]) -> str:
    return "; ".join(f"{cause} ({count} rows)" for cause, count in causes.items())


def _connect(engine: sa.Engine) -> sa.Connection:
    try:
        return engine.connect()
    except sa.exc.DBAPIError as exc:
        raise _connect_error(exc) from None


def _reconnect(engine: sa.Engine, conn: sa.Connection) -> sa.Connection:
    conn.invalidate()  # psycopg's prepared statements die with the server session
    conn.close()
    return _connect(engine)


def _connect_error(exc: sa.exc.DBAPIError) -> ConnectError:
    error = describe(exc)
    log.error("no session on the favorites database: %s", error)
    return ConnectError(error)
