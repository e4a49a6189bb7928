"""Op retries on transient database errors, and none on the others, under the executor the job
ships with (in process): in this process, and in a run worker the run queue launched."""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance_tests.helpers.clock import YESTERDAY as PARTITION
from favorites_maintenance_tests.helpers.daemon import (
    code_location,
    dequeue_pass,
    launch_run,
    pg_instance,
    step_processes,
    wait_until_finished,
)
from favorites_maintenance_tests.helpers.jobs import (
    ASSET_KEY,
    JOB,
    failure_text,
    load_code_location,
)

UTC = dt.timezone.utc
OLD = dt.datetime.now(UTC) - dt.timedelta(days=400)


@pytest.fixture
def job(db_url, monkeypatch):
    return load_code_location(db_url, monkeypatch).resolve_job_def(JOB)


def retry_config(max_retries: int) -> dict:
    return {"ops": {"favorites__guest_favorites_cleanup": {"ops": {"purge": {"config": {
        "max_retries": max_retries, "retry_delay_seconds": 0.2}}}}}}


class TableLock:
    """ACCESS EXCLUSIVE on the table (a migration, say), held by the test's own session until
    :meth:`release`, or until the run has been put up for its first retry."""

    def __init__(self, engine):
        self.conn = engine.connect()
        self.conn.begin()
        self.conn.execute(sa.text("LOCK TABLE favorites.favorites IN ACCESS EXCLUSIVE MODE"))

    def release(self):
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()
            self.conn = None

    def release_after_first_retry(self, instance) -> threading.Thread:
        def watch():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                runs = instance.get_runs(limit=1)
                if runs and step_events(instance, runs[0].run_id,
                                        dg.DagsterEventType.STEP_UP_FOR_RETRY):
                    break
                time.sleep(0.05)
            self.release()

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        return thread


def step_events(instance, run_id, event_type):
    return [e for e in instance.all_logs(run_id)
            if e.dagster_event and e.dagster_event.event_type == event_type]


def test_a_lock_timeout_is_retried_and_the_run_then_succeeds(job, engine, rows):
    rows.add_many(300, updated_at=OLD)
    lock = TableLock(engine)  # outlasts the purge's 2 s lock_timeout, released for the retry
    try:
        with dg.instance_for_test() as instance:
            watcher = lock.release_after_first_retry(instance)
            result = job.execute_in_process(partition_key=PARTITION, instance=instance,
                                            run_config=retry_config(3))
            retries = step_events(instance, result.run_id,
                                  dg.DagsterEventType.STEP_UP_FOR_RETRY)
            logs = instance.all_logs(result.run_id)
            warnings = [e.user_message for e in logs
                        if "transient database error" in (e.user_message or "")]
            errors = [e.user_message or e.message for e in logs if e.level >= logging.ERROR]
            watcher.join()
    finally:
        lock.release()
    assert result.success
    assert len(retries) >= 1
    assert "lock_not_available" in warnings[0]
    assert "attempt 1 failed: run_id=" in warnings[0] and "batch_no=0" in warnings[0]
    # A run that succeeded after a retry has no ERROR line: log-based alerts stay quiet.
    assert errors == []
    assert rows.count() == 0


def test_a_run_worker_retries_the_purge_in_its_own_process_and_the_run_succeeds(
        job, engine, rows, dagster_storage_url):
    """As in a deployment: the run queue launches the run in a run worker process of the code
    server (which inherits this environment); the first attempt of the purge times out on the
    lock, the same process runs the second one, and the run's record counts the rows of
    both."""
    rows.add_many(300, updated_at=OLD)
    lock = TableLock(engine)
    try:
        with pg_instance(dagster_storage_url) as instance, code_location(instance) as workspace:
            watcher = lock.release_after_first_retry(instance)
            run_id = launch_run(workspace, JOB, tags={"dagster/partition": PARTITION},
                                run_config=retry_config(3))
            dequeue_pass(workspace)
            run = wait_until_finished(instance, run_id)
            watcher.join()
            retries = step_events(instance, run_id, dg.DagsterEventType.STEP_UP_FOR_RETRY)
            restarts = step_events(instance, run_id, dg.DagsterEventType.STEP_RESTARTED)
            workers = step_processes(instance, run_id)
            [mat] = step_events(instance, run_id, dg.DagsterEventType.ASSET_MATERIALIZATION)
    finally:
        lock.release()
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert [e.step_key for e in retries] == ["favorites__guest_favorites_cleanup.purge"]
    assert [e.step_key for e in restarts] == ["favorites__guest_favorites_cleanup.purge"]
    [worker] = workers  # both attempts, and every other step, in the run worker
    assert worker != os.getpid()
    materialization = mat.dagster_event.step_materialization_data.materialization
    assert materialization.asset_key == ASSET_KEY
    assert materialization.metadata["deletedTotal"].value == 300
    assert rows.count() == 0


def test_retries_run_out_and_the_run_fails(job, engine, rows):
    rows.add_many(10, updated_at=OLD)
    lock = TableLock(engine)  # held through every attempt
    try:
        with dg.instance_for_test() as instance:
            result = job.execute_in_process(partition_key=PARTITION, instance=instance,
                                            run_config=retry_config(1), raise_on_error=False)
            retries = step_events(instance, result.run_id,
                                  dg.DagsterEventType.STEP_UP_FOR_RETRY)
            ours = [(e.level, e.user_message) for e in instance.all_logs(result.run_id)
                    if "failed: run_id=" in (e.user_message or "")]
    finally:
        lock.release()
    assert not result.success
    assert len(retries) == 1
    # The first attempt's failure is a retry (WARNING), the last one's the run's (ERROR).
    [(retry_level, retry_line), (failed_level, failed_line)] = ours
    assert retry_level == logging.WARNING and retry_line.startswith("transient database error")
    assert failed_level == logging.ERROR and failed_line.startswith("run failed: ")
    assert "lock_not_available" in failed_line
    assert rows.count() == 10


def test_a_missing_table_is_not_retried(job, engine):
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE favorites.favorites"))
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(partition_key=PARTITION, instance=instance,
                                        run_config=retry_config(3), raise_on_error=False)
        retries = step_events(instance, result.run_id, dg.DagsterEventType.STEP_UP_FOR_RETRY)
    assert not result.success
    assert retries == []



@pytest.mark.parametrize("op", ["compute_cutoff", "purge"])
def test_retries_the_op_refuses_fail_it_at_its_start_whatever_the_database_does(job, rows, op):
    """Dagster's schema of the run config takes any integer (or null): the op itself refuses a
    negative one, before it reads the database, not only once a transient error asks it."""
    rows.add_many(5, updated_at=OLD)
    run_config = {"ops": {"favorites__guest_favorites_cleanup": {"ops": {op: {"config": {
        "max_retries": -1}}}}}}
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(partition_key=PARTITION, instance=instance,
                                        run_config=run_config, raise_on_error=False)
    assert not result.success
    assert [e.step_key for e in result.all_events if e.is_step_failure] == [
        f"favorites__guest_favorites_cleanup.{op}"]
    assert "max_retries" in failure_text(result)
    assert "greater than or equal to 0" in failure_text(result)
    assert rows.count() == 5
