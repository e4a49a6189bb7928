"""What a purge reports: why it stopped, each committed batch, and the run as a whole.

These are plain values, imported by the errors that carry a partial report
(:class:`~favorites_maintenance.retention.errors.BatchError` and others) and by the purge that
builds them; this module imports nothing else of the retention core.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass


class StopReason(str, enum.Enum):
    """Why a purge ended without error (metadata ``stopReason``)."""

    EXHAUSTED = "exhausted"
    """A batch came back less than full: nothing prunable and unlocked is left past the cursor."""
    MAX_RUN_DURATION = "max_run_duration"
    """The run's time budget ran out; the backlog is left for the next run."""
    STOP_REQUESTED = "stop_requested"
    """A stop was requested (run termination, SIGTERM); honoured between batches."""
    DB_UNHEALTHY = "db_unhealthy"
    """The database stayed unhealthy (replication lag, a VACUUM on the table, WAL rate) longer
    than the longest pause, or past the time budget while paused: a success; the backlog is
    left for the next run (see :mod:`~favorites_maintenance.retention.health`)."""


@dataclass(frozen=True)
class BatchResult:
    """One committed batch transaction.

    Attributes:
        batch_no: 1-based number of the batch transaction in this run (empty ones included).
        deleted: rows the batch deleted (0..batch_size).
        duration_s: wall time of the transaction, BEGIN to COMMIT, in seconds.
        deleted_total: rows deleted by the run so far, this batch included.
        batch_size: the batch's size limit, rows (the adaptive size, or a piece of it while a
            failed batch is split).
    """

    batch_no: int
    deleted: int
    duration_s: float
    deleted_total: int
    batch_size: int = 0


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
        skipped_rows: prunable rows left in place because deleting them failed on a row-level
            error (a foreign key, a trigger, a cascade), ran past ``statement_timeout`` alone,
            or had no effect; the next run tries them again.
        skipped_causes: one entry per distinct cause of the skipped rows, naming the
            constraint, trigger function and table involved (schema objects, never values).
        isolation_batches: transactions spent splitting failed batches to isolate those rows.
        retried_batches: batches run again at once after a stale prepared statement or cached
            plan (a schema change during the run).
        batch_size_first: the first batch's size, rows (from ``previous_row_s`` when known,
            else ``batch_size``).
        batch_size_max: the largest size a batch ran with, rows (0 when none ran).
        paused_s: time spent paused on an unhealthy database, in seconds.
        pauses: how many pauses began.
        throttled_by: the latest indicator reading that paused the purge, e.g.
            ``replication_lag 70,254,592 bytes > 67,108,864 (standby 'replica1')``; ``None``
            when it never paused.
        health_unreadable: health indicators this role may not read and that were skipped,
            each with the grant that enables it.
        lock_waits: batches found holding a lock another session waited on.
        scan_mode: the order the batches walked the backlog in (``keyset``, ``page_order``;
            ``page_order,keyset`` when the run went on oldest first after a projection, see
            :mod:`~favorites_maintenance.retention.scan`); empty when no batch was prepared.
        scan_reason: why, one sentence (the counts and estimate it was chosen from).
        paced_s: time spent pausing between batches for ``sleep_ratio``, in seconds.
        row_s: time in the batch transactions that deleted rows per row they deleted, in
            seconds (the next run's ``previous_row_s``); ``None`` when no row was deleted.
    """

    cutoff: dt.datetime
    deleted_total: int
    batches: int
    duration_s: float
    stop_reason: StopReason
    batch_max_s: float = 0.0
    skipped_rows: int = 0
    skipped_causes: tuple[str, ...] = ()
    isolation_batches: int = 0
    retried_batches: int = 0
    batch_size_first: int = 0
    batch_size_max: int = 0
    paused_s: float = 0.0
    pauses: int = 0
    throttled_by: str | None = None
    health_unreadable: tuple[str, ...] = ()
    lock_waits: int = 0
    scan_mode: str = ""
    scan_reason: str = ""
    paced_s: float = 0.0
    row_s: float | None = None

    @property
    def duration_ms(self) -> int:
        """:attr:`duration_s` in whole milliseconds."""
        return round(self.duration_s * 1000)

    @property
    def paused_ms(self) -> int:
        """:attr:`paused_s` in whole milliseconds."""
        return round(self.paused_s * 1000)

    @property
    def paced_ms(self) -> int:
        """:attr:`paced_s` in whole milliseconds."""
        return round(self.paced_s * 1000)
