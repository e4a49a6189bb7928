"""The job of a policy that purges its table one partition per step, on a distributed
executor: ``dagster-celery`` with two Celery workers and a real Redis as broker and result
backend, the run's steps landing on both workers, every prunable row deleted and every account
row kept. The executor is configured and the workers are started as docs/dagster.md says ("On
Celery"): the same variables, the same command, the same instance storage.

Needs Debian's ``redis-server`` (``.ci/run`` installs it): without it the test skips locally and
fails under ``CI=true``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.instance_storage import STORAGE_URL_VAR
from favorites_maintenance_tests.helpers.celery import RedisServer, celery_workers, require_redis
# The day the schedule would run now, as the partitioned table's rows are laid out around it.
from favorites_maintenance_tests.helpers.clock import YESTERDAY as PARTITION
from favorites_maintenance_tests.helpers.partitioned import (
    NODE,
    monthly_table,
    partitioned_job,
    partitions_of,
    snapshot,
    spread,
)


def celery_job():
    """The policy's job with Dagster's Celery executor, configured as docs/dagster.md's
    deployment module does (reconstructable: the run and each worker build it)."""
    from dagster_celery import celery_executor

    return partitioned_job().with_executor_def(celery_executor.configured(
        {"broker": {"env": "CELERY_BROKER_URL"}, "backend": {"env": "CELERY_RESULT_BACKEND"}}))


@contextlib.contextmanager
def deployed_instance(storage_url: str, monkeypatch) -> Iterator[dg.DagsterInstance]:
    """An instance whose storage is dagster.yaml's: ``DeployedPostgresStorage`` on
    ``DAGSTER_POSTGRES_URL`` (set here to ``storage_url``), which each worker reads too."""
    monkeypatch.setenv(STORAGE_URL_VAR, storage_url)
    with dg.instance_for_test(overrides={"storage": {"custom": {
            "module": "favorites_maintenance.instance_storage",
            "class": "DeployedPostgresStorage", "config": {}}}}) as instance:
        yield instance


@pytest.fixture
def monthly(engine, db_url, monkeypatch):
    """The table partitioned by month, and the environment the job reads."""
    return monthly_table(engine, db_url, monkeypatch)


def workers_of_steps(instance: dg.DagsterInstance, run_id: str) -> dict[str, str]:
    """Step key -> the Celery worker (node name) that ran it, from the engine event each worker
    writes when it takes a step."""
    found = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        metadata = entry.dagster_event.event_specific_data.metadata or {}
        if "Celery worker" in metadata:
            found[entry.step_key] = metadata["Celery worker"].value
    return found


def test_the_partition_steps_run_on_two_celery_workers(monthly, monkeypatch,
                                                       dagster_storage_url):
    engine, _ = monthly
    before = spread(engine)
    holding = partitions_of(engine, before["prunable"])
    # Each partition's purge takes at least half a second (a statement-level trigger on the
    # table that sleeps on each batch), so that one worker cannot take every step before the
    # other.
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.slow_delete() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$"))
        conn.execute(sa.text("CREATE TRIGGER slow BEFORE DELETE ON favorites.favorites FOR EACH "
                             "STATEMENT EXECUTE FUNCTION favorites.slow_delete()"))

    with RedisServer(require_redis()) as redis:
        # The run's executor and the workers on one Redis, through the documented variables.
        monkeypatch.setenv("CELERY_BROKER_URL", redis.url())
        monkeypatch.setenv("CELERY_RESULT_BACKEND", redis.url())
        # Each worker opens the run's instance from the step's arguments.
        with deployed_instance(dagster_storage_url, monkeypatch) as instance, celery_workers(
                ["first", "second"], broker=redis.url(), backend=redis.url()) as workers:
            with dg.execute_job(dg.reconstructable(celery_job), instance=instance,
                                tags={"dagster/partition": PARTITION}) as result:
                assert result.success
                run_id = result.run_id
            ran_on = workers_of_steps(instance, run_id)

    purges = {key: worker for key, worker in ran_on.items()
              if key.startswith(f"{NODE}.purge_partition[")}
    assert {key[len(f"{NODE}.purge_partition["):-1] for key in purges} == {
        name.removeprefix("favorites.") for name in holding}
    # Steps landed on both workers, and every step of the run ran on one of them.
    assert set(purges.values()) == set(workers)
    assert f"{NODE}.measure_backlog" in ran_on
    after = snapshot(engine)
    assert after["prunable"] == set()
    assert after["accounts"] == before["accounts"]
    assert after["recent"] == before["recent"]
