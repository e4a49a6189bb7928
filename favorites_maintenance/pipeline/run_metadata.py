"""How a run's record becomes Dagster metadata, and is read back from it.

:class:`RunMetadata` is mixed into :class:`~favorites_maintenance.pipeline.run_report.
RunReport`: the materialization (or, after a failure or a stop, an observation) records
:meth:`RunMetadata.as_metadata`; the checks, the command line and the retry accounting read it
back with :meth:`RunMetadata.from_metadata`. The metadata keys (``deletedTotal``, ``batches``,
...; :data:`KEYS`) are a contract: dashboards and alerts read them.

A run over a range of days records its figures on the last day and a reference on each earlier
one (:meth:`RunMetadata.range_metadata`), so that summing a key over the range counts the run
once.

This module imports no Dagster: metadata values are read through their ``value`` attribute
when they have one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Self

from favorites_maintenance.config.names import BACKLOG_OLDEST_PREFIX

#: What a record holds for a text figure with nothing to name (no cause, no reading).
NONE = "none"
#: Metadata key of a range run's records: the range, ``first...last``.
RANGE_KEY = "partitionRange"
#: Metadata key of a reference: the partition whose record holds the run's figures.
ATTRIBUTED_KEY = "attributedTo"

#: Field of the record -> metadata key.
KEYS = {
    "deleted_total": "deletedTotal",
    "batches": "batches",
    "duration_ms": "durationMs",
    "batch_max_ms": "batchMaxMs",
    "cutoff": "cutoff",
    "retention_days": "retentionDays",
    "batch_size": "batchSize",
    "batch_size_mode": "batchSizeMode",
    "stop_reason": "stopReason",
    "skipped_rows": "skippedRows",
    "skipped_causes": "skippedCauses",
    "isolation_batches": "isolationBatches",
    "batch_size_first": "batchSizeFirst",
    "batch_size_max": "batchSizeMax",
    "paused_ms": "pausedMs",
    "paced_ms": "pacedMs",
    "scan_mode": "scanMode",
    "scan_reason": "scanReason",
    "throttled_by": "throttledBy",
    "health_unreadable": "healthUnreadable",
    "backlog_remaining": "backlogRemaining",
    "held_rows": "heldRows",
    "archive_deleted_total": "archiveDeletedTotal",
    "archive_rows": "archiveRows",
    "partitions_detached": "partitionsDetached",
    "partitions_dropped": "partitionsDropped",
    "ms_per_row": "msPerRow",
}
_BACKLOG = ("backlog_remaining", "backlog_oldest", "backlog_oldest_key")
_ARCHIVE = ("archive_deleted_total", "archive_rows")
#: The drop phase's figures, recorded only for a policy that drops expired partitions.
PARTITION_FIELDS = ("partitions_detached", "partitions_dropped")
#: Figures recorded only when known.
_OPTIONAL = ("ms_per_row", "held_rows")
#: What a reference (:meth:`RunMetadata.as_reference`) records of the run's work.
_WORK_AT_ZERO = {
    "deleted_total": 0,
    "batches": 0,
    "duration_ms": 0,
    "batch_max_ms": 0.0,
    "skipped_rows": 0,
    "skipped_causes": NONE,
    "isolation_batches": 0,
    "batch_size_first": 0,
    "batch_size_max": 0,
    "paused_ms": 0,
    "paced_ms": 0,
    "throttled_by": NONE,
    "ms_per_row": None,
}


class RunMetadata:
    """A run's record (a frozen dataclass whose fields are :data:`KEYS`'s) as Dagster
    metadata and back; mixed into :class:`~favorites_maintenance.pipeline.run_report.
    RunReport`, which documents each field and its key."""

    backlog_remaining: int | None
    backlog_oldest: str | None
    backlog_oldest_key: str
    archive_deleted_total: int | None
    partitions_detached: int | None

    def as_metadata(self) -> dict[str, Any]:
        """The record as Dagster metadata: numbers stay numbers so the UI can plot them; the
        backlog keys only once it was measured, the archive's only for a policy with one, the
        time per row only when the run deleted rows."""
        metadata = {KEYS[f.name]: getattr(self, f.name) for f in dataclasses.fields(self)
                    if f.name not in (*_BACKLOG, *_ARCHIVE, *PARTITION_FIELDS, *_OPTIONAL)}
        for name in (*_ARCHIVE, *PARTITION_FIELDS, *_OPTIONAL):
            if getattr(self, name) is not None:
                metadata[KEYS[name]] = getattr(self, name)
        if self.backlog_remaining is not None:
            metadata["backlogRemaining"] = self.backlog_remaining
            metadata[self.backlog_oldest_key] = self.backlog_oldest or NONE
        return metadata

    def as_reference(self) -> Self:
        """The record of a day a range run covered but whose figures are on another day: every
        measure of the run's work (rows, batches, time, skipped rows, pauses, batch sizes,
        archived rows deleted, partitions detached and dropped) at 0, and no time per row; the
        cutoff, the settings, the stop reason, the backlog and the archive's rows as the run's."""
        archive = {} if self.archive_deleted_total is None else {"archive_deleted_total": 0}
        partitions = ({} if self.partitions_detached is None
                      else {"partitions_detached": 0, "partitions_dropped": 0})
        return dataclasses.replace(self, **_WORK_AT_ZERO, **archive, **partitions)

    def range_metadata(self, partitions: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Partition key -> the metadata of its materialization, for a run over ``partitions``
        (a range, oldest first, at least one).

        The last day holds the run's record; each earlier day a reference
        (:meth:`as_reference`, plus ``attributedTo``: the last day), so that summing a key over
        the range's materializations counts the run once. Every record names the range
        (``partitionRange``: ``first...last``).

        Raises:
            ValueError: ``partitions`` is empty.
        """
        if not partitions:
            raise ValueError("a range run covers at least one partition")
        *earlier, last = partitions
        span = {RANGE_KEY: f"{partitions[0]}...{last}"}
        reference = {**self.as_reference().as_metadata(), **span, ATTRIBUTED_KEY: last}
        return {**{p: dict(reference) for p in earlier}, last: {**self.as_metadata(), **span}}

    @staticmethod
    def is_reference(metadata: Mapping[str, Any]) -> bool:
        """Whether materialization ``metadata`` is a reference to another day's record (see
        :meth:`range_metadata`) rather than a run's own figures."""
        return ATTRIBUTED_KEY in metadata

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Self:
        """Read a record back from metadata written by :meth:`as_metadata` (raw values or
        Dagster ``MetadataValue`` objects). Keys missing from older records take their
        defaults.

        Raises:
            KeyError: ``deletedTotal`` or ``batches`` is missing: not a run's record.
        """
        def value(key: str) -> Any:
            item = metadata[key]
            return getattr(item, "value", item)

        found = {name: value(key) for name, key in KEYS.items() if key in metadata}
        # The one key named after the policy's age column.
        oldest_key = next((key for key in metadata if key.startswith(BACKLOG_OLDEST_PREFIX)),
                          None)
        if oldest_key is not None:
            found.update(backlog_oldest=value(oldest_key), backlog_oldest_key=oldest_key)
        if "deleted_total" not in found or "batches" not in found:
            raise KeyError("deletedTotal and batches")
        return cls(**found)
