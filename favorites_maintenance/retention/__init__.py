"""The retention core: the rule, the batched purge, the backlog, the archive and restore. No
Dagster import here."""

from favorites_maintenance.retention.archive import ArchiveTarget
from favorites_maintenance.retention.archive_retention import count_overdue_archive, prune_archive
from favorites_maintenance.retention.backlog import Backlog, measure_backlog
from favorites_maintenance.retention.batch_size import BatchSizeController
from favorites_maintenance.retention.errors import (
    ArchiveCountError,
    ArchiveError,
    ArchivePruneError,
    BacklogError,
    BatchError,
    ConnectError,
    ConnectOptionError,
    DatabaseError,
    ErrorKind,
    InvalidArgumentError,
    NoProgressError,
    PurgeError,
    ReplicationRoleError,
    RestoreBatchError,
    RestoreError,
    RetentionError,
    SkippedRowsError,
    StandbyError,
    TableChangedError,
    TableCheckError,
    TableShapeError,
)
from favorites_maintenance.retention.health import HealthLimits, HealthMonitor, Indicator
from favorites_maintenance.retention.purge import purge
from favorites_maintenance.retention.report import BatchResult, PurgeReport, StopReason
from favorites_maintenance.retention.restore import RestoreReport, Selection, restore
from favorites_maintenance.retention.batch_loop import PurgeOptions
from favorites_maintenance.retention.rule import RetentionRule, compute_cutoff
from favorites_maintenance.retention.scan import ScanMode
from favorites_maintenance.retention.table_check import check_table

__all__ = [
    "ArchiveCountError",
    "ArchiveError",
    "ArchivePruneError",
    "ArchiveTarget",
    "Backlog",
    "BacklogError",
    "BatchError",
    "BatchResult",
    "BatchSizeController",
    "ConnectError",
    "ConnectOptionError",
    "DatabaseError",
    "ErrorKind",
    "HealthLimits",
    "HealthMonitor",
    "Indicator",
    "InvalidArgumentError",
    "NoProgressError",
    "PurgeError",
    "PurgeOptions",
    "PurgeReport",
    "ReplicationRoleError",
    "RestoreBatchError",
    "RestoreError",
    "RestoreReport",
    "RetentionRule",
    "RetentionError",
    "ScanMode",
    "Selection",
    "SkippedRowsError",
    "StandbyError",
    "StopReason",
    "TableChangedError",
    "TableCheckError",
    "TableShapeError",
    "check_table",
    "compute_cutoff",
    "count_overdue_archive",
    "measure_backlog",
    "prune_archive",
    "purge",
    "restore",
]
