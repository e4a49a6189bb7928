"""The purge: delete the rows a retention rule finds prunable, one batch transaction at a time.

:func:`purge` is the public entry; it validates its arguments and runs a
:class:`~favorites_maintenance.retention.batch_loop.BatchLoop`. Where each part lives:

- :mod:`~favorites_maintenance.retention.batch_loop`: the loop of batch transactions (the
  optimistic and locking forms, timeouts, adaptive size, health pauses, row-level failures);
- :mod:`~favorites_maintenance.retention.statements`: every SQL statement it runs, and why each
  has its shape;
- :mod:`~favorites_maintenance.retention.diagnosis`: why a run that deletes nothing, or far
  less than it selects, fails;
- :mod:`~favorites_maintenance.retention.report`: what a run reports.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import sqlalchemy as sa

from favorites_maintenance.retention.archive import ArchiveTarget
from favorites_maintenance.retention.batch_loop import (
    DEFAULT_MAX_SKIPPED_ROWS,
    BatchLoop,
    PurgeOptions,
)
from favorites_maintenance.retention.database import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
)
from favorites_maintenance.retention.health import HealthLimits
from favorites_maintenance.retention.report import BatchResult, PurgeReport
from favorites_maintenance.retention.rule import GUEST_FAVORITES, RetentionRule
from favorites_maintenance.retention.scan import ScanMode


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
    archive: ArchiveTarget | None = None,
    scan: ScanMode | None = None,
    sleep_ratio: float = 0.0,
    previous_row_s: float | None = None,
) -> PurgeReport:
    """Delete every prunable row older than ``cutoff``, one batch transaction at a time, and
    return the run's :class:`PurgeReport`.

    Before the first batch the session and the table are checked (:func:`~favorites_maintenance.
    retention.table_check.check_table`): a standby, ``session_replication_role = replica`` and a
    shape the rule cannot use are refused, a missing or invalid partial index is logged as a
    warning. Then the order of the batches is chosen (oldest first over the index, or heap page
    order for a backlog spread over the table that the run can clear within its budget:
    :mod:`~favorites_maintenance.retention.scan`); the report says which (``scan_mode``) and
    why.

    A batch that fails on a row-level error (a foreign key ``RESTRICT``/``NO ACTION``, a
    trigger that raises, a violation raised by a cascade, a row-level security policy that
    raises) or that ``statement_timeout`` cancels is run again in halves, each in its own
    transaction, from the same position, down to single rows; a single row that still
    fails is skipped for this run (its key logged at WARNING when it is a number, never
    another column) and the purge goes on past it. After a statement timeout, batches stay at a
    size that fits the limit. Rows a batch locked but whose DELETE had no effect are skipped
    the same way. A batch that fails because a schema change made a prepared statement or a
    cached plan stale is run again at once on a new connection; a schema change that leaves a
    shape the rule cannot use rolls the batch back and ends the run.

    Args:
        engine: engine on the favorites database (the primary).
        cutoff: timezone-aware UTC instant (see :func:`~favorites_maintenance.retention.rule.
            compute_cutoff`).
        batch_size: at most this many rows per batch transaction, > 0; when the size adapts,
            the first batch's size unless ``previous_row_s`` is known.
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
        optimistic: run batches after the first in the optimistic form (see
            :mod:`~favorites_maintenance.retention.batch_loop`); ``False`` locks every batch's
            rows before deleting them.
        batch_size_max: the largest size the adaptive batch size may reach, rows (``None`` or
            below ``batch_size``: ``batch_size``).
        target_batch_duration: wall time each batch transaction aims at; after every full
            batch the next size moves toward it (see :class:`~favorites_maintenance.retention.
            batch_size.BatchSizeController`), and it halves when another session waited on a
            lock the batch held. Zero (the default): every batch has ``batch_size`` rows.
        health: thresholds of the database health indicators read before batches (see
            :mod:`~favorites_maintenance.retention.health`): while one is over, the purge
            pauses with no transaction open, honouring ``should_stop`` and the time budget, and
            ends with ``stop_reason=db_unhealthy`` when the pause lasts too long; a run whose
            backlog, counted before the first batch, is empty never pauses. ``None`` (the
            default): not read.
        rule: the table and predicate to purge (default: the guest-favorites rule).
        archive: move each batch's rows into this archive in the batch's own statement
            instead of only deleting them (:mod:`~favorites_maintenance.retention.archive`):
            checked (or created) before the first batch; ``deleted_total`` then counts the
            rows moved. ``None`` (the default): rows are deleted.
        scan: the order of the batches, ``ScanMode.KEYSET`` or ``ScanMode.PAGE_ORDER``;
            ``None`` (the default): chosen per run. Page order is refused, for keyset order,
            where the table or the role does not allow it.
        sleep_ratio: after each batch, pause that multiple of its time (no transaction open,
            stop requests polled, never past the time budget) before the next; 0 (the
            default): no pause. The report's ``paced_s`` says how long it paused.
        previous_row_s: the time a row took in the previous run's batch transactions, seconds
            (its report's ``row_s``), > 0. When the size adapts, the first batch aims at 0.8 of
            ``target_batch_duration`` at that rate (between ``min(100, batch_size)`` and
            ``batch_size_max``), and a backlog counted before it goes in one batch only when it
            fits within that at that rate: the time budget, checked between batches, cannot
            stop a batch in flight. ``None`` (the default): not known; the first batch has
            ``batch_size`` rows, and the rest of a counted backlog goes in one batch once a
            batch's rate says it fits.

    Raises:
        StandbyError: the connection is on a hot standby; nothing was deleted.
        ReplicationRoleError: the session's ``session_replication_role`` is ``replica``
            (triggers and foreign keys off); nothing was deleted.
        ConnectError: no session could be opened (or checked); nothing was deleted.
        TableCheckError: the table's shape could not be read (a lock held past
            ``lock_timeout``, a lost connection); nothing was deleted.
        TableShapeError: the table lacks a column the rule needs or has the wrong type, or
            PostgreSQL would refuse every DELETE on it (a publication without replica
            identity); nothing was deleted. Its subclass :class:`TableChangedError`: the shape
            changed so during the run; earlier batches stay committed.
        ArchiveError: with ``archive``: it does not match the table, or is missing and cannot
            be created; nothing was deleted. Or the table's columns changed during the run:
            the open batch rolled back, earlier ones stay moved.
        BatchError: a batch failed; it was rolled back, earlier batches stay committed. The
            database error is described in its ``error`` (never chained: see the class).
        SkippedRowsError: :data:`~favorites_maintenance.retention.batch_loop.BLOCKED_AFTER` candidates in a row failed (a blocked table,
            or rows none of which can be deleted within ``statement_timeout``), or more than
            ``max_skipped_rows`` did.
        NoProgressError: the rule matches rows no other session holds, yet the batches deleted
            none of them or far fewer than they selected.
        InvalidArgumentError: ``batch_size``, ``max_run_duration``, ``max_skipped_rows``,
            ``sleep_ratio`` or ``previous_row_s`` out of range, or a naive ``cutoff``.
    """
    options = PurgeOptions(
        batch_size=batch_size, max_run_duration=max_run_duration, lock_timeout=lock_timeout,
        statement_timeout=statement_timeout, synchronous_commit=synchronous_commit,
        max_skipped_rows=max_skipped_rows, optimistic=optimistic, batch_size_max=batch_size_max,
        target_batch_duration=target_batch_duration, health=health, scan=scan,
        sleep_ratio=sleep_ratio, previous_row_s=previous_row_s)
    rule.prunable(cutoff)  # refuses a naive cutoff before any connection
    return BatchLoop(engine, rule, cutoff, options, should_stop=should_stop,
                     on_batch=on_batch, archive=archive).run()
