"""Every private Dagster name the package uses (``pipeline/dagster_internals.py``) in the shape
the package relies on: a Dagster release that moves, renames or reshapes one fails here, by
name, rather than in a run. ``.ci/run`` runs this file on the lowest pinned Dagster too."""

from __future__ import annotations

import datetime as dt
import inspect

import dagster as dg

from favorites_maintenance.pipeline import dagster_internals as internals


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_every_name_of_the_module_imports():
    for name in internals.__all__:
        assert getattr(internals, name) is not None, name


def test_interrupts_are_captured_in_a_block_and_checked_without_arguments():
    assert parameters(internals.capture_interrupts) == []
    assert parameters(internals.check_captured_interrupt) == []
    with internals.capture_interrupts():
        assert internals.check_captured_interrupt() is False


def test_the_process_clock_is_an_aware_instant_in_utc():
    now = internals.get_current_datetime()
    assert now.utcoffset() == dt.timedelta(0)


def test_the_sqlite_event_log_of_a_test_instance_is_one_that_pushes():
    assert all(inspect.isclass(c) and callable(c.watch)
               for c in internals.PUSHING_EVENT_LOG_STORAGES)
    with dg.instance_for_test() as instance:
        assert isinstance(instance.event_log_storage, internals.PUSHING_EVENT_LOG_STORAGES)


def test_a_check_evaluation_links_the_materialization_it_judged():
    target = internals.AssetCheckEvaluationTargetMaterializationData(
        run_id="r", storage_id=1, timestamp=0.0)
    evaluation = dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey("a"), check_name="c", passed=True, partition="2026-01-01",
        target_materialization_data=target)
    assert evaluation.target_materialization_data.run_id == "r"


def test_a_code_process_error_carries_error_infos_without_a_stack():
    info = internals.SerializableErrorInfo(message="PolicyLoadError: x\n", stack=[],
                                           cls_name="PolicyLoadError")
    assert (info.cause, info.context) == (None, None)
    error = internals.DagsterUserCodeProcessError("x", user_code_process_error_infos=[info])
    assert isinstance(error, dg.DagsterError)
    assert error.user_code_process_error_infos == [info]


def test_tick_history_reads_schedules_and_finished_ticks():
    assert {"SCHEDULE", "SENSOR"} <= set(internals.InstigatorType.__members__)
    assert {"STARTED", "SUCCESS", "SKIPPED", "FAILURE"} <= set(
        internals.TickStatus.__members__)


def test_a_storage_class_is_built_from_its_module_class_and_config():
    assert parameters(internals.ConfigurableClassData)[:3] == [
        "module_name", "class_name", "config_yaml"]


def test_the_pool_tag_is_a_prefix_of_the_pool_name():
    assert isinstance(internals.POOL_TAG_PREFIX, str)
    assert internals.POOL_TAG_PREFIX.endswith("/")


def test_every_name_the_tests_drive_of_dagster_imports_in_the_shape_they_call():
    from favorites_maintenance_tests.helpers import dagster_internals as driven

    for name in driven.__all__:
        assert getattr(driven, name) is not None, name
    assert parameters(driven.launch_scheduled_runs)[:4] == [
        "workspace_process_context", "logger", "end_datetime_utc", "iteration_times"]
    assert parameters(driven.execute_sensor_iteration)[:2] == [
        "workspace_process_context", "logger"]
    assert parameters(driven.execute_backfill_iteration)[:2] == [
        "workspace_process_context", "logger"]
    assert parameters(driven.create_test_daemon_workspace_context)[:2] == [
        "workspace_load_target", "instance"]
    target = driven.ModuleTarget(module_name="m", attribute=None, working_directory=None,
                                 location_name="favorites_maintenance")
    assert target.location_name == "favorites_maintenance"
    with driven.QueuedRunCoordinatorDaemon(interval_seconds=1) as daemon:
        assert callable(daemon.run_iteration)
    cursor = driven.RunStatusSensorCursor(record_id=-1).to_json()
    assert '"__class__": "RunStatusSensorCursor"' in cursor
    assert driven.is_valid_cron_string("0 3 * * *") and not driven.is_valid_cron_string("0 3")
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()
    assert next(driven.cron_string_iterator(start, "0 3 * * *", "UTC")) == dt.datetime(
        2026, 1, 1, 3, tzinfo=dt.UTC)
    frozen = dt.datetime(2026, 6, 15, 3, tzinfo=dt.UTC)
    with driven.freeze_time(frozen):
        assert internals.get_current_datetime() == frozen
