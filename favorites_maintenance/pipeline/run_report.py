"""What one cleanup run did, as one typed record.

:class:`RunReport` is what the purge op hands to ``measure_backlog``, what the materialization
(or, after a failure or a stop, an observation) records, and what the checks, the command line
and the retry accounting read back. Here: its fields, and how the records of a purge, of a
run's partition steps and of its attempts are made and combined. How it becomes Dagster
metadata and is read back (:meth:`RunReport.as_metadata`, :meth:`RunReport.from_metadata`; the
keys are a contract: dashboards and alerts read them):
:mod:`~favorites_maintenance.pipeline.run_metadata`.

This module imports no Dagster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from favorites_maintenance.config.policy_settings import PolicySettings
from favorites_maintenance.pipeline.run_metadata import NONE, PARTITION_FIELDS, RunMetadata
from favorites_maintenance.retention.report import PurgeReport, StopReason


@dataclass(frozen=True)
class RunReport(RunMetadata):
    """The record of one cleanup run (or of the attempts of its purge so far).

    Attributes (metadata key in brackets):
        deleted_total: rows deleted, all attempts together [``deletedTotal``].
        batches: batch transactions that deleted rows, all attempts together [``batches``].
        duration_ms: wall time of the purge, milliseconds [``durationMs``].
        batch_max_ms: the longest batch transaction, milliseconds [``batchMaxMs``].
        cutoff: the run's cutoff, ISO 8601 UTC [``cutoff``].
        retention_days: the policy's retention [``retentionDays``].
        batch_size: rows of the first batch [``batchSize``].
        batch_size_mode: how the run sized its batches: ``fixed`` (none above
            ``batch_size``), ``capped`` (adapting up to an explicit ``batch_size_max``) or
            ``adaptive`` (adapting up to the default max); empty in records older than it
            [``batchSizeMode``].
        stop_reason: why the purge ended (``exhausted``, ``max_run_duration``,
            ``stop_requested``, ``db_unhealthy``) [``stopReason``].
        skipped_rows: prunable rows left in place because deleting them failed
            [``skippedRows``].
        skipped_causes: the causes of the skipped rows, ``"; "``-joined, or ``none``
            [``skippedCauses``].
        isolation_batches: transactions spent isolating failing rows [``isolationBatches``].
        batch_size_first: the first batch's size, rows [``batchSizeFirst``].
        batch_size_max: the largest batch, rows [``batchSizeMax``].
        paused_ms: time paused on an unhealthy database, milliseconds [``pausedMs``].
        paced_ms: time paused between batches for ``sleep_ratio``, milliseconds
            [``pacedMs``].
        scan_mode: the order the batches walked the backlog in: ``keyset`` (oldest first,
            over the rule's index), ``page_order`` (heap pages in address order), or
            ``page_order,keyset`` (page order, then oldest first when the run fell behind its
            budget); empty in records older than it [``scanMode``].
        scan_reason: why, one sentence with the counts it was chosen from [``scanReason``].
        throttled_by: the reading that paused the purge last, or ``none`` [``throttledBy``].
        health_unreadable: indicators skipped for want of a grant, or ``none``
            [``healthUnreadable``].
        backlog_remaining: rows the rule still matches after the run; ``None`` before it is
            measured [``backlogRemaining``].
        backlog_oldest: the age column of the oldest of them, ISO 8601, or ``none``
            [``backlogOldest<Age>``, after the policy's age column: ``backlogOldestUpdatedAt``
            for ``updated_at``].
        backlog_oldest_key: the key ``backlog_oldest`` is recorded under
            (:attr:`~favorites_maintenance.config.names.PolicyNames.backlog_oldest_key`); empty
            until the backlog is measured.
        held_rows: for a policy with a hold table, the rows its guard and age admit that an
            active hold keeps, counted with the backlog and not in it (never their values);
            ``None`` for a policy without holds [``heldRows``].
        archive_deleted_total: with an archive, its rows past ``archive_retention_days``
            deleted after the purge; ``None`` for a policy without an archive
            [``archiveDeletedTotal``].
        archive_rows: with an archive, the policy's rows it holds after the run (the purge's
            moved rows included); ``None`` without one [``archiveRows``].
        partitions_detached: with ``drop_expired_partitions``, the partitions the run
            detached (their rows counted in ``deleted_total``); ``None`` without it
            [``partitionsDetached``].
        partitions_dropped: with ``drop_expired_partitions``, the detached tables the run
            dropped; ``None`` without it [``partitionsDropped``].
        ms_per_row: time in the batch transactions that deleted rows per row they deleted,
            milliseconds: what the next run sizes its first batch from; ``None`` (no key) when
            the run deleted no row, and in a reference [``msPerRow``].

    With an archive, ``deleted_total`` counts the rows moved into it.
    """

    deleted_total: int
    batches: int
    duration_ms: int = 0
    batch_max_ms: float = 0.0
    cutoff: str = ""
    retention_days: int = 0
    batch_size: int = 0
    batch_size_mode: str = ""
    stop_reason: str = ""
    skipped_rows: int = 0
    skipped_causes: str = NONE
    isolation_batches: int = 0
    batch_size_first: int = 0
    batch_size_max: int = 0
    paused_ms: int = 0
    paced_ms: int = 0
    scan_mode: str = ""
    scan_reason: str = ""
    throttled_by: str = NONE
    health_unreadable: str = NONE
    backlog_remaining: int | None = None
    backlog_oldest: str | None = None
    backlog_oldest_key: str = ""
    held_rows: int | None = None
    archive_deleted_total: int | None = None
    archive_rows: int | None = None
    partitions_detached: int | None = None
    partitions_dropped: int | None = None
    ms_per_row: float | None = None

    @classmethod
    def of_purge(cls, report: PurgeReport, settings: PolicySettings) -> "RunReport":
        """The record of one purge (one attempt) under ``settings``."""
        return cls(
            deleted_total=report.deleted_total,
            batches=report.batches,
            duration_ms=report.duration_ms,
            batch_max_ms=round(report.batch_max_s * 1000, 1),
            cutoff=report.cutoff.isoformat(),
            retention_days=settings.retention_days,
            batch_size=settings.batch_size,
            batch_size_mode=settings.batch_size_mode.value,
            stop_reason=report.stop_reason.value,
            skipped_rows=report.skipped_rows,
            skipped_causes="; ".join(report.skipped_causes) or NONE,
            isolation_batches=report.isolation_batches,
            batch_size_first=report.batch_size_first,
            batch_size_max=report.batch_size_max,
            paused_ms=report.paused_ms,
            paced_ms=report.paced_ms,
            scan_mode=report.scan_mode,
            scan_reason=report.scan_reason,
            throttled_by=report.throttled_by or NONE,
            health_unreadable="; ".join(report.health_unreadable) or NONE,
            ms_per_row=None if report.row_s is None else round(report.row_s * 1000, 6),
        )

    @classmethod
    def combined(cls, reports: Sequence["RunReport"], *, cutoff: str,
                 settings: PolicySettings, duration_ms: int) -> "RunReport":
        """The record of one run that purged a table one partition per step: ``reports`` (one
        per partition step, each counting its own retries) summed, each row and batch counted
        once.

        Rows, batches, skipped rows, isolation transactions and pauses add up; the longest
        batch and the largest batch size are the largest of any step; the causes and readings
        are each named once; the time per row is the steps' weighted by their rows.
        ``duration_ms`` is the run's wall time from the plan to the last
        step, milliseconds (the steps overlap, so their durations do not add up). The stop
        reason is the one that left rows behind, if a step stopped early (``db_unhealthy``
        before ``max_run_duration``), else ``exhausted``. No report (nothing to purge): zero
        rows, zero batches, ``exhausted``.
        """
        def names(values) -> str:
            found = sorted({part for value in values if value != NONE
                            for part in value.split("; ")})
            return "; ".join(found) or NONE

        stops = {r.stop_reason for r in reports}
        stop = next((reason.value for reason in _EARLY_STOPS if reason.value in stops),
                    StopReason.EXHAUSTED.value)
        return cls(
            deleted_total=sum(r.deleted_total for r in reports),
            batches=sum(r.batches for r in reports),
            duration_ms=duration_ms,
            batch_max_ms=max((r.batch_max_ms for r in reports), default=0.0),
            cutoff=cutoff,
            retention_days=settings.retention_days,
            batch_size=settings.batch_size,
            batch_size_mode=settings.batch_size_mode.value,
            stop_reason=stop,
            skipped_rows=sum(r.skipped_rows for r in reports),
            skipped_causes=names(r.skipped_causes for r in reports),
            isolation_batches=sum(r.isolation_batches for r in reports),
            batch_size_first=max((r.batch_size_first for r in reports), default=0),
            batch_size_max=max((r.batch_size_max for r in reports), default=0),
            paused_ms=sum(r.paused_ms for r in reports),
            throttled_by=names(r.throttled_by for r in reports),
            health_unreadable=names(r.health_unreadable for r in reports),
            ms_per_row=_ms_per_row(reports),
        )

    def after(self, earlier: "RunReport | None") -> "RunReport":
        """This attempt's record with the rows, batches and partitions of ``earlier`` attempts
        added (the time per row: both attempts', weighted by their rows)."""
        if earlier is None:
            return self
        partitions = {name: (getattr(self, name) or 0) + getattr(earlier, name)
                      for name in PARTITION_FIELDS if getattr(earlier, name) is not None}
        return dataclasses.replace(self, deleted_total=self.deleted_total + earlier.deleted_total,
                                   batches=self.batches + earlier.batches,
                                   ms_per_row=_ms_per_row((self, earlier)), **partitions)

    def with_backlog(self, remaining: int, oldest: str | None, held: int | None = None, *,
                     oldest_key: str) -> "RunReport":
        """The record with the backlog measured after the purge (``oldest``: ISO 8601 or
        ``None`` when nothing is left, recorded under ``oldest_key``, the policy's
        :attr:`~favorites_maintenance.config.names.PolicyNames.backlog_oldest_key`; ``held``:
        rows an active hold keeps, for a policy with holds, else ``None``)."""
        return dataclasses.replace(self, backlog_remaining=remaining,
                                   backlog_oldest=oldest or NONE, held_rows=held,
                                   backlog_oldest_key=oldest_key)

    def with_archive(self, deleted_total: int, rows: int) -> "RunReport":
        """The record with the archive's figures after its retention ran (rows)."""
        return dataclasses.replace(self, archive_deleted_total=deleted_total, archive_rows=rows)

    def with_partitions(self, detached: int, dropped: int, rows: int) -> RunReport:
        """The record with the drop phase's figures: partitions detached and dropped, and the
        ``rows`` of the detached ones added to ``deleted_total``."""
        return dataclasses.replace(self, deleted_total=self.deleted_total + rows,
                                   partitions_detached=detached, partitions_dropped=dropped)


def _ms_per_row(reports: Sequence[RunReport]) -> float | None:
    """The time per row of ``reports`` together: each one's weighted by the rows it deleted;
    ``None`` when none deleted rows and recorded its time per row."""
    timed = [r for r in reports if r.ms_per_row is not None and r.deleted_total > 0]
    rows = sum(r.deleted_total for r in timed)
    if not rows:
        return None
    return round(sum(r.ms_per_row * r.deleted_total for r in timed) / rows, 6)


#: The stop reasons that leave prunable rows behind, the one a combined record names first.
_EARLY_STOPS = (StopReason.DB_UNHEALTHY, StopReason.MAX_RUN_DURATION)
