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
locking form, which then serves the next :data:`_LOCKING_AFTER_CONFLICT` batches. Where the
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
(:mod:`~favorites_maintenance.retention.batch_size`): it grows while batches stay well under
the target, shrinks at once when one goes over or when another session waited on a lock the
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
the database.

A batch that fails on a row-level error, or that ``statement_timeout`` cancels, is split in
halves from the same position, each in its own transaction, down to single rows; a single row
that still fails is skipped for the run (one whose very lookup fails, a row-level security
policy raising for it, is located without being read: :mod:`~favorites_maintenance.retention.
unreadable`). After a statement timeout the batches stay at a size that took about
:data:`TIMEOUT_AIM` of the time the cancelled batch ran, judged again after every batch. Why a run
that deletes nothing, or far less than it selects, fails:
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

from favorites_maintenance.retention.archive import Archive, ArchiveTarget, prepare_archive
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
    delete_work,
    no_progress,
)
from favorites_maintenance.retention.errors import (
    BatchError,
    ConnectError,
    ErrorDescription,
    ErrorKind,
    SkippedRowsError,
    TableChangedError,
    TableCheckError,
    TableShapeError,
    describe,
)
from favorites_maintenance.retention.health import (
    HealthLimits,
    HealthMonitor,
    LockWatch,
    Outcome,
)
from favorites_maintenance.retention.holds import typed_holds
from favorites_maintenance.retention.page_statements import PageStatements
from favorites_maintenance.retention.report import BatchResult, PurgeReport, StopReason
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.scan import (
    PROJECT_AFTER_S,
    KeysetScan,
    PageScan,
    PageSpan,
    ScanEstimate,
    ScanMode,
    choose_scan,
    read_scan_estimate,
)
from favorites_maintenance.retention.spans import BatchSpans
from favorites_maintenance.retention.statements import (
    BatchStatements,
    assert_primary,
    assert_triggers_fire,
    match_by_ctid,
    table_shape,
)
from favorites_maintenance.retention.table_check import check_table
from favorites_maintenance.retention.unreadable import locate_unreadable_row

# The purge's log lines keep the purge's logger name, whichever module writes them.
log = logging.getLogger("favorites_maintenance.retention.purge")

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

#: After a batch ran past ``statement_timeout``, batches aim at this share of the time it ran:
#: enough margin that the next batch, a little slower, still finishes.
TIMEOUT_AIM = 0.5

#: How often a pause between batches (``sleep_ratio``) polls the stop request, in seconds.
PACE_POLL_S = 0.2

#: Another session holds a row, or moved it to another partition since it was read.
_CONFLICT_KINDS = frozenset({ErrorKind.LOCK_NOT_AVAILABLE, ErrorKind.SERIALIZATION_FAILURE})


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
    target_batch_duration: dt.timedelta = dt.timedelta(0)
    health: HealthLimits | None = None
    scan: ScanMode | None = None
    sleep_ratio: float = 0.0
    previous_row_s: float | None = None


