"""Retention policies as data: a second policy, declared in YAML alone, on a table of another
shape (a uuid key, a text guard, other column names), runs beside guest favorites through
Dagster, with its own asset, job, schedule, sensors, checks and pool.

The policies are loaded the way the code location loads them (a defs folder of
``favorites_maintenance.RetentionPolicy`` components), from a sandbox folder holding the real
``guest_favorites/defs.yaml`` and a ``guest_carts/defs.yaml`` written here.
"""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml

from favorites_maintenance.components.policy_tree import PolicyLoadError, load_policies
from favorites_maintenance.components.policy_tree import code_location
from favorites_maintenance.pipeline.failure_sensor import FAILURE_SENSOR
from favorites_maintenance.pipeline.partitions import daily_partitions
from favorites_maintenance.pipeline.resources import AlertSink
from favorites_maintenance.pipeline.stale_sensor import STALE_SENSOR
from favorites_maintenance.pipeline.tick_failure_sensor import TICK_FAILURE_SENSOR
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.carts_policy import ANCHOR, CARTS, write_policy
from favorites_maintenance_tests.helpers.clock import PARTITION
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    materialization,
    purge_retries,
    run_report,
)
from favorites_maintenance_tests.helpers.resource_keys import ALERTS_KEY
from favorites_maintenance_tests.helpers.sensors import react_to_failures


