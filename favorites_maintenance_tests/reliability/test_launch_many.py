"""One schedule tick that starts every policy of a code location at once: under the
repository's ``dagster.yaml`` (pools at run granularity, one run per database by tag), the run
queue admits one run per database at a time, every run gets its turn and succeeds, and the
queue drains.

Six policies on three databases of the session's server (two each, a table of their own;
the first database also holds the real ``guest_favorites``), served by a code server process
as ``dagster-daemon`` serves a location; the scheduler and the run queue run one real pass at
a time, the runs in run worker processes the code server starts.
"""

from __future__ import annotations

import datetime as dt
import time

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.bench.launch import KEPT_ROWS, create_policy_table
from favorites_maintenance.components.policy_tree import load_policies
from favorites_maintenance.config.policy import DATABASE_TAG
from favorites_maintenance.config.policy_settings import DEFAULT_CRON
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.jobs import guest_settings_env
from favorites_maintenance_tests.helpers.policies import policy_sandbox
from favorites_maintenance_tests.reliability.test_policy_databases import (
    _instance_settings,
    text,
)

UTC = dt.timezone.utc
#: The tick every schedule fires on (the default cron's 03:00): it runs 2026-06-15.
TICK = dt.datetime(2026, 6, 16, 3, 0, tzinfo=UTC)
PER_DATABASE = 2


def _policy(number: int, variable: str) -> dict:
    return {"name": f"policy_{number:02d}", "table": f"bench.policy_{number:02d}",
            "key_column": "id", "age_column": "updated_at", "null_columns": ["user_id"],
            "partitions_start": "2026-01-01", "cron": DEFAULT_CRON,
            "target_batch_duration": "PT0S", "database_url_env": variable}


def _table_rows(url: sa.URL, tables: list[str]) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {t: conn.execute(sa.select(sa.func.count()).select_from(
                sa.table(t.split(".")[1], schema=t.split(".")[0]))).scalar() for t in tables}
    finally:
        engine.dispose()


def test_one_tick_of_every_policy_runs_one_per_database_and_drains(
        pg_server, db_url, dagster_storage_url, monkeypatch):
    """Seven runs queued by one tick: the first pass of the queue starts one per database, no
    two runs of a database overlap, every run succeeds, and each table keeps exactly the rows
    the rule keeps."""
    from favorites_maintenance_tests.helpers.daemon import (
        code_location,
        dequeue_pass,
        pg_instance,
        scheduler_pass,
    )

    variables = [DATABASE_URL_VAR, "FAVORITES_LAUNCH_SECOND_URL", "FAVORITES_LAUNCH_THIRD_URL"]
    urls = [db_url, *(pg_server.ensure_database(f"{db_url.database}_{n}") for n in (2, 3))]
    policies, tables = [], {v: [] for v in variables}
    for number in range(1, PER_DATABASE * len(variables) + 1):
        variable = variables[(number - 1) % len(variables)]
        policies.append(_policy(number, variable))
        tables[variable].append(f"bench.policy_{number:02d}")
    for variable, url in zip(variables, urls):
        monkeypatch.setenv(variable, text(url))
        engine = create_engine(url)
        for table in tables[variable]:
            create_policy_table(engine, table, TICK)
        engine.dispose()
    guest_settings_env(monkeypatch, target_batch_duration=dt.timedelta(0))
    try:
        with policy_sandbox(*policies) as sandbox, \
                pg_instance(dagster_storage_url, overrides=_instance_settings()) as instance, \
                code_location(instance, sandbox.location_target()) as workspace:
            with sandbox.tree() as tree:
                pools = {pool for policy in load_policies(tree) for pool in policy.pools}
            for pool in pools:  # as a deployment sets them once
                instance.event_log_storage.set_concurrency_slots(pool, 1)
            # The scheduler alone: no sensor acts on a queued run, and each pass would evaluate
            # every policy's sensors in the code server.
            scheduler_pass(workspace, TICK - dt.timedelta(minutes=1))
            scheduler_pass(workspace, TICK)  # every schedule's 03:00 tick
            queued = instance.get_runs()
            # Every policy's run, the guest policy's too, waiting in the queue.
            assert len(queued) == len(policies) + 1
            assert {r.status for r in queued} == {dg.DagsterRunStatus.QUEUED}

            dequeue_pass(workspace)
            left = [r for r in instance.get_runs() if r.status != dg.DagsterRunStatus.QUEUED]
            # One run per database left the queue in the first pass.
            assert sorted(r.tags[DATABASE_TAG] for r in left) == sorted(variables)

            deadline = time.monotonic() + 150  # the queue drains, or the test fails
            while not all(r.is_finished for r in instance.get_runs()):
                assert time.monotonic() < deadline, [r.status for r in instance.get_runs()]
                time.sleep(0.5)
                dequeue_pass(workspace)
            records = instance.get_run_records()
        left_rows = {v: _table_rows(url, tables[v]) for v, url in zip(variables, urls)}
    finally:
        for url in urls[1:]:
            pg_server.drop_database(url.database)

    assert {r.dagster_run.status for r in records} == {dg.DagsterRunStatus.SUCCESS}
    by_database: dict[str, list] = {}
    for record in records:
        by_database.setdefault(record.dagster_run.tags[DATABASE_TAG], []).append(record)
    assert sorted(by_database) == sorted(variables)
    for variable, runs in by_database.items():
        runs.sort(key=lambda r: r.start_time)
        # A run of the database started only once the one before it had ended.
        for before, after in zip(runs, runs[1:]):
            assert after.start_time >= before.end_time, variable
    # Every prunable row deleted, every row the rule keeps still there.
    assert left_rows == {v: {t: KEPT_ROWS for t in tables[v]} for v in variables}
