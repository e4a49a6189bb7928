"""Termination mid-purge, under the executor the job ships with (in process) and under the
multiprocess executor (a deployment may choose it for a job of its own).

Dagster terminates a run by interrupting its run worker (SIGINT; the multiprocess executor
forwards it to the step processes). The purge must then finish or roll back the open batch
whole, start no other batch, and end CANCELED (never retried, never counted as a success).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import threading
import time

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.components.policy_tree import load_policies
from favorites_maintenance.pipeline.resources import AlertSink
from favorites_maintenance.pipeline.stale_sensor import build_stale_sensor
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import slow_batches
from favorites_maintenance_tests.helpers.clock import YESTERDAY as PARTITION
from favorites_maintenance_tests.helpers.daemon import (
    code_location,
    dequeue_pass,
    launch_run,
    pg_instance,
    step_processes,
    terminate_run,
    wait_until_finished,
)
from favorites_maintenance_tests.helpers.jobs import JOB, POLICY, guest_settings_env
from favorites_maintenance_tests.helpers.resource_keys import ALERTS_KEY

# The stop guarantees are checked one at a time (docs/testing.md).
pytestmark = pytest.mark.xdist_group("stop")

UTC = dt.timezone.utc
ROWS = 200_000
BATCH = 50


def cleanup_job():
    """The job as the code location defines it, from the environment (reconstructable in step
    processes, which inherit it)."""
    from favorites_maintenance.components.policy_tree import code_location

    return code_location().resolve_job_def(JOB)


def multiprocess_cleanup_job():
    """The same job with Dagster's multiprocess executor: a process per step."""
    return cleanup_job().with_executor_def(dg.multiprocess_executor)


def guest_policy():
    """The guest-favorites policy, as the code location reads it from ``defs/``."""
    [policy] = [p for p in load_policies() if p.name == POLICY]
    return policy