class BatchLoop:
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

    The run's state is the object's: the counters of its report, its position (:attr:`scan`, in
    keyset or page order), the size controller and the size of the next batch (:attr:`size`,
    smaller while a failed batch is split), the health monitor, the lock watch and the skipped
    rows' causes.
    """

    def __init__(self, engine: sa.Engine, rule: RetentionRule, cutoff: dt.datetime,
                 options: PurgeOptions, *, should_stop: Callable[[], bool] = lambda: False,
                 on_batch: Callable[[BatchResult], None] | None = None,
                 archive: ArchiveTarget | None = None):
        self.engine, self.rule, self.cutoff, self.options = engine, rule, cutoff, options
        self.should_stop, self.on_batch = should_stop, on_batch
        self.archive_target = archive
        self.archive: Archive | None = None  # checked against the table before batch 1
        self.started = time.monotonic()
        self.deadline = self.started + options.max_run_duration.total_seconds()
        self.sizes = BatchSizeController(options.batch_size,
                                         options.batch_size_max or options.batch_size,
                                         options.target_batch_duration,
                                         row_s=options.previous_row_s)
        self.size = self.sizes.size  # below _full_size() while failed batches are split
        # After a batch ran past statement_timeout: the largest batch expected to finish
        # within it, and how long the cancelled batch ran, seconds.
        self.timeout_cap: int | None = None
        self.timeout_s = 0.0
        self.delete_work: str | None = None  # what a delete fires, read at the first timeout
        self.shape: tuple | None = None  # the table's columns as checked (table_shape)
        # Asked just before a batch's commit: always when the batch is slow, else at a
        # bounded rate.
        self.lock_watch = (LockWatch(slow_after=self.sizes.target_s / 2)
                           if self.sizes.adaptive else None)
        self.monitor = (HealthMonitor(options.health, rule=rule)
                        if options.health is not None else None)
        self.fast_lock_timeout = min(options.lock_timeout, OPTIMISTIC_LOCK_TIMEOUT)
        self.deleted_total = self.batches = self.batch_no = self.selected_total = 0
        self.batch_max_s = 0.0
        self.batch_s = 0.0  # time in committed batch transactions that deleted rows
        self.first_limit = 0  # the first batch's size, once it ran
        # The backlog counted whole before the first batch (keyset order), else None: the
        # rest of it is taken in one batch once a batch's rate says it fits.
        self.counted: int | None = None
        self.skipped = self.isolation_batches = self.retried_batches = 0
        self.failed_in_a_row = self.size_max = self.lock_waits = 0
        self.causes: dict[str, int] = {}  # cause of skipped rows -> rows
        self.scan: KeysetScan | PageScan | None = None  # the run's position
        self.scan_modes: list[ScanMode] = []  # the orders the run walked in, in turn
        self.scan_reason = ""
        # Whether batches may be optimistic: once a batch transaction has committed, or from
        # the first when the table and role need no proof that the role may lock.
        self.proven = False
        self.last_batch_s = 0.0  # the last batch transaction's time, for sleep_ratio
        self.paced_s = 0.0  # time paused by sleep_ratio
        self.locking_left = 0  # batches to run in the locking form after a conflict
        self.moved_retries = 0  # runs of this batch that met a row moved across partitions
        self.stale_retries = 0  # runs of this batch that met a stale statement
        self.again = False  # the same batch runs again: its number stays
        self.row_key = None  # a one-row batch's candidate (key, age), named before its delete
        self.conn: sa.Connection | None = None
        self.statements: BatchStatements | None = None
        self.by_ctid = False  # whether the batches match their rows by address (ctid)
        self.keyset_index = False
        self.spans: BatchSpans | None = None
        # The backlog was counted whole before the first batch and is empty: no batch to
        # hold back, so no health pause either.
        self.nothing_prunable = False

    def run(self) -> PurgeReport:
        """Check the table, run batches until one comes back less than full or the run stops,
        and return the report. Raises what :func:`~favorites_maintenance.retention.purge.
        purge` documents."""
        self.conn = _connect(self.engine)
        try:
            self._prepare()
            while True:
                reason = self._before_batch()
                if reason is not None:
                    return self.report(reason)
                if self._run_batch():
                    return self._finish()
        finally:
            self.conn.close()

    def report(self, reason: StopReason) -> PurgeReport:
        """What the run did so far, ending for ``reason``."""
        return PurgeReport(cutoff=self.cutoff, deleted_total=self.deleted_total,
                           batches=self.batches, duration_s=time.monotonic() - self.started,
                           stop_reason=reason, batch_max_s=self.batch_max_s,
                           skipped_rows=self.skipped, skipped_causes=tuple(self.causes),
                           isolation_batches=self.isolation_batches,
                           retried_batches=self.retried_batches,
                           batch_size_first=self.first_limit or self.size,
                           row_s=self.batch_s / self.deleted_total if self.deleted_total else None,
                           batch_size_max=self.size_max, lock_waits=self.lock_waits,
                           scan_mode=",".join(map(str, self.scan_modes)),
                           scan_reason=self.scan_reason, paced_s=self.paced_s,
                           **(_health_report(self.monitor) if self.monitor is not None else {}))

    def _prepare(self) -> None:
        """Refuse a standby and a session whose triggers do not fire, check the table's shape
        (and the archive's, creating it when missing), and build the run's statements."""
        conn, rule, options = self.conn, self.rule, self.options
        try:
            assert_primary(conn)
            assert_triggers_fire(conn)
            conn.rollback()  # end the autobegun transaction of the checks
        except sa.exc.DBAPIError as exc:
            raise _connect_error(exc) from None
        try:
            with conn.begin():
                # Reading the catalogs locks the table like a batch does: bounded the same way.
                limit_transaction(conn, lock_timeout=options.lock_timeout,
                                  statement_timeout=options.statement_timeout)
                findings = check_table(conn, rule)
                hold_warning = None
                if rule.hold is not None:
                    # Read once: the batches then compare the holds in the hold column's type.
                    hold, hold_warning = typed_holds(conn, rule.hold, rule.qualified_name)
                    rule = self.rule = rule.with_hold(hold)
                self.shape = table_shape(conn, rule)
                by_ctid = self.by_ctid = match_by_ctid(conn, rule)
                if self.archive_target is not None:
                    self.archive = prepare_archive(conn, rule, self.archive_target)
                estimate = (read_scan_estimate(conn, rule, self.cutoff, self.sizes.maximum)
                            if options.scan is not ScanMode.KEYSET else None)
        except sa.exc.DBAPIError as exc:
            error = describe(exc)
            # WARNING, as every line of the core about a failure: whether the run failed (or
            # a retry follows) is its caller's to say.
            log.warning("could not check the table before the first batch: %s", error)
            raise TableCheckError(error, rule.qualified_name) from None
        for warning in findings.warnings + ((hold_warning,) if hold_warning else ()):
            log.warning("%s", warning)
        self.keyset_index = findings.keyset_index
        self.statements = BatchStatements.build(rule, self.cutoff, by_ctid, self.archive)
        self.spans = BatchSpans(self.engine, rule)
        self._choose_scan(estimate)

    def _choose_scan(self, estimate: ScanEstimate | None) -> None:
        """Start the run in the order :func:`~favorites_maintenance.retention.scan.choose_scan`
        picks from ``estimate`` (``None``: keyset order was asked for)."""
        budget = self.options.max_run_duration.total_seconds()
        if estimate is None:
            mode, self.scan_reason = ScanMode.KEYSET, "keyset order, as asked"
        elif self.options.scan is ScanMode.PAGE_ORDER and estimate.refused is None:
            mode, self.scan_reason = ScanMode.PAGE_ORDER, "page order, as asked"
        else:
            mode, self.scan_reason = choose_scan(estimate, budget)
        if estimate is not None and not estimate.lock_first:
            # Nothing can refuse this role the lock that would not refuse the DELETE: the
            # first batch may be optimistic (one write per row), as every later one.
            self.proven = True
        self.nothing_prunable = (estimate is not None and estimate.counted_all
                                 and not estimate.backlog)
        if estimate is not None and mode is ScanMode.KEYSET and estimate.counted_all:
            # The whole backlog is counted (a day's rows): once a batch's rate says the rest
            # fits, one batch takes it (at a known time per row it is within the first size).
            self.counted = estimate.backlog
        self._log_first_size()
        if mode is ScanMode.PAGE_ORDER:
            density = (estimate.density if estimate.density is not None
                       else estimate.backlog / max(estimate.blocks, 1))
            self.scan = PageScan(PageStatements.build(self.rule, self.cutoff, self.archive),
                                 estimate.blocks,
                                 PageSpan(density, self.sizes.target_s))
        else:
            self.scan = KeysetScan(self.statements)
        self.scan_modes.append(mode)
        log.info("%s: %s", self.rule.qualified_name, self.scan_reason)

    def _log_first_size(self) -> None:
        """Say where the first batch's size comes from, when the size adapts."""
        if not self.sizes.adaptive:
            return
        known = self.options.previous_row_s
        if known is None:
            log.info("first batch at most %d rows: no earlier run's time per row is known",
                     self.size)
        else:
            log.info("first batch at most %d rows: the previous run took %.4g ms a row, and a "
                     "batch aims at %g ms", self.size, known * 1000, self.sizes.target_s * 1000)

    def _project(self) -> None:
        """In page order, from :data:`~favorites_maintenance.retention.scan.PROJECT_AFTER_S`
        into the run: go on oldest first if the pages left would not be read within the budget
        at the pace so far."""
        scan, now = self.scan, time.monotonic()
        if not isinstance(scan, PageScan) or now - self.started < PROJECT_AFTER_S:
            return
        done, left = scan.pages_done, scan.blocks - scan.pages_done
        if not done or now + (now - self.started) * left / done <= self.deadline:
            return
        reason = (f"then keyset order, oldest first, from batch {self.batch_no + 1}: "
                  f"{left:,} pages left at {done / (now - self.started):,.0f} pages a second "
                  f"would outlast the time budget")
        log.info("%s: %s", self.rule.qualified_name, reason)
        self.scan_reason += "; " + reason
        self.scan = KeysetScan(self.statements)
        self.scan_modes.append(ScanMode.KEYSET)

    def _before_batch(self) -> StopReason | None:
        """Why the run stops before the next batch (a stop request, the time budget, an
        unhealthy database), else ``None``; pauses while the database is unhealthy."""
        if self.should_stop():
            return StopReason.STOP_REQUESTED
        # The first batch always runs, so every run makes progress however small its budget.
        if self.batch_no and time.monotonic() >= self.deadline:
            return StopReason.MAX_RUN_DURATION
        if self.options.sleep_ratio and self.last_batch_s:
            reason = self._pace()
            if reason is not None:
                return reason
        if self.monitor is not None and not (self.nothing_prunable and not self.batch_no):
            # No transaction is open here: a pause holds no lock and no snapshot. A run with
            # no prunable row waits for nothing: its one batch finds none.
            outcome = self.monitor.wait(self.conn, should_stop=self.should_stop,
                                        deadline=self.deadline)
            if outcome is Outcome.STOP_REQUESTED:
                return StopReason.STOP_REQUESTED
            if outcome is Outcome.UNHEALTHY:
                return StopReason.DB_UNHEALTHY
        return None

    def _pace(self) -> StopReason | None:
        """Pause ``sleep_ratio`` times the last batch's time, no transaction open; why the run
        stops instead (a stop request, the time budget), else ``None``."""
        started = time.monotonic()
        until = min(started + self.options.sleep_ratio * self.last_batch_s, self.deadline)
        self.last_batch_s = 0.0  # one pause per batch, whatever follows
        try:
            while (now := time.monotonic()) < until:
                time.sleep(min(PACE_POLL_S, until - now))
                if self.should_stop():
                    return StopReason.STOP_REQUESTED
        finally:
            self.paced_s += time.monotonic() - started
        return StopReason.MAX_RUN_DURATION if time.monotonic() >= self.deadline else None

    def _run_batch(self) -> bool:
        """Run one batch transaction and take its outcome; whether the run is done (the
        batch came back less than full)."""
        if not (self.stale_retries or self.again):
            self.batch_no += 1
        self.again = False
        limit = self.size
        self.size_max = max(self.size_max, limit)
        self.first_limit = self.first_limit or limit
        self.row_key = None
        fast = self._optimistic(limit)
        statement, params = self.scan.batch(fast, limit)
        span = self.spans.start(self.batch_no, limit, fast, statement)
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
            self.last_batch_s = time.monotonic() - t0
        return self._on_success(row, limit, fast, waiters, t0)

    def _optimistic(self, limit: int) -> bool:
        """Whether the next batch (``limit`` rows) runs in the optimistic form."""
        # The first batch locks first where the table or role may refuse the lock (see
        # ScanEstimate.lock_first): it proves the role may lock what the rule matches (the
        # form every later batch falls back to), so row-level security without an UPDATE
        # policy fails the run at once rather than under contention.
        return (self.options.optimistic and self.proven and limit > 1
                and self.size == self._full_size() and not self.locking_left)

    def _full_size(self) -> int:
        """The size of a batch when no failed batch is being split: the size controller's,
        under the cap a statement timeout set."""
        if self.timeout_cap is None:
            return self.sizes.size
        return min(self.sizes.size, self.timeout_cap)

    def _transaction(self, statement: sa.Executable, params: dict, limit: int, fast: bool,
                     t0: float) -> tuple[sa.Row, int]:
        """The batch transaction: its row (``selected``, ``deleted`` and the position the
        scan reads) and how many sessions waited on its locks (0 when not asked)."""
        conn, options, waiters = self.conn, self.options, 0
        with conn.begin() as tx:
            limit_transaction(conn,
                              lock_timeout=self.fast_lock_timeout if fast else options.lock_timeout,
                              statement_timeout=options.statement_timeout,
                              synchronous_commit=options.synchronous_commit,
                              incremental_sort=False if self.keyset_index else None,
                              nested_loop_joins_only=True, serial=True,
                              tid_scans_only=self.scan.tid_scans_only, seqscan=False)
            if limit == 1:
                self.row_key = conn.execute(*self.scan.next_key()).first()
            row = self.scan.execute(conn, statement, params)
            if fast and row.deleted != row.selected:
                # A row moved, was claimed or was held (in page order: or a row became
                # prunable between the count and the DELETE): the locking form decides, so
                # that no transaction commits more rows than the batch's limit.
                tx.rollback()
            if tx.is_active:
                # After the statement, which holds the table's lock: no migration can commit
                # between what this reads and what the batch ran against.
                self._check_shape(conn)
            if tx.is_active and self.archive is not None:
                # After the statement, which holds the table's lock: raises (and the batch
                # rolls back) if a column changed since the archive was checked.
                self.archive.check_unchanged(conn)
            if tx.is_active and self.lock_watch is not None and self.lock_watch.due(
                    time.monotonic() - t0):
                waiters = self.lock_watch.waiters(conn)
        return row, waiters

    def _check_shape(self, conn: sa.Connection) -> None:
        """Inside the batch transaction: check the table again if its columns changed since
        it was checked; raise :class:`TableChangedError` (the batch rolls back) when the rule
        can no longer use it."""
        shape = table_shape(conn, self.rule)
        if shape == self.shape:
            return
        try:
            findings = check_table(conn, self.rule)
        except TableShapeError as exc:
            message = (f"{self.rule.qualified_name} changed during the run: batch "
                       f"{self.batch_no} was rolled back and no batch follows "
                       f"({self.deleted_total} rows deleted before stay deleted): {exc}")
            log.warning("%s", message)
            raise TableChangedError(message, exc.column, self.batch_no,
                                    self.report(StopReason.EXHAUSTED)) from None
        self.shape = shape
        log.info("%s changed during the run; checked again at batch %d: the rule can still "
                 "use it", self.rule.qualified_name, self.batch_no)
        for warning in findings.warnings:
            log.warning("%s", warning)

    def _on_error(self, error: ErrorDescription, limit: int, fast: bool,
                  elapsed: float) -> None:
        """A batch of ``limit`` rows failed after ``elapsed`` seconds and was rolled back:
        arrange to take it again, split it or skip its row, or raise :class:`BatchError`."""
        if fast and error.kind in _CONFLICT_KINDS:
            # Another session holds a row of the batch, or moved it to another partition
            # meanwhile: take the batch again with SKIP LOCKED, and keep to that form for a while.
            self._lock_from_now()
            return
        if (error.kind is ErrorKind.SERIALIZATION_FAILURE
                and self.moved_retries < _MOVED_ROW_RETRIES):
            self._retry_moved(error)
            return
        if error.kind is ErrorKind.STALE_STATEMENT and self.stale_retries < _STALE_RETRIES:
            self._retry_stale(error)
            return
        self.stale_retries = 0
        if error.kind is ErrorKind.DATA_EXCEPTION and self._holds_as_text():
            return
        if error.kind is ErrorKind.STATEMENT_TIMEOUT and self._isolate(error, limit):
            self._cap_after_timeout(limit, elapsed)
            return
        if error.row_level and self._isolate(error, limit):
            return
        log.warning("batch %d failed and was rolled back: %s", self.batch_no, error)
        raise BatchError(self.batch_no, self.report(StopReason.EXHAUSTED), error) from None

    def _lock_from_now(self) -> None:
        """Take the same batch again in the locking form, and the next few batches too."""
        self.locking_left, self.again = _LOCKING_AFTER_CONFLICT, True

    def _retry_moved(self, error: ErrorDescription) -> None:
        # A row of the batch moved to another partition as it was locked (an update of its
        # partition key): a new transaction reads where it went.
        self.moved_retries += 1
        self.again = True
        log.info("batch %d met a row moved by a concurrent update (%s); taking it "
                 "again", self.batch_no, error)

    def _holds_as_text(self) -> bool:
        """After a batch failed on a data exception: when the batches read the holds as the
        hold column's type and an active hold no longer reads as it (one written during the
        run), compare the holds as text from now on and take the batch again (``True``);
        else ``False``, the row at fault being the batch's own."""
        hold = self.rule.hold
        if hold is None or hold.column_type is None:
            return False
        try:
            self.conn.rollback()
            with self.conn.begin():
                hold, warning = typed_holds(self.conn, hold, self.rule.qualified_name)
        except sa.exc.DBAPIError:
            return False
        if hold.column_type is not None:
            return False
        self.rule = self.rule.with_hold(hold)
        self.statements = BatchStatements.build(self.rule, self.cutoff, self.by_ctid,
                                                self.archive)
        if isinstance(self.scan, PageScan):
            self.scan.statements = PageStatements.build(self.rule, self.cutoff, self.archive)
        elif self.scan is not None:
            self.scan.statements = self.statements
        self.retried_batches += 1
        log.warning("batch %d was rolled back and is taken again: %s", self.batch_no, warning)
        return True

    def _retry_stale(self, error: ErrorDescription) -> None:
        # A prepared statement or cached plan outlived a schema change: a new connection
        # plans the same statement afresh.
        self.stale_retries += 1
        self.retried_batches += 1
        log.warning("batch %d ran into a stale statement after a schema change; "
                    "running it again on a new connection: %s", self.batch_no, error)
        self.conn = _reconnect(self.engine, self.conn)

    def _isolate(self, error: ErrorDescription, limit: int) -> bool:
        """A batch of ``limit`` rows failed on a row-level error or a statement timeout: split
        it, or skip its one row; whether the run goes on (not when a one-row batch failed
        before naming its row, and the row could not be located either)."""
        if self.size < self._full_size():
            self.isolation_batches += 1
        if limit > 1:
            self._split(error, limit)
            return True
        if self.row_key is None and error.row_level and isinstance(self.scan, KeysetScan):
            # The lookup of the row failed itself (a row-level security policy raising for
            # it, which only keyset order meets: page order is refused on such a table):
            # find the row without reading it.
            found = locate_unreadable_row(self.conn, self.rule, self.cutoff, self.scan.after)
            if found is not None:
                self.row_key = _Candidate(key=found[1], age=found[0])
        if self.row_key is not None:
            self._skip_row(error)
            return True
        return False

    def _split(self, error: ErrorDescription, limit: int) -> None:
        # The same position, half the rows, own transaction.
        self.size = max(1, limit // 2)
        what = ("ran past statement_timeout" if error.kind is ErrorKind.STATEMENT_TIMEOUT
                else f"failed on a row-level error ({error.cause})")
        log.info("batch %d %s; splitting it into batches of %d rows", self.batch_no, what,
                 self.size)

    def _cap_after_timeout(self, limit: int, elapsed: float) -> None:
        """A batch of ``limit`` rows ran ``elapsed`` seconds, past ``statement_timeout``:
        later batches stay below it (see :meth:`_follow_timeout`)."""
        if limit == 1:
            return  # that row's own cost, skipped: no reason to shrink the others
        if self.timeout_cap is None:
            log.warning("batch %d ran past statement_timeout (%.1f s) and was rolled back: its "
                        "rows are taken again in smaller batches, down to one row; a row "
                        "whose delete alone runs past it is skipped", self.batch_no, elapsed)
        self.timeout_cap = min(self.timeout_cap or limit, max(1, limit // 2))
        self.timeout_s = max(self.timeout_s, elapsed)

    def _follow_timeout(self, selected: int, elapsed: float) -> None:
        """After a statement timeout: the cap for the next batch, from the time this one of
        ``selected`` rows took (aiming at :data:`TIMEOUT_AIM` of the cancelled batch's time,
        growing at most twofold); lifted once it reaches the controller's size."""
        aimed = selected * TIMEOUT_AIM * self.timeout_s / elapsed if elapsed > 0 else selected * 2
        cap = max(1, int(min(aimed, selected * 2)))
        self.timeout_cap = None if cap >= self.sizes.size else cap

    def _skip_row(self, error: ErrorDescription) -> None:
        """Skip the one row of a failed one-row batch and go on past it."""
        key = self.row_key
        self._skip(1, self._cause(error), key.key)
        self._check_skipped()
        self.scan.skip(key)

    def _cause(self, error: ErrorDescription) -> str:
        """Why a row is skipped: the error's cause, and for a statement timeout what the row's
        delete fires (foreign keys, triggers: schema objects, never values)."""
        if error.kind is not ErrorKind.STATEMENT_TIMEOUT:
            return error.cause
        if self.delete_work is None:
            self.delete_work = delete_work(self.conn, self.rule.qualified_name)
        return (f"{error.cause}: deleting this one row takes longer than statement_timeout"
                + (f" ({self.delete_work})" if self.delete_work else ""))

    def _on_success(self, row: sa.Row, limit: int, fast: bool, waiters: int,
                    t0: float) -> bool:
        """The batch's transaction ended without error: count it and size the next batch;
        whether the run is done."""
        self.stale_retries = self.moved_retries = 0
        self.proven = True
        if fast and row.deleted != row.selected:
            self._lock_from_now()  # rolled back: the locking form takes the batch again
            return False
        if self.locking_left and self.size == self._full_size():
            self.locking_left -= 1
        elapsed = time.monotonic() - t0
        self.batch_max_s = max(self.batch_max_s, elapsed)
        self.deleted_total += row.deleted
        self.selected_total += row.selected
        self._resize(row.selected, limit, waiters, elapsed)
        if row.deleted:
            self.batches += 1
            self.batch_s += elapsed
            self.failed_in_a_row = 0
        if row.selected:
            log.debug("batch %d deleted %d rows of at most %d in %.1f ms; next batch %d rows",
                      self.batch_no, row.deleted, limit, elapsed * 1000, self.size)
        if self.on_batch is not None:
            self.on_batch(BatchResult(self.batch_no, row.deleted, elapsed, self.deleted_total,
                                      limit))
        if row.deleted < row.selected:
            self._swallowed(row.selected - row.deleted)
        if self.scan.advance(row, limit, elapsed):
            return True
        self._project()
        return False

    def _resize(self, selected: int, limit: int, waiters: int, elapsed: float) -> None:
        """The size of the next batch, after one of ``limit`` rows that selected ``selected``
        in ``elapsed`` seconds while ``waiters`` sessions waited on its locks."""
        if self.timeout_cap is not None and selected:
            self._follow_timeout(selected, elapsed)
        if self.size < self._full_size():
            self.isolation_batches += 1
            # A piece went through: grow back toward the adaptive size (which does not
            # change while a failed batch is split).
            self.size = min(self._full_size(), self.size * 2)
        elif self.scan.rates_batch(selected, limit) and not waiters:
            self.sizes.after_batch(selected, elapsed)
            if self.counted is not None:
                # What is left of the counted backlog, in one batch if this batch's rate
                # says it fits.
                self.sizes.fit(self.counted - self.selected_total)
            self.size = self._full_size()
        elif self.scan.rates_batch(selected, limit):
            # Someone waited on this batch's locks: whatever its time, the next is smaller.
            self.lock_waits += 1
            self.sizes.lock_waiters(waiters)
            self.size = self._full_size()
            log.info("batch %d held a lock %d other sessions waited on; next batch %d rows",
                     self.batch_no, waiters, self.size)

    def _swallowed(self, count: int) -> None:
        """``count`` rows the batch locked were not deleted: skipped, and judged."""
        self._skip(count, SWALLOWED)
        if self.deleted_total * 2 < self.selected_total:
            # Mostly swallowed: judged as no progress (which names the mechanisms) once
            # enough rows were selected, or at the end of the run.
            if self.selected_total >= max(self.options.batch_size, NO_PROGRESS_SAMPLE):
                raise no_progress(self.conn, self.rule, self.report(StopReason.EXHAUSTED),
                                  self.selected_total, batch_no=self.batch_no)
        else:
            self._check_skipped()

    def _skip(self, count: int, cause: str, key=None) -> None:
        """Count ``count`` skipped rows of ``cause``; ``key``: the one failed row's key."""
        self.skipped += count
        if key is not None:
            self.failed_in_a_row += count
        if cause not in self.causes:
            log.warning("rows skipped: %s", cause)
        self.causes[cause] = self.causes.get(cause, 0) + count
        if key is not None:
            # Only a number (a surrogate key) is logged: another policy's key may be a uuid or
            # text that identifies a person (an anonymous id), which is never logged.
            shown = key if isinstance(key, int) and not isinstance(key, bool) else "(not shown)"
            log.warning("skipped row %s=%s (%s)", self.rule.key.name, shown, cause)

    def _check_skipped(self) -> None:
        """Raise :class:`SkippedRowsError` when the table looks blocked or the run skipped
        more rows than it may."""
        if self.failed_in_a_row >= BLOCKED_AFTER:
            raise SkippedRowsError(
                f"the last {self.failed_in_a_row} prunable rows the purge tried all failed, "
                f"with nothing deleted between them ({self.deleted_total} rows deleted "
                f"before): the table looks blocked: {_causes_text(self.causes)}",
                self.report(StopReason.EXHAUSTED), self.batch_no) from None
        if self.skipped > self.options.max_skipped_rows:
            raise SkippedRowsError(
                f"more than {self.options.max_skipped_rows} prunable rows could not be deleted "
                f"in one run ({self.deleted_total} were): {_causes_text(self.causes)}",
                self.report(StopReason.EXHAUSTED), self.batch_no) from None

    def _finish(self) -> PurgeReport:
        """The last batch came back less than full: judge the run's progress, and report."""
        final = self.report(StopReason.EXHAUSTED)
        if self.deleted_total * 2 < self.selected_total:
            raise no_progress(self.conn, self.rule, final, self.selected_total,
                              batch_no=self.batch_no)
        if not self.selected_total:
            check_zero_progress(self.conn, self.rule, self.cutoff, final,
                                self.options.batch_size, batch_no=self.batch_no)
        return final


@dataclass(frozen=True)
class _Candidate:
    """A one-row batch's row located without reading it (as the next-key lookup's row)."""

    key: object
    age: dt.datetime


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
    log.warning("no session on the favorites database: %s", error)
    return ConnectError(error)
