"""A policy per database: ``database_url_env`` names the variable holding a policy's URL, one
resource serves each variable, and each policy's runs delete, check and fail on its own
database only. Two databases of the test server, each holding the dev table; the policies are
loaded the way the code location loads them, from a defs folder holding the real
``guest_favorites`` policy and the policies written here.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os

import dagster as dg
import pytest
from click.testing import CliRunner

from favorites_maintenance.components.load_errors import PolicyLoadError
from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.config.policy import DATABASE_TAG
from favorites_maintenance.local.guest_favorites import create_dev_schema
from favorites_maintenance.pipeline.resources import AlertSink
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.clock import FRESH, OLD, PARTITION
from favorites_maintenance_tests.helpers.jobs import (
    guest_settings_env,
    purge_retries,
    run_report,
)
from favorites_maintenance_tests.helpers.policies import (
    favorites_policy,
    policy_sandbox,
)
from favorites_maintenance_tests.helpers.resource_keys import DATABASE_KEY
from favorites_maintenance_tests.helpers.sensors import react_to_failures
from favorites_maintenance_tests.pipeline.test_sensors import Webhook

UTC = dt.timezone.utc
SECOND_VAR = "FAVORITES_SECOND_DATABASE_URL"
SECOND_KEY = "favorites_maintenance_favorites_second_database_url"
#: A password the URLs carry (the test server trusts its socket, so it is never checked).
PASSWORD = "pw-SECOND-db-41c9"
_counter = itertools.count()

SECOND = favorites_policy("second_favorites", database_url_env=SECOND_VAR, batch_size=50)
#: A second policy on the default database: it shares the resource of guest_favorites.
CARTS = {"name": "guest_carts", "table": "carts.guest_carts", "key_column": "cart_uuid",
         "age_column": "touched_at", "null_columns": ["customer_ref"], "retention_days": 30}


@pytest.fixture
def second_url(pg_server):
    """URL (with :data:`PASSWORD`) of a second database holding the dev table."""
    name = f"second{os.getpid()}_{next(_counter)}"
    url = pg_server.ensure_database(name)
    engine = create_engine(url)
    create_dev_schema(engine)
    engine.dispose()
    yield url.set(password=PASSWORD)
    pg_server.drop_database(name)


@pytest.fixture
def second_rows(second_url):
    engine = create_engine(second_url)
    yield Rows(engine)
    engine.dispose()


@pytest.fixture
def env(db_url, second_url, monkeypatch):
    """Both variables set, the guest-favorites policy at its defaults with fixed batches."""
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.set(password=PASSWORD)
                       .render_as_string(hide_password=False))
    monkeypatch.setenv(SECOND_VAR, second_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch, target_batch_duration=dt.timedelta(0))
    return monkeypatch


def fill(rows: Rows) -> tuple[set[int], set[int]]:
    """Old guest rows (prunable), and the rows that stay: fresh guests, old accounts."""
    old = set(rows.add_many(120, updated_at=OLD))
    kept = set(rows.add_many(15, updated_at=FRESH)) | set(
        rows.add_many(10, updated_at=OLD, user_id=4))
    return old, kept


def test_each_policy_deletes_and_checks_only_in_the_database_its_variable_names(
        env, engine, rows, second_rows):
    old_first, kept_first = fill(rows)
    _, kept_second = fill(second_rows)
    with engine.begin() as conn:  # a second policy on the first database
        conn.exec_driver_sql("CREATE SCHEMA carts; CREATE TABLE carts.guest_carts ("
                             "cart_uuid uuid PRIMARY KEY DEFAULT gen_random_uuid(), "
                             "customer_ref text, touched_at timestamptz NOT NULL)")
    with policy_sandbox(SECOND, CARTS) as sandbox:
        defs = sandbox.code_location()

    # One resource per variable: guest_favorites and guest_carts share DATABASE_KEY.
    resources = defs.get_repository_def().get_top_level_resources()
    assert {k for k in resources if k.endswith("database_url")} == {DATABASE_KEY, SECOND_KEY}
    jobs = {name: defs.resolve_job_def(f"{name}_cleanup_job")
            for name in ("guest_favorites", "guest_carts", "second_favorites")}
    assert {n: j.tags.get(DATABASE_TAG) for n, j in jobs.items()} == {
        "guest_favorites": DATABASE_URL_VAR, "guest_carts": DATABASE_URL_VAR,
        "second_favorites": SECOND_VAR}
    pools = {}
    for name, job in jobs.items():
        [node] = [n for n in job.graph.node_dict if n.endswith(f"__{name}_cleanup")]
        graph = job.graph.node_named(node).definition
        pools[name] = {graph.node_named(op).definition.pool for op in ("purge", "measure_backlog")}
    assert pools == {
        "guest_favorites": {"guest_favorites_cleanup", "database_favorites_database_url"},
        "guest_carts": {"guest_carts_cleanup", "database_favorites_database_url"},
        "second_favorites": {"second_favorites_cleanup", "database_favorites_second_database_url"}}

    with dg.instance_for_test() as instance:
        second = jobs["second_favorites"].execute_in_process(partition_key=PARTITION,
                                                             instance=instance)
        assert second.success
        assert run_report(second, asset_key=dg.AssetKey(
            ["favorites", "second_favorites_cleanup"])).deleted_total == 120
        # Its checks read its own database: the first one still holds old guest rows, which
        # the overdue-rows check would count.
        checks = second.get_asset_check_evaluations()
        assert len(checks) == 3 and all(c.passed for c in checks), checks
        assert second_rows.ids() == kept_second
        assert rows.ids() == old_first | kept_first

        first = jobs["guest_favorites"].execute_in_process(partition_key=PARTITION,
                                                           instance=instance)
        assert first.success and run_report(first).deleted_total == 120
        assert rows.ids() == kept_first
        assert second_rows.ids() == kept_second
        started = [e.user_message for e in instance.all_logs(second.run_id)
                   if "run started" in (e.user_message or "")]
        assert f"database={SECOND_VAR}" in started[0]


def test_a_launch_may_not_choose_any_policys_database(env, rows, second_rows):
    with policy_sandbox(SECOND) as sandbox:
        defs = sandbox.code_location()
    elsewhere = {"url": "postgresql+psycopg://app:elsewhere-pw@127.0.0.1:9/other"}
    with dg.instance_for_test() as instance:
        for job, key, variable in (("guest_favorites_cleanup_job", DATABASE_KEY, DATABASE_URL_VAR),
                                   ("second_favorites_cleanup_job", SECOND_KEY, SECOND_VAR)):
            with pytest.raises(dg.DagsterInvalidConfigError) as refused:
                defs.resolve_job_def(job).execute_in_process(
                    partition_key=PARTITION, instance=instance,
                    run_config={"resources": {key: {"config": elsewhere}}})
            message = str(refused.value)
            assert f"url refused: the database is not chosen at launch. It is {variable}" \
                in message
            assert "elsewhere-pw" not in message
        assert instance.get_runs() == []


def test_an_unset_variable_refuses_only_the_runs_of_its_policy(env, rows, second_rows):
    old, kept = fill(rows)
    second_old, second_kept = fill(second_rows)
    env.delenv(SECOND_VAR)
    with policy_sandbox(SECOND) as sandbox:
        defs = sandbox.code_location()  # the location loads
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError) as refused:
            defs.resolve_job_def("second_favorites_cleanup_job").execute_in_process(
                partition_key=PARTITION, instance=instance)
        assert instance.get_runs() == []
        assert str(refused.value).startswith(
            f"{SECOND_VAR} is not set: it holds the URL of the database; set it")
        # The other policy runs as ever.
        first = defs.resolve_job_def("guest_favorites_cleanup_job").execute_in_process(
            partition_key=PARTITION, instance=instance)
        assert first.success and run_report(first).deleted_total == len(old)
    assert rows.ids() == kept
    assert second_rows.ids() == second_old | second_kept


def test_the_alert_of_a_run_whose_database_is_down_names_its_variable(env, rows, second_rows):
    """The second server refuses connections: the run's failure alert names the variable, as
    the run's log does, and the other policy's database is untouched."""
    old, kept = fill(rows)
    # Nothing listens on port 1: every connection is refused at once.
    env.setenv(SECOND_VAR, f"postgresql+psycopg://app:{PASSWORD}@127.0.0.1:1/second")
    second_key = dg.AssetKey(["favorites", "second_favorites_cleanup"])
    hook = Webhook()
    try:
        with policy_sandbox(SECOND) as sandbox:
            defs = sandbox.code_location()
        with dg.instance_for_test() as instance:
            down = defs.resolve_job_def("second_favorites_cleanup_job").execute_in_process(
                partition_key=PARTITION, instance=instance, raise_on_error=False,
                run_config=purge_retries(0, asset_key=second_key))
            assert not down.success
            logged = "\n".join(e.user_message for e in instance.all_logs(down.run_id))
            react_to_failures(defs, "favorites_maintenance_failure_sensor", instance,
                              AlertSink(webhook_url=hook.url, attempts=1))
    finally:
        hook.close()
    assert f"run failed: run_id={down.run_id}" in logged and f"database={SECOND_VAR}" in logged
    [alert] = hook.messages
    assert alert.startswith(f"second_favorites cleanup failed: asset {'/'.join(second_key.path)}")
    assert "ConnectError: could not open a session on the database" in alert, alert
    assert alert.endswith(f"; database={SECOND_VAR}."), alert
    assert PASSWORD not in alert
    assert rows.ids() == old | kept


@pytest.mark.parametrize("value", ["mysql://app:pw-SECOND-db-41c9@h/db", "pw-SECOND-db-41c9",
                                   "postgresql+psycopg://app:pw-SECOND-db-41c9@h/"])
def test_a_malformed_url_of_a_policys_variable_stops_the_load_naming_it(env, value):
    env.setenv(SECOND_VAR, value)
    with policy_sandbox(SECOND) as sandbox, pytest.raises(SettingsError) as refused:
        sandbox.code_location()
    assert refused.value.variable == SECOND_VAR
    assert str(refused.value).startswith(f"{SECOND_VAR}: ")
    assert PASSWORD not in str(refused.value)


@pytest.mark.parametrize("value, message", [
    ("{{ env.FAVORITES_SECOND_DATABASE_URL }}",
     ("database_url_env is written as a template; write the variable's name itself "
      "(database_url_env: FAVORITES_SECOND_DATABASE_URL)")),
    ("postgresql+psycopg://app:pw-SECOND-db-41c9@h/db",
     ("database_url_env names the environment variable that holds the database's URL, never "
      "the URL itself")),
    ("second_database_url", "got 'second_database_url'"),
])
def test_database_url_env_names_a_variable_and_never_shows_a_url(env, value, message):
    with policy_sandbox({**SECOND, "database_url_env": value}) as sandbox, \
            pytest.raises(PolicyLoadError) as refused:
        sandbox.code_location()
    assert message in str(refused.value)
    assert "policy 'second_favorites'" in str(refused.value)
    assert PASSWORD not in str(refused.value)


def test_dry_run_counts_in_the_policys_own_database(env, rows, second_rows, monkeypatch):
    from favorites_maintenance.cli import main
    from favorites_maintenance.components import policy_tree

    fill(rows)
    second_rows.add_many(7, updated_at=OLD)
    with policy_sandbox(SECOND) as sandbox, sandbox.tree() as tree:
        monkeypatch.setattr(policy_tree, "component_tree", lambda: tree)
        counted = CliRunner().invoke(main, ["dry-run", "--policy", "second_favorites",
                                            "--partition", PARTITION])
        env.delenv(SECOND_VAR)
        unset = CliRunner().invoke(main, ["dry-run", "--policy", "second_favorites"])
        # The policy on the default variable still works without the other one.
        first = CliRunner().invoke(main, ["dry-run", "--policy", "guest_favorites",
                                          "--partition", PARTITION])
    assert counted.exit_code == 0, counted.output
    assert f"({SECOND_VAR})" in counted.output and "prunable   7 rows" in counted.output
    assert PASSWORD not in counted.output
    assert unset.exit_code == 2
    assert f"{SECOND_VAR}: is not set" in unset.output
    assert first.exit_code == 0 and "prunable   120 rows" in first.output
    assert f"({DATABASE_URL_VAR})" in first.output
