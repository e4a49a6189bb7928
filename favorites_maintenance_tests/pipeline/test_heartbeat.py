"""The heartbeats of a run's steps: a run that is alive keeps beating whatever it is doing, so
``cleanup_dead_run_sensor`` never ends it. (A killed run, ended by the sensor under a real
daemon: ``e2e/test_dead_runs.py``.)"""

from __future__ import annotations

import datetime as dt
import threading
import time

import dagster as dg
import pytest

from favorites_maintenance.pipeline.heartbeat import (
    DEAD_RUN_SENSOR,
    HEARTBEAT_TAG,
    build_dead_run_sensor,
)
from favorites_maintenance_tests.conftest import slow_batches
from favorites_maintenance_tests.helpers.clock import PARTITION
from favorites_maintenance_tests.helpers.jobs import load_code_location, run_partition

UTC = dt.timezone.utc
OLD = dt.datetime(2026, 6, 16, tzinfo=UTC) - dt.timedelta(days=400)


def test_the_code_location_watches_for_dead_runs(db_url, monkeypatch):
    defs = load_code_location(db_url, monkeypatch)
    sensor = defs.resolve_sensor_def(DEAD_RUN_SENSOR)
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert "120 s" in sensor.description  # FAVORITES_RUN_HEARTBEAT_TIMEOUT's default


@pytest.mark.parametrize(("timeout", "interval"), [(None, 30), ("PT30S", 7), ("PT1H", 30)])
def test_the_dead_run_sensor_looks_a_quarter_of_the_timeout_apart(db_url, monkeypatch,
                                                                   timeout, interval):
    """A dead run is ended about one timeout and two ticks after its last heartbeat: a short
    timeout is not held up by ticks as long as the default's (30 s at most)."""
    if timeout is not None:
        monkeypatch.setenv("FAVORITES_RUN_HEARTBEAT_TIMEOUT", timeout)
    defs = load_code_location(db_url, monkeypatch)
    assert defs.resolve_sensor_def(DEAD_RUN_SENSOR).minimum_interval_seconds == interval


def test_a_live_run_silent_for_longer_than_the_timeout_keeps_beating_and_is_not_ended(
        db_url, rows, engine, monkeypatch):
    """One batch of 20 s writes nothing to the run's log, twice the sensor's timeout of 10 s;
    the step's heartbeat (every 3.75 s for the 30 s of FAVORITES_RUN_HEARTBEAT_TIMEOUT) goes
    on, so the sensor, evaluated every second with the real clock, never ends the run."""
    monkeypatch.setenv("FAVORITES_RUN_HEARTBEAT_TIMEOUT", "PT30S")
    old = set(rows.add_many(20, updated_at=OLD))
    defs = load_code_location(db_url, monkeypatch, batch_size=20)
    sensor = build_dead_run_sensor(dt.timedelta(seconds=10))
    done = []
    with slow_batches(engine, 20), dg.instance_for_test() as instance:
        runner = threading.Thread(target=lambda: done.append(
            run_partition(defs, instance, PARTITION, raise_on_error=False)))
        runner.start()
        cursor, watched = None, []
        while runner.is_alive():
            with dg.build_sensor_context(instance=instance, cursor=cursor) as context:
                outcome = sensor(context).skip_message
                cursor = context.cursor
            assert not outcome.startswith("ended"), outcome
            if outcome == "1 runs in progress beating":
                watched.append(time.monotonic())
            time.sleep(1)
        runner.join()
        [result] = done
        run = instance.get_run_by_id(result.run_id)
    # The sensor watched the run for longer than its timeout.
    assert watched and watched[-1] - watched[0] > 10
    assert result.success and run.status == dg.DagsterRunStatus.SUCCESS
    assert HEARTBEAT_TAG in run.tags
    assert not rows.ids() & old
