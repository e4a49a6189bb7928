"""The counters of one purge: what its report says, and the skipped rows that can end it.

:class:`RunCounts` is the state every step of the
:class:`~favorites_maintenance.retention.batch_loop.BatchLoop` adds to: batches, rows, times,
the skipped rows' causes, the orders walked. It builds the run's
:class:`~favorites_maintenance.retention.report.PurgeReport` and decides when skipped rows end
the run (:data:`BLOCKED_AFTER`, ``max_skipped_rows``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from favorites_maintenance.retention.errors import SkippedRowsError
from favorites_maintenance.retention.report import PurgeReport, StopReason
from favorites_maintenance.retention.scan import ScanMode

# The purge's log lines keep the purge's logger name, whichever module writes them.
log = logging.getLogger("favorites_maintenance.retention.purge")

#: Candidates in a row that fail, nothing deleted between them, before the purge takes the
#: table for blocked and fails rather than trying every row one at a time.
BLOCKED_AFTER = 10


@dataclass
class RunCounts:
    """What one purge did so far, counted as its batches end.

    Attributes:
        batch_no: the number of the current batch transaction, 1-based (0 before the first).
        batches: batch transactions that deleted at least one row.
        deleted_total, selected_total: rows the committed batches deleted, and selected.
        batch_max_s: the longest committed batch transaction, seconds.
        batch_s: time in committed batch transactions that deleted rows, seconds.
        first_limit: the first batch's size, rows, once it ran (else 0).
        size_max: the largest size a batch ran with, rows.
        skipped: rows skipped for the run.
        failed_in_a_row: rows skipped in a row, nothing deleted between them.
        isolation_batches: transactions spent splitting failed batches.
        retried_batches: batches run again at once (a stale statement, the holds re-read).
        lock_waits: batches found holding a lock another session waited on.
        paced_s: time paused by ``sleep_ratio``, seconds.
        causes: cause of skipped rows -> rows (schema objects, never values).
        scan_modes: the orders the run walked in, in turn.
        scan_reason: why those orders.
    """

    batch_no: int = 0
    batches: int = 0
    deleted_total: int = 0
    selected_total: int = 0
    batch_max_s: float = 0.0
    batch_s: float = 0.0
    first_limit: int = 0
    size_max: int = 0
    skipped: int = 0
    failed_in_a_row: int = 0
    isolation_batches: int = 0
    retried_batches: int = 0
    lock_waits: int = 0
    paced_s: float = 0.0
    causes: dict[str, int] = field(default_factory=dict)
    scan_modes: list[ScanMode] = field(default_factory=list)
    scan_reason: str = ""

    def report(self, reason: StopReason, *, cutoff: dt.datetime, duration_s: float, size: int,
               health: dict) -> PurgeReport:
        """The run's report, ending for ``reason`` after ``duration_s`` seconds; ``size``: the
        next batch's size, rows (the first one's when none ran); ``health``: the health
        monitor's fields of the report (empty when health is not read)."""
        return PurgeReport(cutoff=cutoff, deleted_total=self.deleted_total,
                           batches=self.batches, duration_s=duration_s,
                           stop_reason=reason, batch_max_s=self.batch_max_s,
                           skipped_rows=self.skipped, skipped_causes=tuple(self.causes),
                           isolation_batches=self.isolation_batches,
                           retried_batches=self.retried_batches,
                           batch_size_first=self.first_limit or size,
                           row_s=self.batch_s / self.deleted_total if self.deleted_total else None,
                           batch_size_max=self.size_max, lock_waits=self.lock_waits,
                           scan_mode=",".join(map(str, self.scan_modes)),
                           scan_reason=self.scan_reason, paced_s=self.paced_s, **health)

    def skip(self, count: int, cause: str, key=None, *, key_name: str = "") -> None:
        """Count ``count`` skipped rows of ``cause``; ``key``: the one failed row's key, in the
        column ``key_name``."""
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
            log.warning("skipped row %s=%s (%s)", key_name, shown, cause)

    def check_skipped(self, max_skipped_rows: int,
                      report: Callable[[StopReason], PurgeReport]) -> None:
        """Raise :class:`~favorites_maintenance.retention.errors.SkippedRowsError`, carrying
        ``report(StopReason.EXHAUSTED)``, when the table looks blocked (:data:`BLOCKED_AFTER`
        rows in a row failed) or the run skipped more than ``max_skipped_rows`` rows."""
        if self.failed_in_a_row >= BLOCKED_AFTER:
            raise SkippedRowsError(
                f"the last {self.failed_in_a_row} prunable rows the purge tried all failed, "
                f"with nothing deleted between them ({self.deleted_total} rows deleted "
                f"before): the table looks blocked: {self._causes_text()}",
                report(StopReason.EXHAUSTED), self.batch_no) from None
        if self.skipped > max_skipped_rows:
            raise SkippedRowsError(
                f"more than {max_skipped_rows} prunable rows could not be deleted "
                f"in one run ({self.deleted_total} were): {self._causes_text()}",
                report(StopReason.EXHAUSTED), self.batch_no) from None

    def _causes_text(self) -> str:
        return "; ".join(f"{cause} ({count} rows)" for cause, count in self.causes.items())