@pytest.fixture
def carts(engine):
    """``carts.guest_carts``: 250 guest carts idle 40 days before the partition's end (30-day
    retention: prunable), 50 customer carts as old, 30 guest carts idle 5 days."""
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE SCHEMA carts;
            CREATE TABLE carts.guest_carts (
                cart_uuid uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                customer_ref text NULL,
                touched_at timestamptz NOT NULL,
                items int NOT NULL DEFAULT 1);
            CREATE INDEX ON carts.guest_carts (touched_at, cart_uuid)
                WHERE customer_ref IS NULL;""")
        insert = sa.text("INSERT INTO carts.guest_carts (customer_ref, touched_at) "
                         "SELECT :ref, :at FROM generate_series(1, :n)")
        conn.execute(insert, {"ref": None, "at": ANCHOR - dt.timedelta(days=40), "n": 250})
        conn.execute(insert, {"ref": "cust-7", "at": ANCHOR - dt.timedelta(days=40), "n": 50})
        conn.execute(insert, {"ref": None, "at": ANCHOR - dt.timedelta(days=5), "n": 30})
    yield
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA carts CASCADE")


def carts_left(engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT coalesce(customer_ref, 'guest') || ':' || "
            "(CASE WHEN touched_at < :cutoff THEN 'old' ELSE 'recent' END), count(*) "
            "FROM carts.guest_carts GROUP BY 1"),
            {"cutoff": ANCHOR - dt.timedelta(days=30)}).all()
    return dict(rows)


def test_a_second_policy_from_yaml_alone_gets_the_whole_surface_under_its_own_names(
        sandbox, carts, rows, engine, db_url, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)  # the guest-favorites policy at its defaults
    write_policy(sandbox.defs_folder_path, CARTS)
    old_guests = set(rows.add_many(40, updated_at=ANCHOR - dt.timedelta(days=400)))
    accounts = set(rows.add_many(10, updated_at=ANCHOR - dt.timedelta(days=400), user_id=3))

    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)

    carts_key = dg.AssetKey(["carts", "guest_carts_cleanup"])
    guest_key = dg.AssetKey(["favorites", "guest_favorites_cleanup"])
    graph = defs.resolve_asset_graph()
    assert graph.get_all_asset_keys() == {carts_key, guest_key}
    assert {c.name for c in graph.asset_check_keys if c.asset_key == carts_key} == {
        "no_row_older_than_retention_plus_one_day", "deleted_total_spike", "no_rows_skipped"}
    assert defs.resolve_job_def("guest_carts_cleanup_job")
    assert defs.resolve_schedule_def("guest_carts_cleanup_schedule").cron_schedule == "15 4 * * *"
    assert defs.resolve_schedule_def("guest_favorites_cleanup_schedule").cron_schedule == \
        "0 3 * * *"
    # One sensor of each kind serves both policies.
    assert {s.name for s in defs.get_repository_def().sensor_defs} == {
        STALE_SENSOR, FAILURE_SENSOR, TICK_FAILURE_SENSOR, "cleanup_dead_run_sensor"}
    carts_job = defs.resolve_job_def("guest_carts_cleanup_job")
    purge_op = carts_job.graph.node_named("carts__guest_carts_cleanup").definition \
        .node_named("purge").definition
    assert purge_op.pool == "guest_carts_cleanup"
    # The global asset job holds both graphs: their ops may not share a definition name.
    assert defs.resolve_implicit_global_asset_job_def()

    with dg.instance_for_test() as instance:
        result = carts_job.execute_in_process(partition_key=PARTITION, instance=instance)
        assert result.success
        run = run_report(result, asset_key=carts_key)
        assert (run.deleted_total, run.batches, run.backlog_remaining) == (250, 3, 0)
        assert (run.retention_days, run.batch_size) == (30, 100)
        assert run.cutoff == (ANCHOR - dt.timedelta(days=30)).isoformat()
        checks = result.get_asset_check_evaluations()
        assert {c.asset_key for c in checks} == {carts_key}
        assert len(checks) == 3 and all(c.passed for c in checks), checks
        # Only the guest carts past retention went; the customers' carts and the favorites
        # table were not touched.
        assert carts_left(engine) == {"cust-7:old": 50, "guest:recent": 30}
        assert rows.ids() == old_guests | accounts

        guest = defs.resolve_job_def("guest_favorites_cleanup_job").execute_in_process(
            partition_key=PARTITION, instance=instance)
        assert guest.success and run_report(guest).deleted_total == 40
        assert rows.ids() == accounts
        assert carts_left(engine) == {"cust-7:old": 50, "guest:recent": 30}

        # The staleness sensor watches each policy's asset on its own: after a run of today's
        # partition of carts (the 2026 day above is a backfill, which does not count), the
        # carts clock starts at that success; the favorites one has seen none.
        today = daily_partitions.get_last_partition_key()
        assert carts_job.execute_in_process(partition_key=today, instance=instance).success
        sent: list[str] = []

        class Sink(AlertSink):
            def send(self, text, *, log=None, level=40):
                sent.append(text)
                return True

        with dg.build_sensor_context(instance=instance, resources={ALERTS_KEY: Sink()},
                                     definitions=defs) as ctx:
            said = defs.resolve_sensor_def(STALE_SENSOR)(ctx).skip_message
            state = json.loads(ctx.cursor)["policies"]
        assert sent == []
        assert said == "fresh: guest_carts, guest_favorites"
        assert state["guest_carts"]["lastSuccess"] is not None
        assert state["guest_favorites"]["lastSuccess"] is None

        # A failed carts run alerts once, naming carts.
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE carts.guest_carts RENAME COLUMN touched_at TO t")
        failed = carts_job.execute_in_process(partition_key=PARTITION, instance=instance,
                                              raise_on_error=False)
        assert not failed.success
        assert "carts.guest_carts has no column 'touched_at'" in failure_text(failed)
        sent.clear()
        assert react_to_failures(defs, FAILURE_SENSOR, instance, Sink()) == [failed.run_id]
        [alert] = sent
        assert alert.startswith("guest_carts cleanup failed: asset carts/guest_carts_cleanup, "
                                "partition 2026-06-15, "), alert
        assert f"run {failed.run_id}: TableShapeError: " in alert


def test_a_guarded_policy_gets_the_generic_check_name_and_keys_after_its_age_column(
        sandbox, carts, engine, db_url, monkeypatch):
    """The names of the guest-favorites policy (``guest row``, ``updated_at``) are its own: a
    guarded policy that names no row noun gets ``row``, and keys after its age column,
    ``touched_at``."""
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    write_policy(sandbox.defs_folder_path, CARTS)
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    carts_key = dg.AssetKey(["carts", "guest_carts_cleanup"])
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("guest_carts_cleanup_job").execute_in_process(
            partition_key=PARTITION, instance=instance,
            run_config=purge_retries(0, asset_key=carts_key), raise_on_error=False)
    assert result.success
    # The run's own record: the oldest left, under the age column's name.
    metadata = materialization(result, asset_key=carts_key)
    assert metadata["backlogOldestTouchedAt"] == "none"
    assert not [k for k in metadata if "UpdatedAt" in k or "Guest" in k], metadata
    [overdue] = [e for e in result.get_asset_check_evaluations()
                 if e.check_name == "no_row_older_than_retention_plus_one_day"]
    assert set(overdue.metadata) == {"overdueRows", "oldestOverdueTouchedAt", "cutoff",
                                     "limit"}
    assert overdue.passed and overdue.metadata["overdueRows"].value == 0


def test_a_policy_s_row_noun_names_its_check_and_keys(sandbox, carts, engine, db_url,
                                                       monkeypatch):
    """``row_noun: guest cart``: the check, its count and the messages say guest carts."""
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    write_policy(sandbox.defs_folder_path, {**CARTS, "row_noun": "guest cart"})
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    carts_key = dg.AssetKey(["carts", "guest_carts_cleanup"])
    assert {c.name for c in defs.resolve_asset_graph().asset_check_keys
            if c.asset_key == carts_key} == {
        "no_guest_cart_older_than_retention_plus_one_day", "deleted_total_spike",
        "no_rows_skipped"}
    # A session holds every guest cart: the run skips them all, and they stay overdue.
    locker = engine.connect()
    locker.begin()
    locker.execute(sa.text("SELECT 1 FROM carts.guest_carts WHERE customer_ref IS NULL "
                           "FOR UPDATE"))
    try:
        with dg.instance_for_test() as instance:
            result = defs.resolve_job_def("guest_carts_cleanup_job").execute_in_process(
                partition_key=PARTITION, instance=instance,
                run_config=purge_retries(0, asset_key=carts_key))
            logs = [e.user_message or "" for e in instance.all_logs(result.run_id)]
    finally:
        locker.close()
    [overdue] = [e for e in result.get_asset_check_evaluations()
                 if e.check_name == "no_guest_cart_older_than_retention_plus_one_day"]
    assert overdue.metadata["overdueGuestCarts"].value == 250
    assert overdue.description.startswith("250 guest carts are older than this run's cutoff")
    cutoff = (ANCHOR - dt.timedelta(days=30)).isoformat()
    assert any(f"nothing to delete: no guest cart older than {cutoff}" in t for t in logs)


def test_a_short_stale_after_still_loads_with_the_shortest_freshness_dagster_takes(sandbox):
    write_policy(sandbox.defs_folder_path, {**CARTS, "stale_after": "PT59S"})
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    spec = defs.resolve_assets_def(dg.AssetKey(["carts", "guest_carts_cleanup"])).specs
    [freshness] = [s.freshness_policy for s in spec]
    assert freshness.fail_window.to_timedelta() == dt.timedelta(minutes=1)
    assert freshness.warn_window is None


def test_an_age_column_that_is_not_timestamptz_fails_the_first_run_naming_it(
        sandbox, carts, engine, db_url, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)  # the guest-favorites policy at its defaults
    write_policy(sandbox.defs_folder_path, {**CARTS, "age_column": "items"})
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("guest_carts_cleanup_job").execute_in_process(
            partition_key=PARTITION, instance=instance, raise_on_error=False)
    assert not result.success
    assert "carts.guest_carts.items is INTEGER" in failure_text(result)
    assert carts_left(engine)["guest:old"] == 250


def test_each_policy_s_partitions_start_on_its_own_day_and_a_recent_default(sandbox,
                                                                            monkeypatch):
    from favorites_maintenance.config.policy_settings import default_partitions_start

    monkeypatch.delenv("FAVORITES_GUEST_RETENTION_PARTITIONS_START", raising=False)
    write_policy(sandbox.defs_folder_path, {**CARTS, "partitions_start": "2026-06-01"})
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    graph = defs.resolve_asset_graph()
    firsts = {key.path[1]: graph.get(key).partitions_def.get_first_partition_key()
              for key in graph.get_all_asset_keys()}
    assert firsts == {"guest_carts_cleanup": "2026-06-01",
                      "guest_favorites_cleanup": default_partitions_start().isoformat()}
    for check in graph.asset_check_keys:
        assert graph.get(check).partitions_def == graph.get(
            check.asset_key).partitions_def
    # A date the calendar does not have is refused naming the field.
    (sandbox.defs_folder_path / "guest_carts" / "defs.yaml").write_text(yaml.safe_dump(
        {"type": "favorites_maintenance.RetentionPolicy",
         "attributes": {**CARTS, "partitions_start": "2026-02-30"}}))
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError) as refused:
        load_policies(tree)
    assert "policy guest_carts, partitions_start: '2026-02-30' is not a date of the calendar" \
        in str(refused.value)
