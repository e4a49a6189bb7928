"""What the purge's loop does when a batch transaction fails: take it again, split it, skip
its row, or end the run.

The batch is always rolled back first. Then, by the error (:class:`~favorites_maintenance.
retention.errors.ErrorKind`):

- an optimistic batch that met a row another session holds or moved is taken again in the
  locking form (``SKIP LOCKED``), which then serves the next few batches;
- a row moved to another partition under a locking batch (SQLSTATE 40001): the batch is taken
  again, up to :data:`_MOVED_ROW_RETRIES` times;
- a stale prepared statement or cached plan (a schema change): the batch runs again on a new
  connection, up to :data:`_STALE_RETRIES` times;
- a data exception (or a domain's check violation) while the holds are compared in the hold
  column's type, after a hold that does not read as that type was written: the holds are
  compared as text from then on;
- a row-level error or a statement timeout: the batch is split in halves down to one row, and a
  row that still fails is skipped for the run (the counts that end the run:
  :class:`~favorites_maintenance.retention.run_counts.RunCounts`); after a timeout the batches
  stay smaller (:meth:`~favorites_maintenance.retention.batch_sizing.BatchSizing.
  cap_after_timeout`);
- anything else raises :class:`~favorites_maintenance.retention.errors.BatchError`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.retention.diagnosis import (
    NO_PROGRESS_SAMPLE,
    SWALLOWED,
    delete_work,
    no_progress,
)
from favorites_maintenance.retention.errors import BatchError, ErrorDescription, ErrorKind
from favorites_maintenance.retention.holds import NOT_OF_THE_TYPE, typed_holds
from favorites_maintenance.retention.loop_preparation import reconnect
from favorites_maintenance.retention.page_statements import PageStatements
from favorites_maintenance.retention.report import StopReason
from favorites_maintenance.retention.scan import KeysetScan, PageScan
from favorites_maintenance.retention.statements import BatchStatements
from favorites_maintenance.retention.unreadable import locate_unreadable_row

# The purge's log lines keep the purge's logger name, whichever module writes them.
log = logging.getLogger("favorites_maintenance.retention.purge")

#: Runs of the same batch, in the locking form, after rows moved across partitions under it
#: (SQLSTATE 40001) before the error is raised.
_MOVED_ROW_RETRIES = 5

#: Runs of the same batch after a stale statement before the error is raised.
_STALE_RETRIES = 3

#: Another session holds a row, or moved it to another partition since it was read.
_CONFLICT_KINDS = frozenset({ErrorKind.LOCK_NOT_AVAILABLE, ErrorKind.SERIALIZATION_FAILURE})


class BatchFailures:
    """The failure steps of :class:`~favorites_maintenance.retention.batch_loop.BatchLoop`,
    which mixes them in: they read and set the loop's :attr:`state` (:class:`~favorites_
    maintenance.retention.loop_state.LoopState`: its rule, connection, statements, position, the
    batch's retries and its one row), its counts and the size of the next batch (``sizing``),
    and call its :meth:`report` and :meth:`_lock_from_now`.
    """

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
                and self.state.moved_retries < _MOVED_ROW_RETRIES):
            self._retry_moved(error)
            return
        if error.kind is ErrorKind.STALE_STATEMENT and self.state.stale_retries < _STALE_RETRIES:
            self._retry_stale(error)
            return
        self.state.stale_retries = 0
        if error.kind in NOT_OF_THE_TYPE and self._holds_as_text():
            return
        if error.kind is ErrorKind.STATEMENT_TIMEOUT and self._isolate(error, limit):
            self.sizing.cap_after_timeout(limit, elapsed, self.counts.batch_no)
            return
        if error.row_level and self._isolate(error, limit):
            return
        batch_no = self.counts.batch_no
        log.warning("batch %d failed and was rolled back: %s", batch_no, error)
        raise BatchError(batch_no, self.report(StopReason.EXHAUSTED), error) from None

    def _retry_moved(self, error: ErrorDescription) -> None:
        # A row of the batch moved to another partition as it was locked (an update of its
        # partition key): a new transaction reads where it went.
        self.state.moved_retries += 1
        self.state.again = True
        log.info("batch %d met a row moved by a concurrent update (%s); taking it "
                 "again", self.counts.batch_no, error)

    def _holds_as_text(self) -> bool:
        """After a batch failed on a data exception or a check violation: when the batches
        read the holds as the hold column's type and an active hold no longer reads as it (one
        written during the run), compare the holds as text from now on and take the batch
        again (``True``); else ``False``, the row at fault being the batch's own."""
        state = self.state
        hold = state.rule.hold
        if hold is None or hold.column_type is None:
            return False
        try:
            state.conn.rollback()
            with state.conn.begin():
                hold, warning = typed_holds(state.conn, hold, state.rule.qualified_name)
        except sa.exc.DBAPIError:
            return False
        if hold.column_type is not None:
            return False
        state.rule = state.rule.with_hold(hold)
        if state.archive is not None:
            # The archive's statements carry the rule's hold test too.
            state.archive = dataclasses.replace(
                state.archive, source_rule=state.archive.source_rule.with_hold(hold))
        state.statements = BatchStatements(state.rule, self.cutoff, state.by_ctid, state.archive)
        if isinstance(state.scan, PageScan):
            state.scan.statements = PageStatements.build(state.rule, self.cutoff, state.archive)
        elif state.scan is not None:
            state.scan.statements = state.statements
        self.counts.retried_batches += 1
        log.warning("batch %d was rolled back and is taken again: %s", self.counts.batch_no,
                    warning)
        return True

    def _retry_stale(self, error: ErrorDescription) -> None:
        # A prepared statement or cached plan outlived a schema change: a new connection
        # plans the same statement afresh.
        self.state.stale_retries += 1
        self.counts.retried_batches += 1
        log.warning("batch %d ran into a stale statement after a schema change; "
                    "running it again on a new connection: %s", self.counts.batch_no, error)
        self.state.conn = reconnect(self.engine, self.state.conn)

    def _isolate(self, error: ErrorDescription, limit: int) -> bool:
        """A batch of ``limit`` rows failed on a row-level error or a statement timeout: split
        it, or skip its one row; whether the run goes on (not when a one-row batch failed
        before naming its row, and the row could not be located either)."""
        if self.sizing.size < self.sizing.full():
            self.counts.isolation_batches += 1
        if limit > 1:
            self._split(error, limit)
            return True
        state = self.state
        if state.row_key is None and error.row_level and isinstance(state.scan, KeysetScan):
            # The lookup of the row failed itself (a row-level security policy raising for
            # it, which only keyset order meets: page order is refused on such a table):
            # find the row without reading it.
            found = locate_unreadable_row(state.conn, state.rule, self.cutoff, state.scan.after)
            if found is not None:
                state.row_key = _Candidate(key=found[1], age=found[0])
        if state.row_key is not None:
            self._skip_row(error)
            return True
        return False

    def _split(self, error: ErrorDescription, limit: int) -> None:
        # The same position, half the rows, own transaction.
        size = self.sizing.split(limit)
        what = ("ran past statement_timeout" if error.kind is ErrorKind.STATEMENT_TIMEOUT
                else f"failed on a row-level error ({error.cause})")
        log.info("batch %d %s; splitting it into batches of %d rows", self.counts.batch_no,
                 what, size)

    def _skip_row(self, error: ErrorDescription) -> None:
        """Skip the one row of a failed one-row batch and go on past it."""
        state = self.state
        key = state.row_key
        self.counts.skip(1, self._cause(error), key.key, key_name=state.rule.key.name)
        self.counts.check_skipped(self.options.max_skipped_rows, self.report)
        state.scan.skip(key)

    def _cause(self, error: ErrorDescription) -> str:
        """Why a row is skipped: the error's cause, and for a statement timeout what the row's
        delete fires (foreign keys, triggers: schema objects, never values)."""
        if error.kind is not ErrorKind.STATEMENT_TIMEOUT:
            return error.cause
        state = self.state
        if state.delete_work is None:
            state.delete_work = delete_work(state.conn, state.rule.qualified_name)
        return (f"{error.cause}: deleting this one row takes longer than statement_timeout"
                + (f" ({state.delete_work})" if state.delete_work else ""))

    def _swallowed(self, count: int) -> None:
        """``count`` rows the batch locked were not deleted: skipped, and judged."""
        counts = self.counts
        counts.skip(count, SWALLOWED)
        if counts.deleted_total * 2 < counts.selected_total:
            # Mostly swallowed: judged as no progress (which names the mechanisms) once
            # enough rows were selected, or at the end of the run.
            if counts.selected_total >= max(self.options.batch_size, NO_PROGRESS_SAMPLE):
                raise no_progress(self.state.conn, self.state.rule,
                                  self.report(StopReason.EXHAUSTED), counts.selected_total,
                                  batch_no=counts.batch_no)
        else:
            counts.check_skipped(self.options.max_skipped_rows, self.report)


@dataclass(frozen=True)
class _Candidate:
    """A one-row batch's row located without reading it (as the next-key lookup's row)."""

    key: object
    age: dt.datetime

