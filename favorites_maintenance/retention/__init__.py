"""The retention core: the rule, the batched purge and the backlog. No Dagster import here."""

from favorites_maintenance.retention.backlog import Backlog, measure_backlog
from favorites_maintenance.retention.batch_size import BatchSizeController
from favorites_maintenance.retention.health import HealthLimits, HealthMonitor, Indicator
from favorites_maintenance.retention.purge import (
    BatchError,
    BatchResult,
    ConnectError,
    NoProgressError,
    PurgeError,
    PurgeReport,
    SkippedRowsError,
    StandbyError,
    StopReason,
    TableCheckError,
    purge,
)
from favorites_maintenance.retention.rule import compute_cutoff, delete_prunable, prunable
from favorites_maintenance.retention.table_check import TableShapeError, check_table

__all__ = [
    "Backlog",
    "BatchError",
    "BatchResult",
    "BatchSizeController",
    "ConnectError",
    "HealthLimits",
    "HealthMonitor",
    "Indicator",
    "NoProgressError",
    "PurgeError",
    "PurgeReport",
    "SkippedRowsError",
    "StandbyError",
    "StopReason",
    "TableCheckError",
    "TableShapeError",
    "check_table",
    "compute_cutoff",
    "delete_prunable",
    "measure_backlog",
    "prunable",
    "purge",
]
