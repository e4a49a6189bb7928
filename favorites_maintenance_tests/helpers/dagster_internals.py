"""The only test module that imports Dagster's private API (``dagster._...``): what the tests
drive of Dagster that Dagster offers no public way to drive, each name with the reason. The
package's own private names live in ``favorites_maintenance/pipeline/dagster_internals.py``;
these are kept apart because the package never needs them, so that a Dagster release moving
one breaks a test, not ``import favorites_maintenance``. ``pipeline/test_dagster_internals.py``
checks the shape of both.

- :func:`freeze_time`: sets the clock Dagster's scheduler, sensors and
  ``get_current_datetime`` read, for a tick at a chosen instant.
- :func:`create_test_daemon_workspace_context`, :class:`ModuleTarget`,
  :class:`WorkspaceFileTarget`, :class:`WorkspaceProcessContext`: a code location served by a
  code server process, as the daemon and the webserver load it (its load error included).
- :func:`launch_scheduled_runs`, :func:`execute_sensor_iteration`,
  :func:`execute_backfill_iteration`, :class:`QueuedRunCoordinatorDaemon`: one pass of each
  daemon, so a test ticks the scheduler, the sensors, the backfills and the run queue at a
  point it chooses instead of waiting for ``dagster-daemon``.
- :class:`RunStatusSensorCursor`: the cursor a run status sensor starts from.
- :func:`sensor_cursor_command`: ``dagster sensor cursor``, run in this process.
- :func:`cron_string_iterator`, :func:`is_valid_cron_string`: the ticks and the cron strings
  Dagster's scheduler accepts, which the policies' schedules are compared with.
- :func:`loadable_targets_from_python_module`, :func:`repository_def_from_target_def`,
  :class:`LazyDefinitions`: a code location module found and built as Dagster's loader does.
"""

from dagster._cli.sensor import sensor_cursor_command
from dagster._core.definitions.reconstruct import repository_def_from_target_def
from dagster._core.definitions.run_status_sensor_definition import RunStatusSensorCursor
from dagster._core.test_utils import create_test_daemon_workspace_context, freeze_time
from dagster._core.workspace.autodiscovery import loadable_targets_from_python_module
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget, WorkspaceFileTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import (
    QueuedRunCoordinatorDaemon,
)
from dagster._daemon.sensor import execute_sensor_iteration
from dagster._scheduler.scheduler import launch_scheduled_runs
from dagster._utils.schedules import cron_string_iterator, is_valid_cron_string
from dagster._utils.test.definitions import LazyDefinitions

__all__ = [
    "LazyDefinitions",
    "ModuleTarget",
    "QueuedRunCoordinatorDaemon",
    "RunStatusSensorCursor",
    "WorkspaceFileTarget",
    "WorkspaceProcessContext",
    "create_test_daemon_workspace_context",
    "cron_string_iterator",
    "execute_backfill_iteration",
    "execute_sensor_iteration",
    "freeze_time",
    "is_valid_cron_string",
    "launch_scheduled_runs",
    "loadable_targets_from_python_module",
    "repository_def_from_target_def",
    "sensor_cursor_command",
]
