"""The Dagster daemon's own iterations, driven one at a time on a PostgreSQL-backed instance.

The scheduler, the sensor daemon, the backfill daemon and the run queue's daemon each run one
pass over the code location, served by a real code server process (started with this process's
environment, as ``dagster-daemon`` starts it), at an instant the test chooses. A run the queue
launches runs in a run worker process the code server starts, as in a deployment; a test
launches and terminates it through the webserver's GraphQL API, as the UI does. These entry
points are Dagster's own test helpers, not a stable API (``helpers/dagster_internals.py``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time

import dagster as dg

from favorites_maintenance_tests.helpers.dagster_internals import (
    ModuleTarget,
    QueuedRunCoordinatorDaemon,
    create_test_daemon_workspace_context,
    execute_backfill_iteration,
    execute_sensor_iteration,
    freeze_time,
    launch_scheduled_runs,
)

LOCATION = "favorites_maintenance"
REPOSITORY = "__repository__"
LAUNCH_RUN = """
mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }
"""
TERMINATE_RUN = """
mutation($runId: String!) { terminateRun(runId: $runId) { __typename
  ... on TerminateRunFailure { message } ... on PythonError { message } } }
"""
FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
            dg.DagsterRunStatus.CANCELED)
_log = logging.getLogger("favorites_maintenance_tests.helpers.daemon")


@contextlib.contextmanager
def pg_instance(storage_url: str, *, run_in_process: bool = False,
                overrides: dict | None = None):
    """A Dagster instance whose runs, events and ticks live in PostgreSQL at ``storage_url``
    (``postgresql+psycopg2://``). Runs are queued (nothing executes them) unless
    ``run_in_process``: then a launched run executes at once, in this process. ``overrides``
    adds instance settings (e.g. the ``concurrency`` block of ``dagster.yaml``)."""
    overrides = {**(overrides or {}), "storage": {"postgres": {"postgres_url": storage_url}}}
    if run_in_process:
        overrides["run_coordinator"] = {"module": "dagster.core.run_coordinator",
                                        "class": "DefaultRunCoordinator"}
        overrides["run_launcher"] = {"module": "dagster.core.launcher.sync_in_memory_run_launcher",
                                     "class": "SyncInMemoryRunLauncher"}
    else:
        overrides["run_coordinator"] = {"module": "dagster.core.run_coordinator",
                                        "class": "QueuedRunCoordinator"}
    with dg.instance_for_test(overrides=overrides) as instance:
        yield instance


@contextlib.contextmanager
def code_location(instance: dg.DagsterInstance, target: ModuleTarget | None = None):
    """The code location of ``workspace.yaml`` (or of ``target``), served by a code server
    process that inherits this process's environment now (its ``FAVORITES_*`` variables)."""
    target = target or ModuleTarget(module_name="favorites_maintenance.definitions",
                                    attribute=None, working_directory=None,
                                    location_name=LOCATION)
    with create_test_daemon_workspace_context(target, instance) as workspace:
        yield workspace


def scheduler_pass(workspace, at: dt.datetime) -> None:
    """One pass of the scheduler alone, with the clock at ``at`` (no sensor is evaluated)."""
    with freeze_time(at):
        list(launch_scheduled_runs(workspace, _log, at, {}))


def scheduler_and_sensors(workspace, at: dt.datetime) -> None:
    """One pass of the scheduler, then one of the sensor daemon, with the clock at ``at``."""
    scheduler_pass(workspace, at)
    with freeze_time(at):
        list(execute_sensor_iteration(workspace, _log, None, None))


def dequeue_pass(workspace) -> None:
    """One pass of the run queue's daemon: it launches the queued runs the instance's limits
    (pools, ``tag_concurrency_limits``) admit now."""
    with QueuedRunCoordinatorDaemon(interval_seconds=1) as daemon:
        list(daemon.run_iteration(workspace))


def backfill_pass(workspace) -> None:
    """One pass of the backfill daemon (it submits the runs of the next partitions)."""
    list(execute_backfill_iteration(workspace, _log))


def _graphql(workspace, query: str, variables: dict) -> dict:
    from dagster_graphql.test.utils import execute_dagster_graphql

    result = execute_dagster_graphql(workspace.create_request_context(), query, variables)
    assert not result.errors, result.errors
    return result.data


def launch_run(workspace, job: str, *, tags: dict[str, str],
               run_config: dict | None = None, asset: list[str] | None = None) -> str:
    """Launch ``job`` of the code location as the UI's launchpad does (the run is queued);
    return the run's id. With ``asset`` (its key's path), of Dagster's implicit asset job
    ``__ASSET_JOB``, as the asset page's "Materialize" does."""
    selector = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
                "jobName": job}
    if asset is not None:
        selector["assetSelection"] = [{"path": asset}]
    data = _graphql(workspace, LAUNCH_RUN, {"params": {
        "selector": selector,
        "runConfigData": run_config or {},
        "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]}}})
    launched = data["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def terminate_run(workspace, run_id: str, *, succeeds: bool = True) -> dict:
    """Terminate the run as the UI's "Terminate" does: the run is marked CANCELING and its run
    worker is interrupted through the code server. ``succeeds``: Dagster answers that it
    terminated it (else that it could not: no code server runs it). Returns the answer."""
    data = _graphql(workspace, TERMINATE_RUN, {"runId": run_id})["terminateRun"]
    expected = "TerminateRunSuccess" if succeeds else "TerminateRunFailure"
    assert data["__typename"] == expected, data
    return data


def wait_until_finished(instance: dg.DagsterInstance, run_id: str,
                        timeout: float = 180) -> dg.DagsterRun:
    """The run once it has ended (SUCCESS, FAILURE or CANCELED), polled every 0.1 s.

    Raises:
        TimeoutError: it has not ended after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status in FINISHED:
            return run
        time.sleep(0.1)
    raise TimeoutError(f"run {run_id} still {run.status if run else 'missing'} after "
                       f"{timeout:g} s")


def step_processes(instance: dg.DagsterInstance, run_id: str) -> set[int]:
    """The pids of the processes the run's steps started in, retries included (each
    STEP_START or STEP_RESTARTED event carries the pid of the process that wrote it)."""
    starts = {dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_RESTARTED}
    return {entry.dagster_event.pid for entry in instance.all_logs(run_id, of_type=starts)}
