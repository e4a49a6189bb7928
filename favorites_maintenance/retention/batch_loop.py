"""The purge's loop: batch transactions on one connection, until nothing prunable is left.

:class:`BatchLoop` runs one purge (:func:`~favorites_maintenance.retention.purge.purge` is its
public front). Each batch is its own transaction (its statements, their shapes and why:
:mod:`~favorites_maintenance.retention.statements`). The loop repeats while batches come back
full (in page order: until the last page is walked), and stops between batches on the run's
time budget or on a stop request; an error rolls back only the open batch.

Batches are *optimistic*: the batch's candidates counted up to its limit, then deleted by a
plain DELETE up to the last of them, without ``FOR UPDATE SKIP LOCKED``, under a
``lock_timeout`` of :data:`OPTIMISTIC_LOCK_TIMEOUT`. If the DELETE meets a row another session
holds (it gives up after a few milliseconds) or deletes other than the rows counted (a row
moved, was claimed, or a trigger or policy swallowed the delete; one made prunable in between,
which could take the batch past its limit), the batch is rolled back and taken again in the
locking form, which then serves the next :data:`~favorites_maintenance.retention.batch_form.
LOCKING_AFTER_CONFLICT` batches (:mod:`~favorites_maintenance.retention.batch_form`). Where the
table has row-level security, or the role holds no UPDATE privilege on it (which ``FOR
UPDATE`` needs), the first batch locks first, so a role that may delete but not lock what the
rule matches (row-level security without an UPDATE policy) fails the run at once, not only
under contention; the catalogs say which before the first batch
(:attr:`~favorites_maintenance.retention.scan.ScanEstimate.lock_first`).

When the table has the rule's partial index on ``(<age>, <key>) WHERE <guard>``, each batch
also turns ``enable_incremental_sort`` off for its transaction: the planner then takes that index,
which yields the batch in keyset order, rather than a plain age-column index plus an
incremental sort, which it tends to cost lower though it reads every guarded-out row in the
range too (1.1-1.6 ms against 2.5-3.0 ms for the candidates of one 1000-row batch, ``EXPLAIN
ANALYZE`` at 1 M rows). It also turns hash and merge joins off: from about 7,000 rows a batch
the planner would join the DELETE to the batch by hashing a bitmap scan of *every* prunable
row, rather than reaching each batch row by its address (10,000 rows: 92 ms against 37-44 ms);
sequential scans off (after a backlog is cleared the table's statistics still expect a year's
backlog, and a sequential scan of the whole table would look cheaper than the index); and
parallel workers off. A page-order batch reads the table by TID range scans only, so its rows
come in address order.

Each batch transaction sets ``lock_timeout`` and ``statement_timeout`` with ``SET LOCAL``
semantics, so the server, not only this process, bounds how long a batch can hold or wait for a
lock. A shorter limit already in force for the session (set on the role, the database or the
URL by whoever runs the database) is kept: the job tightens limits, it never loosens them.
Batches commit with ``synchronous_commit = off`` unless asked otherwise: the delete is
idempotent, so a commit lost to a server crash only returns its rows to the backlog
(``favorites-maintenance bench`` measures what it saves).

The batch size adapts to a target time per batch when one is given
(:mod:`~favorites_maintenance.retention.batch_size`; the next batch's size as the loop takes
it: :mod:`~favorites_maintenance.retention.batch_sizing`): it grows while batches stay well
under the target, shrinks at once when one goes over or when another session waited on a lock the
batch held. The first batch, which no measurement of this run bounds and which the time budget
(checked between batches) cannot stop, is sized from the previous run's time per row when the
caller knows it, else has ``batch_size`` rows. Before batches, at a bounded rate, the
database's health is read (:mod:`~favorites_maintenance.retention.health`: replication lag, a
VACUUM on the table, WAL rate); while an indicator is over its threshold the purge pauses with
no transaction open. Pauses are for batches: a run whose backlog, counted before the first
batch, is empty does not wait.

Batches walk the backlog oldest first over the rule's index (keyset order), or, when the backlog
is spread over the table and the run can clear it within its time budget, in heap page order: the
choice, made per run from a count of the backlog and the table's size, and why:
:mod:`~favorites_maintenance.retention.scan`.

Between batches, with ``sleep_ratio`` set, the purge pauses that multiple of the last batch's
time (pt-archiver's ``--sleep-coef``), with no transaction open, honouring stop requests and the
time budget: the purge then takes at most ``1 / (1 + sleep_ratio)`` of the time it would hold
the database (what pauses or stops the purge between batches, and its time budget:
:mod:`~favorites_maintenance.retention.batch_pauses`).

A batch that fails on a row-level error, or that ``statement_timeout`` cancels, is split in
halves from the same position, each in its own transaction, down to single rows; a single row
that still fails is skipped for the run (one whose very lookup fails, a row-level security
policy raising for it, is located without being read: :mod:`~favorites_maintenance.retention.
unreadable`). After a statement timeout the batches stay at a size that took about
:data:`~favorites_maintenance.retention.batch_sizing.TIMEOUT_AIM` of the time the cancelled
batch ran, judged again after every batch. Why a run that deletes nothing, or far less than it
selects, fails:
:mod:`~favorites_maintenance.retention.diagnosis`.

Before each batch commits, one catalog read tells whether the table's columns changed since the
table was checked (a migration between two batches); if they did, the table is checked again
and a shape the rule cannot use rolls the batch back and ends the run.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.retention.archive import ArchiveTarget
from favorites_maintenance.retention.batch_failures import BatchFailures
from favorites_maintenance.retention.batch_form import BatchForm
from favorites_maintenance.retention.batch_pauses import BatchPauses, TimeBudget
from favorites_maintenance.retention.batch_size import BatchSizeController
from favorites_maintenance.retention.batch_sizing import BatchSizing
from favorites_maintenance.retention.database import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    limit_transaction,
)
from favorites_maintenance.retention.diagnosis import check_zero_progress, no_progress
from favorites_maintenance.retention.errors import describe
from favorites_maintenance.retention.health import HealthLimits, HealthMonitor
from favorites_maintenance.retention.loop_preparation import LoopPreparation, connect
from favorites_maintenance.retention.loop_state import LoopState
from favorites_maintenance.retention.report import BatchResult, PurgeReport, StopReason
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.run_counts import RunCounts
from favorites_maintenance.retention.scan import ScanMode

# The purge's log lines keep the purge's logger name, whichever module writes them.
log = logging.getLogger("favorites_maintenance.retention.purge")

#: How many rows one run may skip before it fails instead.
DEFAULT_MAX_SKIPPED_ROWS = 100

#: ``lock_timeout`` of an optimistic batch: how long its DELETE may wait for a row someone
#: else holds before the batch is rolled back and taken again with ``SKIP LOCKED``.
OPTIMISTIC_LOCK_TIMEOUT = dt.timedelta(milliseconds=5)


@dataclass(frozen=True)
class PurgeOptions:
    """The settings of one purge: the one place each is documented. A policy's come from its
    settings (:meth:`~favorites_maintenance.config.policy_settings.PolicySettings.
    purge_options`), whose declarations hold their bounds; the values are not checked again
    here.

    Attributes:
        batch_size: rows per batch transaction, > 0; when the size adapts, the first batch's
            size unless ``previous_row_s`` is known.
        max_run_duration: the run's time budget, checked between batches after the first;
            when it runs out the purge returns with ``stop_reason=max_run_duration``.
        lock_timeout, statement_timeout: server-side limits of each batch transaction; a
            shorter limit of the session (role, database, URL) wins.
        synchronous_commit: wait for each batch's commit to be flushed to disk (and to
            synchronous standbys). Off by default: the delete is idempotent, so a commit a
            server crash loses only comes back as backlog (``deleted_total`` then counts it).
        max_skipped_rows: rows one run may skip before it fails with
            :class:`~favorites_maintenance.retention.errors.SkippedRowsError`, >= 0.
        optimistic: run batches after the first in the optimistic form; ``False`` locks every
            batch's rows before deleting them.
        batch_size_max: the largest size the adaptive batch size may reach, rows; ``None``:
            ``batch_size``.
        keyset_batch_size_max: the largest size in keyset order, rows, when above
            ``batch_size_max`` (which then bounds page order only); ``None``:
            ``batch_size_max``. The first batch stays within ``batch_size_max`` and the size
            grows from there.
        target_batch_duration: wall time each batch transaction aims at; after every full
            batch the next size moves toward it (:class:`~favorites_maintenance.retention.
            batch_size.BatchSizeController`). Zero: every batch has ``batch_size`` rows.
        health: thresholds of the database health indicators read before batches
            (:mod:`~favorites_maintenance.retention.health`); ``None``: not read.
        scan: the order batches walk the backlog in; ``None``: chosen per run
            (:mod:`~favorites_maintenance.retention.scan`). Page order asked for is still
            refused where the table or the role does not allow it.
        sleep_ratio: after each batch, pause that multiple of its time (no transaction open,
            never past the budget); 0: none. The report's ``paced_s`` says how long.
        previous_row_s: the time a row took in the previous run's batch transactions, seconds
            (its report's ``row_s``), > 0; sizes the first batch when the size adapts.
            ``None``: not known.
    """

    batch_size: int
    max_run_duration: dt.timedelta
    lock_timeout: dt.timedelta = DEFAULT_LOCK_TIMEOUT
    statement_timeout: dt.timedelta = DEFAULT_STATEMENT_TIMEOUT
    synchronous_commit: bool = False
    max_skipped_rows: int = DEFAULT_MAX_SKIPPED_ROWS
    optimistic: bool = True
    batch_size_max: int | None = None
    keyset_batch_size_max: int | None = None
    target_batch_duration: dt.timedelta = dt.timedelta(0)
    health: HealthLimits | None = None
    scan: ScanMode | None = None
    sleep_ratio: float = 0.0
    previous_row_s: float | None = None


class BatchLoop(LoopPreparation, BatchFailures):
    """One purge of ``rule``'s rows older than ``cutoff``: :meth:`run` it once.

    Args:
        engine: engine on the favorites database (the primary).
        rule: the table and predicate to purge.
        cutoff: timezone-aware UTC instant rows must be older than.
        options: the tunables.
        should_stop: polled before each batch; ``True`` ends the run (``stop_requested``).
        on_batch: called after each committed batch.
        archive: where the batches move their rows (:mod:`~favorites_maintenance.retention.
            archive`); ``None``: they are deleted.

    The run's state: its rule, connection, position (keyset or page order) and what one batch
    leaves for the next (:attr:`state`, :class:`~favorites_maintenance.retention.loop_state.
    LoopState`), the counters of its report (:attr:`counts`), the size of the next batch
    (:attr:`sizing`, :class:`~favorites_maintenance.retention.batch_sizing.BatchSizing`), its
    form (:attr:`form`, :class:`~favorites_maintenance.retention.batch_form.BatchForm`), and
    what stops or pauses it between batches (:attr:`pauses`, :class:`~favorites_maintenance.
    retention.batch_pauses.BatchPauses`, with the time budget). The rest is set once: the
    arguments, and the time budget (:attr:`budget`). The steps before the first batch are
    :class:`~favorites_maintenance.retention.loop_preparation.LoopPreparation`'s, those after a
    failed batch :class:`~favorites_maintenance.retention.batch_failures.BatchFailures`'.
    """

    def __init__(self, engine: sa.Engine, rule: RetentionRule, cutoff: dt.datetime,
                 options: PurgeOptions, *, should_stop: Callable[[], bool] = lambda: False,
                 on_batch: Callable[[BatchResult], None] | None = None,
                 archive: ArchiveTarget | None = None):
        self.engine, self.cutoff, self.options = engine, cutoff, options
        self.on_batch, self.archive_target = on_batch, archive
        self.budget = TimeBudget.from_now(options.max_run_duration)
        self.sizing = BatchSizing.starting(BatchSizeController(
            options.batch_size, options.batch_size_max or options.batch_size,
            options.target_batch_duration, row_s=options.previous_row_s))
        self.pauses = BatchPauses(
            self.budget, should_stop, options.sleep_ratio,
            HealthMonitor(options.health, rule=rule) if options.health is not None else None)
        self.form = BatchForm(options.optimistic,
                              min(options.lock_timeout, OPTIMISTIC_LOCK_TIMEOUT))
        self.counts = RunCounts()
        self.state = LoopState(rule)

    def run(self) -> PurgeReport:
        """Check the table, run batches until one comes back less than full or the run stops,
        and return the report. Raises what :func:`~favorites_maintenance.retention.purge.
        purge` documents."""
        state = self.state
        state.conn = connect(self.engine)
        try:
            self._prepare()
            while True:
                reason = self.pauses.before_batch(state.conn, self.counts,
                                                  nothing_prunable=state.nothing_prunable)
                if reason is not None:
                    return self.report(reason)
                if self._run_batch():
                    return self._finish()
        finally:
            state.conn.close()  # the current one: a stale statement replaces it

    def report(self, reason: StopReason) -> PurgeReport:
        """What the run did so far, ending for ``reason``."""
        return self.counts.report(reason, cutoff=self.cutoff, duration_s=self.budget.elapsed(),
                                  size=self.sizing.size, health=self.pauses.health_report())

    def _run_batch(self) -> bool:
        """Run one batch transaction and take its outcome; whether the run is done (the
        batch came back less than full)."""
        counts, state = self.counts, self.state
        if state.start_batch():
            counts.batch_no += 1
        limit = self.sizing.size
        counts.size_max = max(counts.size_max, limit)
        counts.first_limit = counts.first_limit or limit
        fast = self.form.optimistic(limit, at_full_size=self.sizing.at_full_size())
        statement, params = state.scan.batch(fast, limit)
        span = state.spans.start(counts.batch_no, limit, fast, statement)
        t0 = time.monotonic()
        try:
            row, waiters = self._transaction(statement, params, limit, fast, t0)
            span.committed(row.selected, row.deleted,
                           rolled_back=fast and row.deleted != row.selected)
        except sa.exc.DBAPIError as exc:
            error = describe(exc)
            span.failed(error)
            # raises unless the run goes on
            self._on_error(error, limit, fast, time.monotonic() - t0)
            return False
        finally:
            span.end()  # any other exception: the span still ends
            # One measure of the batch's time for its pause, its size and its report alike.
            elapsed = self.pauses.last_batch_s = time.monotonic() - t0
        return self._on_success(row, limit, fast, waiters, elapsed)

    def _transaction(self, statement: sa.Executable, params: dict, limit: int, fast: bool,
                     t0: float) -> tuple[sa.Row, int]:
        """The batch transaction: its row (``selected``, ``deleted`` and the position the
        scan reads) and how many sessions waited on its locks (0 when not asked)."""
        state, options, waiters = self.state, self.options, 0
        conn, scan = state.conn, state.scan
        lock_watch = self.sizing.lock_watch
        with conn.begin() as tx:
            limit_transaction(conn, lock_timeout=self.form.lock_timeout(fast, options.lock_timeout),
                              statement_timeout=options.statement_timeout,
                              synchronous_commit=options.synchronous_commit,
                              incremental_sort=False if state.keyset_index else None,
                              nested_loop_joins_only=True, serial=True,
                              tid_scans_only=scan.tid_scans_only, seqscan=False)
            hold = state.rule.hold
            if hold is not None and hold.copy is not None and hold.column_type is not None:
                # Before the batch's statements, which bind the copy: a hold committed before
                # this read keeps its rows in this batch.
                hold.copy.refresh(conn, hold)
            if limit == 1:
                state.row_key = conn.execute(*scan.next_key()).first()
            row = scan.execute(conn, statement, params)
            if fast and row.deleted != row.selected:
                # A row moved, was claimed or was held (in page order: or a row became
                # prunable between the count and the DELETE): the locking form decides, so
                # that no transaction commits more rows than the batch's limit.
                tx.rollback()
            if tx.is_active:
                # After the statement, which holds the table's lock: no migration can commit
                # between what this reads and what the batch ran against.
                self._check_shape(conn)
            if tx.is_active and state.archive is not None:
                # After the statement, which holds the table's lock: raises (and the batch
                # rolls back) if a column changed since the archive was checked.
                state.archive.check_unchanged(conn)
            if tx.is_active and lock_watch is not None and lock_watch.due(time.monotonic() - t0):
                waiters = lock_watch.waiters(conn)
        return row, waiters

    def _lock_from_now(self) -> None:
        """Take the same batch again in the locking form, and the next few batches too."""
        self.form.lock_from_now()
        self.state.again = True

    def _on_success(self, row: sa.Row, limit: int, fast: bool, waiters: int,
                    elapsed: float) -> bool:
        """The batch's transaction ended without error after ``elapsed`` seconds: count it
        and size the next batch; whether the run is done."""
        self.state.transaction_ended()
        self.form.proven = True
        if fast and row.deleted != row.selected:
            self._lock_from_now()  # rolled back: the locking form takes the batch again
            return False
        self.form.committed(at_full_size=self.sizing.at_full_size())
        counts, scan = self.counts, self.state.scan
        counts.batch_max_s = max(counts.batch_max_s, elapsed)
        counts.deleted_total += row.deleted
        counts.selected_total += row.selected
        self.sizing.after_batch(row.selected, limit, waiters, elapsed,
                                rated=scan.rates_batch(row.selected, limit), counts=counts)
        if row.deleted:
            counts.batches += 1
            counts.batch_s += elapsed
            counts.failed_in_a_row = 0
        if row.selected:
            log.debug("batch %d deleted %d rows of at most %d in %.1f ms; next batch %d rows",
                      counts.batch_no, row.deleted, limit, elapsed * 1000, self.sizing.size)
        if self.on_batch is not None:
            self.on_batch(BatchResult(counts.batch_no, row.deleted, elapsed, counts.deleted_total,
                                      limit))
        if row.deleted < row.selected:
            self._swallowed(row.selected - row.deleted)
        if scan.advance(row, limit, elapsed):
            return True
        self._project()
        return False

    def _finish(self) -> PurgeReport:
        """The last batch came back less than full: judge the run's progress, and report."""
        final, counts, state = self.report(StopReason.EXHAUSTED), self.counts, self.state
        if counts.deleted_total * 2 < counts.selected_total:
            raise no_progress(state.conn, state.rule, final, counts.selected_total,
                              batch_no=counts.batch_no)
        if not counts.selected_total:
            check_zero_progress(state.conn, state.rule, self.cutoff, final,
                                self.options.batch_size, batch_no=counts.batch_no)
        return final