@pytest.fixture
def many_old_guests(engine, db_url, monkeypatch):
    """ROWS prunable guest rows, and the environment the job reads."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO favorites.favorites (anonymous_id, item_id, created_at, updated_at) "
            "SELECT gen_random_uuid(), i, now() - interval '400 days' + i * interval '1 second',"
            "       now() - interval '400 days' + i * interval '1 second' "
            "FROM generate_series(1, :n) AS i"), {"n": ROWS})
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    # Every batch BATCH rows: the assertions count whole batches.
    guest_settings_env(monkeypatch, batch_size=BATCH, target_batch_duration=dt.timedelta(0))
    return engine


def remaining(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM favorites.favorites")).scalar_one()


class Terminator(threading.Thread):
    """Terminates the run as the UI's "Terminate" does (the run is marked CANCELING, then its
    worker, this process, gets SIGINT) once the purge has committed a few batches, and notes
    how many rows were gone at that moment."""

    def __init__(self, engine, instance):
        super().__init__(daemon=True)
        self.engine = engine
        self.instance = instance
        self.deleted_at_signal = None

    def run(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            gone = ROWS - remaining(self.engine)
            if gone >= 5 * BATCH:
                [run] = self.instance.get_runs(limit=1)
                self.instance.report_run_canceling(run)
                # Rows gone once the request is recorded: only the batch open now may follow.
                self.deleted_at_signal = ROWS - remaining(self.engine)
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)


def assert_cancelled_cleanly(instance, run_id, engine, deleted_at_request):
    run = instance.get_run_by_id(run_id)
    assert run.status == dg.DagsterRunStatus.CANCELED
    deleted = ROWS - remaining(engine)
    assert deleted_at_request is not None
    # At most the batch open at the request committed after it; nothing started later.
    assert 0 <= deleted - deleted_at_request <= BATCH
    assert deleted % BATCH == 0  # every batch committed whole
    assert deleted < ROWS
    types = [e.dagster_event.event_type for e in instance.all_logs(run_id) if e.dagster_event]
    assert dg.DagsterEventType.STEP_UP_FOR_RETRY not in types
    assert dg.DagsterEventType.ASSET_MATERIALIZATION not in types
    [observation] = [e for e in instance.all_logs(run_id)
                     if e.dagster_event and e.dagster_event.event_type
                     == dg.DagsterEventType.ASSET_OBSERVATION]
    meta = observation.dagster_event.asset_observation_data.asset_observation.metadata
    assert meta["stopReason"].value == "stop_requested"
    assert meta["deletedTotal"].value == deleted
    # The run's log and page say it was a deliberate stop, with the rows it committed.
    logs = instance.all_logs(run_id)
    batches = deleted // BATCH
    stopped = (f"stopped on request after {batches} batches: {deleted} rows deleted and "
               f"committed; the run ends CANCELED")
    assert f"run {stopped} (Dagster shows this step as interrupted" in "\n".join(
        e.user_message for e in logs if not e.dagster_event)
    [failure] = [e.dagster_event for e in logs if e.dagster_event and e.dagster_event.event_type
                 == dg.DagsterEventType.STEP_FAILURE]
    assert failure.step_key.endswith(".purge")
    assert failure.step_failure_data.error.message.strip() == (
        f"dagster._core.errors.DagsterExecutionInterruptedError: {stopped}")
    # The sensor does not count a canceled run as a success.
    policy = guest_policy()
    sensor = build_stale_sensor([policy], clock=lambda: time.time() + 3600)
    watching_since_1970 = json.dumps({"policies": {policy.name: {"since": 0}}})
    ctx = dg.build_sensor_context(instance=instance, cursor=watching_since_1970,
                                  resources={ALERTS_KEY: AlertSink()})
    assert sensor(ctx).skip_message == f"alerted: {policy.name}"
    return deleted


def test_terminate_a_run_the_run_queue_launched_in_a_run_worker(many_old_guests,
                                                                 dagster_storage_url):
    """As in a deployment: the run queue launches the run in a run worker process of the code
    server, which executes every step itself (the executor the job ships with), and the UI's
    "Terminate" reaches that process through the code server. Each batch takes at least
    0.1 s, far longer than the interrupt takes to arrive."""
    engine = many_old_guests
    with slow_batches(engine, 0.1), pg_instance(dagster_storage_url) as instance, \
            code_location(instance) as workspace:
        run_id = launch_run(workspace, JOB, tags={"dagster/partition": PARTITION})
        dequeue_pass(workspace)
        deadline = time.monotonic() + 120
        while ROWS - remaining(engine) < 5 * BATCH and time.monotonic() < deadline:
            time.sleep(0.01)
        terminate_run(workspace, run_id)
        # Rows gone once the request is recorded: only the batch open now may follow.
        deleted_at_request = ROWS - remaining(engine)
        wait_until_finished(instance, run_id)
        # One process ran every step: the run worker, not this one.
        [worker] = step_processes(instance, run_id)
        assert worker != os.getpid()
        assert_cancelled_cleanly(instance, run_id, engine, deleted_at_request)


def test_terminate_under_the_multiprocess_executor(many_old_guests):
    engine = many_old_guests
    with dg.instance_for_test() as instance:
        terminator = Terminator(engine, instance)
        terminator.start()
        with dg.execute_job(dg.reconstructable(multiprocess_cleanup_job), instance=instance,
                            tags={"dagster/partition": PARTITION}) as result:
            run_id = result.run_id
        terminator.join()
        assert len(step_processes(instance, run_id)) > 1  # a process per step
        assert_cancelled_cleanly(instance, run_id, engine, terminator.deleted_at_signal)


def test_terminate_in_process(many_old_guests):
    engine = many_old_guests
    with dg.instance_for_test() as instance:
        terminator = Terminator(engine, instance)
        terminator.start()
        result = cleanup_job().execute_in_process(partition_key=PARTITION, instance=instance,
                                                  raise_on_error=False)
        terminator.join()
        assert_cancelled_cleanly(instance, result.run_id, engine, terminator.deleted_at_signal)



def test_a_request_during_the_last_batch_still_cancels_and_records_it(engine, db_url,
                                                                      monkeypatch):
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO favorites.favorites (anonymous_id, item_id, created_at, updated_at) "
            "SELECT gen_random_uuid(), i, now() - interval '400 days', "
            "now() - interval '400 days' FROM generate_series(1, 50) AS i"))
        # A slow statement-level trigger keeps the one and only batch open for two seconds.
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.slow() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER slow BEFORE DELETE ON favorites.favorites "
            "FOR EACH STATEMENT EXECUTE FUNCTION favorites.slow()"))
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))

    with dg.instance_for_test() as instance:
        def terminate_during_the_batch():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    busy = conn.execute(sa.text(
                        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
                        "AND application_name = 'favorites-maintenance' "
                        "AND (query LIKE 'WITH retention_batch%' "
                        "     OR query LIKE 'DELETE FROM favorites.favorites%')")).scalar_one()
                if busy:
                    [run] = instance.get_runs(limit=1)
                    instance.report_run_canceling(run)
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.05)

        threading.Thread(target=terminate_during_the_batch, daemon=True).start()
        result = cleanup_job().execute_in_process(partition_key=PARTITION, instance=instance,
                                                  raise_on_error=False)
        run = instance.get_run_by_id(result.run_id)
        observations = [e.dagster_event.asset_observation_data.asset_observation.metadata
                        for e in instance.all_logs(result.run_id) if e.dagster_event and
                        e.dagster_event.event_type == dg.DagsterEventType.ASSET_OBSERVATION]
    assert run.status == dg.DagsterRunStatus.CANCELED
    assert remaining(engine) == 0  # the open batch committed whole
    [meta] = observations
    assert meta["deletedTotal"].value == 50
    assert meta["stopReason"].value == "stop_requested"


def test_a_run_marked_canceling_without_an_interrupt_stops_at_the_next_status_read(
        many_old_guests, dagster_storage_url):
    """Dagster's PostgreSQL storage pushes nothing to the step: a launcher that only marks the
    run CANCELING is seen at the purge's next status read (every ``STATUS_EVERY_S``), not
    after the backlog is gone."""
    engine = many_old_guests
    with pg_instance(dagster_storage_url) as instance:
        deleted_at_request = []

        def mark_canceling():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if ROWS - remaining(engine) >= 5 * BATCH:
                    [run] = instance.get_runs(limit=1)
                    instance.report_run_canceling(run)
                    deleted_at_request.append(ROWS - remaining(engine))
                    return
                time.sleep(0.01)

        threading.Thread(target=mark_canceling, daemon=True).start()
        result = cleanup_job().execute_in_process(partition_key=PARTITION, instance=instance,
                                                  raise_on_error=False)
        observations = [e.dagster_event.asset_observation_data.asset_observation.metadata
                        for e in instance.all_logs(result.run_id) if e.dagster_event and
                        e.dagster_event.event_type == dg.DagsterEventType.ASSET_OBSERVATION]
    assert not result.success
    deleted = ROWS - remaining(engine)
    assert deleted_at_request and deleted >= deleted_at_request[0]
    # Stopped by the request: the whole backlog takes far longer than a status read's interval.
    assert deleted < ROWS // 2
    [meta] = observations
    assert meta["stopReason"].value == "stop_requested"
    assert meta["deletedTotal"].value == deleted
