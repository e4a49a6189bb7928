"""The only module of the package that imports Dagster's private API (``dagster._...``): each
name below is what Dagster 1.13 offers no public way to do, said with the reason, so that an
upgrade of Dagster is checked here and nowhere else.

- :func:`capture_interrupts`, :func:`check_captured_interrupt`: Dagster turns a run's
  termination (SIGTERM to the run worker) into an interrupt; the purge defers it to the end of
  the batch in flight, commits or rolls back, records its metadata and then ends the step
  CANCELED, instead of being cut mid-transaction.
- :func:`get_current_datetime`: the clock Dagster's schedules read (frozen in Dagster's own
  time tests), compared with the database server's.
- :data:`PUSHING_EVENT_LOG_STORAGES`: the event log storages whose ``watch`` pushes events (the
  SQLite ones); the PostgreSQL one polls on a thread and is not watched.
- :class:`AssetCheckEvaluationTargetMaterializationData`: links a partition's check result to
  the materialization it judged, for checks evaluated inside the cleanup step.
- :class:`InstigatorType`, :class:`TickStatus`: read a schedule's tick history.
- :class:`ConfigurableClassData`: the instance builds a storage class from ``dagster.yaml``
  with it.
- :data:`POOL_TAG_PREFIX`: the run tag that says a run holds a pool (run granularity).
- :class:`DagsterUserCodeProcessError`, :class:`SerializableErrorInfo`: a code location's load
  error shown as its message alone, without a stack (raised by the component, so any project's
  stock loader shows it so: :class:`~favorites_maintenance.components.load_errors.
  PolicyLocationError`).
"""

from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.errors import DagsterUserCodeProcessError
from dagster._core.scheduler.instigation import InstigatorType, TickStatus
from dagster._core.storage.event_log import (
    ConsolidatedSqliteEventLogStorage,
    SqliteEventLogStorage,
)
from dagster._core.storage.tags import POOL_TAG_PREFIX
from dagster._serdes.config_class import ConfigurableClassData
from dagster._time import get_current_datetime
from dagster._utils.error import SerializableErrorInfo
from dagster._utils.interrupts import capture_interrupts, check_captured_interrupt

PUSHING_EVENT_LOG_STORAGES = (SqliteEventLogStorage, ConsolidatedSqliteEventLogStorage)

__all__ = [
    "POOL_TAG_PREFIX",
    "PUSHING_EVENT_LOG_STORAGES",
    "AssetCheckEvaluationTargetMaterializationData",
    "ConfigurableClassData",
    "DagsterUserCodeProcessError",
    "InstigatorType",
    "SerializableErrorInfo",
    "TickStatus",
    "capture_interrupts",
    "check_captured_interrupt",
    "get_current_datetime",
]
