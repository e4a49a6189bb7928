"""The purge's loop before its first batch, and the order its batches walk in.

Before the first batch the loop opens its session (:func:`connect`), refuses a standby and a
session whose triggers do not fire, checks the table's shape (and the archive's), reads the holds
in the hold column's type and picks the order (:mod:`~favorites_maintenance.retention.scan`).
During the run it turns from page order to keyset order when the pages left would outlast the
time budget, and checks the table again inside a batch when its columns changed.
"""

from __future__ import annotations

import logging
import time

import sqlalchemy as sa

from favorites_maintenance.retention.archive import prepare_archive
from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.errors import (
    ConnectError,
    TableChangedError,
    TableCheckError,
    TableShapeError,
    describe,
)
from favorites_maintenance.retention.hold_copy import copy_holds
from favorites_maintenance.retention.holds import typed_holds
from favorites_maintenance.retention.page_statements import PageStatements
from favorites_maintenance.retention.report import StopReason
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
    check_session,
    table_facts,
    table_shape,
)
from favorites_maintenance.retention.table_check import check_table

# The purge's log lines keep the purge's logger name, whichever module writes them.
log = logging.getLogger("favorites_maintenance.retention.purge")


class LoopPreparation:
    """The preparation steps of :class:`~favorites_maintenance.retention.batch_loop.BatchLoop`,
    which mixes them in: they fill the loop's :attr:`state` (:class:`~favorites_maintenance.
    retention.loop_state.LoopState`: the rule with its holds typed, the archive, the statements,
    the position and what the catalogs said), whether its first batch may be optimistic
    (``form.proven``) and the backlog counted whole (``sizing.counted``); they call its
    :meth:`report`.
    """

    def _prepare(self) -> None:
        """Refuse a standby and a session whose triggers do not fire, check the table's shape
        (and the archive's, creating it when missing), and build the run's statements: one
        transaction, each catalog read a statement of its own only where it could not share
        one (a run of a day's rows spends more here than in its batch)."""
        state, options = self.state, self.options
        conn, rule = state.conn, state.rule
        tx = conn.begin()
        try:
            check_session(conn)
        except sa.exc.DBAPIError as exc:
            raise connect_error(exc) from None  # closing the connection ends the transaction
        try:
            with tx:
                # Reading the catalogs locks the table like a batch does: bounded the same way.
                limit_transaction(conn, lock_timeout=options.lock_timeout,
                                  statement_timeout=options.statement_timeout)
                findings = check_table(conn, rule)
                hold_warning = None
                if rule.hold is not None:
                    # Read once: the batches then compare the holds in the hold column's type.
                    hold, hold_warning = typed_holds(conn, rule.hold, rule.qualified_name)
                    # With the hold table's change counter: one copy of the holds for the
                    # batches, read again only when a hold was written.
                    rule = state.rule = rule.with_hold(copy_holds(conn, hold))
                facts = table_facts(conn, rule)
                state.shape, state.by_ctid = facts.shape, facts.by_ctid
                if self.archive_target is not None:
                    state.archive = prepare_archive(conn, rule, self.archive_target)
                estimate = (read_scan_estimate(conn, rule, self.cutoff,
                                               self.sizing.controller.maximum, facts)
                            if options.scan is not ScanMode.KEYSET else None)
        except sa.exc.DBAPIError as exc:
            error = describe(exc)
            # WARNING, as every line of the core about a failure: whether the run failed (or
            # a retry follows) is its caller's to say.
            log.warning("could not check the table before the first batch: %s", error)
            raise TableCheckError(error, rule.qualified_name) from None
        for warning in findings.warnings + ((hold_warning,) if hold_warning else ()):
            log.warning("%s", warning)
        state.keyset_index = findings.keyset_index
        state.statements = BatchStatements(rule, self.cutoff, state.by_ctid, state.archive)
        state.spans = BatchSpans(self.engine, rule)
        self._choose_scan(estimate)

    def _choose_scan(self, estimate: ScanEstimate | None) -> None:
        """Start the run in the order :func:`~favorites_maintenance.retention.scan.choose_scan`
        picks from ``estimate`` (``None``: keyset order was asked for)."""
        budget, state = self.options.max_run_duration.total_seconds(), self.state
        if estimate is None:
            mode, self.counts.scan_reason = ScanMode.KEYSET, "keyset order, as asked"
        elif self.options.scan is ScanMode.PAGE_ORDER and estimate.refused is None:
            mode, self.counts.scan_reason = ScanMode.PAGE_ORDER, "page order, as asked"
        else:
            mode, self.counts.scan_reason = choose_scan(estimate, budget)
        if estimate is not None and not estimate.lock_first:
            # Nothing can refuse this role the lock that would not refuse the DELETE: the
            # first batch may be optimistic (one write per row), as every later one.
            self.form.proven = True
        state.nothing_prunable = (estimate is not None and estimate.counted_all
                                  and not estimate.backlog)
        if estimate is not None and mode is ScanMode.KEYSET and estimate.counted_all:
            # The whole backlog is counted (a day's rows): once a batch's rate says the rest
            # fits, one batch takes it (at a known time per row it is within the first size).
            self.sizing.counted = estimate.backlog
        if mode is ScanMode.KEYSET:
            self._widen()
        if mode is ScanMode.PAGE_ORDER:
            density = (estimate.density if estimate.density is not None
                       else estimate.backlog / max(estimate.blocks, 1))
            state.scan = PageScan(PageStatements.build(state.rule, self.cutoff, state.archive),
                                  estimate.blocks,
                                  PageSpan(density, self.sizing.controller.target_s))
        else:
            state.scan = KeysetScan(state.statements)
        self.counts.scan_modes.append(mode)
        # One line: in a run of Dagster each line is a write to its storage.
        log.info("%s: %s%s", state.rule.qualified_name, self.counts.scan_reason,
                 self._first_size_text())

    def _widen(self) -> None:
        """In keyset order, let the batches grow to the keyset order's largest size."""
        if self.options.keyset_batch_size_max is not None:
            self.sizing.controller.widen(self.options.keyset_batch_size_max)

    def _first_size_text(self) -> str:
        """Where the first batch's size comes from, when the size adapts (else empty), to
        follow the order in the run's log line."""
        sizes = self.sizing.controller
        if not sizes.adaptive:
            return ""
        known = self.options.previous_row_s
        if known is None:
            return (f"; first batch at most {self.sizing.size} rows: no earlier run's time per "
                    f"row is known")
        return (f"; first batch at most {self.sizing.size} rows: the previous run took "
                f"{known * 1000:.4g} ms a row, and a batch aims at "
                f"{sizes.target_s * 1000:g} ms")

    def _project(self) -> None:
        """In page order, from :data:`~favorites_maintenance.retention.scan.PROJECT_AFTER_S`
        into the run: go on oldest first if the pages left would not be read within the budget
        at the pace so far."""
        state, now, budget = self.state, time.monotonic(), self.budget
        scan = state.scan
        if not isinstance(scan, PageScan) or now - budget.started < PROJECT_AFTER_S:
            return
        done, left = scan.pages_done, scan.blocks - scan.pages_done
        if not done or now + (now - budget.started) * left / done <= budget.deadline:
            return
        reason = (f"then keyset order, oldest first, from batch {self.counts.batch_no + 1}: "
                  f"{left:,} pages left at {done / (now - budget.started):,.0f} pages a second "
                  f"would outlast the time budget")
        log.info("%s: %s", state.rule.qualified_name, reason)
        self.counts.scan_reason += "; " + reason
        self._widen()
        state.scan = KeysetScan(state.statements)
        self.counts.scan_modes.append(ScanMode.KEYSET)

    def _check_shape(self, conn: sa.Connection) -> None:
        """Inside the batch transaction: check the table again if its columns changed since
        it was checked; raise :class:`TableChangedError` (the batch rolls back) when the rule
        can no longer use it."""
        state = self.state
        shape = table_shape(conn, state.rule)
        if shape == state.shape:
            return
        try:
            findings = check_table(conn, state.rule)
        except TableShapeError as exc:
            message = (f"{state.rule.qualified_name} changed during the run: batch "
                       f"{self.counts.batch_no} was rolled back and no batch follows "
                       f"({self.counts.deleted_total} rows deleted before stay deleted): {exc}")
            log.warning("%s", message)
            raise TableChangedError(message, exc.column, self.counts.batch_no,
                                    self.report(StopReason.EXHAUSTED)) from None
        state.shape = shape
        log.info("%s changed during the run; checked again at batch %d: the rule can still "
                 "use it", state.rule.qualified_name, self.counts.batch_no)
        for warning in findings.warnings:
            log.warning("%s", warning)


def connect(engine: sa.Engine) -> sa.Connection:
    """A connection from ``engine``; raises :class:`~favorites_maintenance.retention.errors.
    ConnectError` when none can be opened."""
    try:
        return engine.connect()
    except sa.exc.DBAPIError as exc:
        raise connect_error(exc) from None


def reconnect(engine: sa.Engine, conn: sa.Connection) -> sa.Connection:
    """Close ``conn`` for good (its server session too) and open another from ``engine``;
    raises :class:`~favorites_maintenance.retention.errors.ConnectError` as :func:`connect`."""
    conn.invalidate()  # psycopg's prepared statements die with the server session
    conn.close()
    return connect(engine)


def connect_error(exc: sa.exc.DBAPIError) -> ConnectError:
    """The error to raise for ``exc``, met opening or checking a session (logged, without
    the URL's password or any row's values)."""
    error = describe(exc)
    log.warning("no session on the favorites database: %s", error)
    return ConnectError(error)
