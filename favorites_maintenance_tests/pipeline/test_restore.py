"""Restore: ``restore_<policy>_job`` (and ``favorites-maintenance restore``, which runs it) moves
archived rows back into the table, as they were. The over-deletion it undoes: ``shop_items``
deployed with 30 days instead of 365, corrected, then the run that deleted too much restored.
Runs of the real code location through ``execute_in_process`` on Dagster instances.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from favorites_maintenance.retention.database import APPLICATION_NAME
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers import archive as shop
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    materialization,
    run_partition,
)
from favorites_maintenance_tests.helpers.policies import location, policy_sandbox

UTC = dt.timezone.utc
NOW = dt.datetime.now(UTC)
#: Yesterday: a run's cutoff is then about now minus its retention.
PARTITION = (NOW - dt.timedelta(days=1)).date().isoformat()
#: Prunable under the mistaken 30 days, not under the correct 365.
MID = NOW - dt.timedelta(days=100)
#: Prunable under either.
OLD = NOW - dt.timedelta(days=400)
FRESH = NOW - dt.timedelta(days=2)


@pytest.fixture
def env(db_url, engine, monkeypatch):
    shop.create_items(engine)
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    return monkeypatch


def defs_with_retention(monkeypatch, days: int, **attributes) -> dg.Definitions:
    """The code location with ``shop_items``'s retention deployed at ``days`` (and
    ``attributes`` on top of the policy's)."""
    return location(shop.policy(**attributes), env={shop.RETENTION_VAR: str(days)},
                    monkeypatch=monkeypatch)


def purge(defs, instance) -> dg.ExecuteInProcessResult:
    result = run_partition(defs, instance, PARTITION, job=shop.JOB, raise_on_error=False)
    assert result.success, failure_text(result)
    return result


def restore(defs, instance, **config) -> dg.ExecuteInProcessResult:
    return defs.resolve_job_def(shop.RESTORE_JOB).execute_in_process(
        run_config={"ops": {shop.RESTORE_OP: {"config": config}}}, instance=instance,
        raise_on_error=False)


def figures(result: dg.ExecuteInProcessResult) -> dict:
    """The restore op's metadata: from its output, or from its failure."""
    for event in result.all_events:
        if event.event_type_value == "STEP_OUTPUT":
            return {k: v.value for k, v in event.step_output_data.metadata.items()}
        if event.event_type_value == "STEP_FAILURE":
            data = event.event_specific_data.user_failure_data
            return {k: v.value for k, v in (data.metadata if data else {}).items()}
    return {}


def over_deleted(engine, monkeypatch, instance, n: int = 30, **attributes):
    """``n`` rows 100 days old deleted by the mistaken 30-day retention, 10 kept; the snapshot
    of the table before, the purge's run."""
    shop.add_items(engine, n, updated_at=MID)
    shop.add_items(engine, 5, updated_at=FRESH)
    shop.add_items(engine, 5, updated_at=MID, owner_id=9)
    before = shop.rows_of(engine, shop.TABLE)
    run = purge(defs_with_retention(monkeypatch, 30, **attributes), instance)
    assert materialization(run, asset_key=shop.ASSET_KEY)["deletedTotal"] == n
    return before, run


def test_a_restore_of_a_run_puts_its_rows_back_as_they_were(env, engine):
    with dg.instance_for_test() as instance:
        before, run = over_deleted(engine, env, instance, n=300)
        archived = shop.rows_of(engine, shop.ARCHIVE)
        fixed = defs_with_retention(env, 365)  # the policy corrected first

        pretend = restore(fixed, instance, run_id=run.run_id, pretend=True, batch_size=8)
        assert pretend.success, failure_text(pretend)
        assert figures(pretend) | {"durationMs": 0} == {
            "selectedRows": 300, "restorableRows": 300, "restoredRows": 0, "leftInArchive": 300,
            "keyExistsRows": 0, "prunableRows": 0, "failedRows": 0, "failedCauses": "none",
            "batches": 0, "durationMs": 0, "pretend": True}
        # --pretend changes nothing.
        assert shop.rows_of(engine, shop.ARCHIVE) == archived
        assert len(shop.rows_of(engine, shop.TABLE)) == 10

        done = restore(fixed, instance, run_id=run.run_id, batch_size=8)
        assert done.success, failure_text(done)
        meta = figures(done)
        assert (meta["restoredRows"], meta["leftInArchive"]) == (300, 0)
        assert meta["batches"] > 1  # page ranges of about 8 rows: one page at least
        # Every column as it was: the identity key, arrays, jsonb, the enum; the generated
        # column recomputed to the same value.
        assert shop.rows_of(engine, shop.TABLE) == before
        assert shop.ids_of(engine, shop.ARCHIVE) == []
        # The run is in the instance's history, and the next cleanup deletes nothing.
        assert instance.get_run_by_id(done.run_id).job_name == shop.RESTORE_JOB
        again = purge(fixed, instance)
        assert materialization(again, asset_key=shop.ASSET_KEY)["deletedTotal"] == 0


def test_a_key_that_exists_again_is_left_in_the_archive_and_counted(env, engine):
    with dg.instance_for_test() as instance:
        before, run = over_deleted(engine, env, instance)
        back = min(shop.ids_of(engine, shop.ARCHIVE))
        with engine.begin() as conn:  # the application wrote that key anew
            conn.exec_driver_sql(
                "INSERT INTO shop.items (id, owner_id, note, updated_at) OVERRIDING SYSTEM "
                f"VALUE VALUES ({back}, 5, 'written anew', now())")
        new_row = shop.rows_of(engine, shop.TABLE, [back])
        result = restore(defs_with_retention(env, 365), instance, run_id=run.run_id)
        assert result.success, failure_text(result)
        meta = figures(result)
    assert (meta["restoredRows"], meta["keyExistsRows"], meta["leftInArchive"]) == (29, 1, 1)
    assert shop.rows_of(engine, shop.TABLE, [back]) == new_row  # never written over
    assert shop.rows_of(engine, shop.ARCHIVE) == {back: before[back]}
    assert {i: r for i, r in shop.rows_of(engine, shop.TABLE).items() if i != back} == {
        i: r for i, r in before.items() if i != back}


def test_rows_the_deployed_rule_still_prunes_are_refused_unless_allowed(env, engine):
    with dg.instance_for_test() as instance:
        shop.add_items(engine, 12, updated_at=OLD)
        before = shop.rows_of(engine, shop.TABLE)
        defs = defs_with_retention(env, 365)
        run = purge(defs, instance)
        archived = shop.rows_of(engine, shop.ARCHIVE)

        refused = restore(defs, instance, run_id=run.run_id)
        assert not refused.success
        assert ("12 of the 12 rows to restore are prunable under the deployed rule (owner_id "
                "IS NULL AND updated_at < cutoff, retention 365 days): the next run would "
                "delete them again") in failure_text(refused)
        assert figures(refused)["prunableRows"] == 12
        assert shop.rows_of(engine, shop.ARCHIVE) == archived  # nothing moved
        assert shop.rows_of(engine, shop.TABLE) == {}

        allowed = restore(defs, instance, run_id=run.run_id, allow_prunable=True)
        assert allowed.success and figures(allowed)["restoredRows"] == 12
        assert shop.rows_of(engine, shop.TABLE) == before


def test_an_unknown_run_id_and_a_selection_that_is_not_one_are_refused(env, engine):
    with dg.instance_for_test() as instance:
        _, run = over_deleted(engine, env, instance)
        defs = defs_with_retention(env, 365)
        unknown = restore(defs, instance, run_id="0bad0bad-0000-4000-8000-000000000000")
        both = restore(defs, instance, run_id=run.run_id, since="2026-01-01T00:00:00Z")
        neither = restore(defs, instance, pretend=True)
        naive = restore(defs, instance, since="2026-01-01T00:00:00")
    assert not unknown.success
    assert ("shop.items_archive holds no row of policy shop_items run "
            "0bad0bad-0000-4000-8000-000000000000: an unknown run id") in failure_text(unknown)
    assert "(this instance has no run 0bad0bad-0000-4000-8000-000000000000 either)" in \
        failure_text(unknown)
    assert "give run_id, or since/until, not both" in failure_text(both)
    assert "give run_id (the run whose archived rows to restore), or since" in \
        failure_text(neither)
    assert "since '2026-01-01T00:00:00' has no offset" in failure_text(naive)
    assert len(shop.ids_of(engine, shop.ARCHIVE)) == 30


def test_a_restore_by_instants_takes_the_rows_archived_between_them(env, engine):
    with dg.instance_for_test() as instance:
        defs = defs_with_retention(env, 30)
        first = shop.add_items(engine, 6, updated_at=MID)
        purge(defs, instance)
        with engine.begin() as conn:  # archived two hours ago
            conn.exec_driver_sql("UPDATE shop.items_archive SET _retention_archived_at = "
                                 "now() - interval '2 hours'")
        second = shop.add_items(engine, 4, updated_at=MID)
        purge(defs, instance)
        since = (dt.datetime.now(UTC) - dt.timedelta(hours=1)).isoformat()
        result = restore(defs_with_retention(env, 365), instance, since=since)
        assert result.success, failure_text(result)
    assert figures(result)["restoredRows"] == 4
    assert sorted(shop.ids_of(engine, shop.TABLE)) == sorted(second)
    assert shop.ids_of(engine, shop.ARCHIVE) == sorted(first)


def test_a_restore_from_a_partitioned_archive_takes_only_the_rows_it_selected(env, engine):
    """Partitions of the archive number their rows' addresses each from the start: the rows of
    two runs, one per partition, sit at the same addresses. Restoring one run brings back its
    rows and no other."""
    with engine.begin() as conn:  # the archive, partitioned by the month of archiving
        conn.exec_driver_sql(shop.PARTITIONED_ARCHIVE)
    with dg.instance_for_test() as instance:
        _, first = over_deleted(engine, env, instance, archive_retention_days=365)
        with engine.begin() as conn:  # the first run's rows, archived 40 days ago
            conn.exec_driver_sql("UPDATE shop.items_archive SET _retention_archived_at = "
                                 "_retention_archived_at - interval '40 days'")
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM shop.items_archive_current")  # its addresses free
        first_rows = shop.rows_of(engine, shop.ARCHIVE)
        before, second = over_deleted(engine, env, instance, archive_retention_days=365)
        with engine.connect() as conn:
            shared = conn.exec_driver_sql(
                "SELECT count(*) FROM shop.items_archive_earlier e "
                "JOIN shop.items_archive_current c ON c.ctid = e.ctid").scalar_one()
        assert shared  # the premise: rows of one run at the addresses of the other's

        done = restore(defs_with_retention(env, 365, archive_retention_days=365), instance,
                       run_id=second.run_id, batch_size=8)
        assert done.success, failure_text(done)
    meta = figures(done)
    assert (meta["selectedRows"], meta["restoredRows"], meta["leftInArchive"]) == (30, 30, 0)
    assert shop.rows_of(engine, shop.ARCHIVE) == first_rows
    assert shop.archive_stamps(engine) == [(first.run_id, shop.POLICY, 30)]
    assert shop.rows_of(engine, shop.TABLE) == before


def test_a_restore_into_a_table_whose_trigger_routes_rows_elsewhere_moves_none(env, engine):
    """The table's trigger sends each row to a child and returns NULL: the insert returns no
    row, so the restore cannot tell a row routed from a row dropped. Its batch rolls back,
    every row stays in the archive, and the figures say so."""
    with dg.instance_for_test() as instance:
        _, run = over_deleted(engine, env, instance)
        archived = shop.rows_of(engine, shop.ARCHIVE)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE shop.items_routed () INHERITS (shop.items); "
                "CREATE FUNCTION shop.route_items() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN INSERT INTO shop.items_routed (id, owner_id, tags, attrs, scores, price, "
                "mood, note, updated_at) VALUES (NEW.id, NEW.owner_id, NEW.tags, NEW.attrs, "
                "NEW.scores, NEW.price, NEW.mood, NEW.note, NEW.updated_at); RETURN NULL; "
                "END $$; CREATE TRIGGER route_items BEFORE INSERT ON shop.items FOR EACH ROW "
                "EXECUTE FUNCTION shop.route_items()")
        kept = shop.rows_of(engine, shop.TABLE)
        result = restore(defs_with_retention(env, 365), instance, run_id=run.run_id)
    assert not result.success
    assert ("its BEFORE INSERT trigger 'route_items' (function shop.route_items) on shop.items "
            "returned NULL for 30 of the 30 rows") in failure_text(result)
    assert "ALTER TABLE shop.items DISABLE TRIGGER route_items" in failure_text(result)
    meta = figures(result)
    assert (meta["selectedRows"], meta["restoredRows"], meta["leftInArchive"]) == (30, 0, 30)
    assert shop.rows_of(engine, shop.ARCHIVE) == archived
    assert shop.rows_of(engine, shop.TABLE) == kept


def test_a_restore_never_runs_beside_a_run_of_the_policy(env, engine):
    with dg.instance_for_test() as instance:
        _, run = over_deleted(engine, env, instance)
        defs = defs_with_retention(env, 365)
        # A purge in progress: its first batch sleeps in a trigger for a few seconds.
        shop.add_items(engine, 3, updated_at=OLD, note="SLOW")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE FUNCTION shop.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF OLD.note = 'SLOW' THEN PERFORM pg_sleep(3); END IF; RETURN OLD; END $$; "
                "CREATE TRIGGER slow BEFORE DELETE ON shop.items FOR EACH ROW "
                "EXECUTE FUNCTION shop.slow()")
        purging = threading.Thread(target=purge, args=(defs, instance), daemon=True)
        purging.start()
        _wait_for_sleeping_batch(engine)
        refused = restore(defs, instance, run_id=run.run_id)
        purging.join(60)
    assert not refused.success
    assert "is in progress and holds the pool shop_items_cleanup: a restore never runs " \
           "beside a purge of policy shop_items" in failure_text(refused)
    pools = {p.name: p for p in defs.resolve_job_def(shop.RESTORE_JOB).nodes}
    assert pools[shop.RESTORE_OP].definition.pool == "shop_items_cleanup"


def _wait_for_sleeping_batch(engine, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE "
                                    "application_name = :a AND wait_event = 'PgSleep'"),
                            {"a": APPLICATION_NAME}).scalar_one():
                return
        time.sleep(0.02)
    raise AssertionError("the purge's batch never reached the slow row")


def test_the_command_line_runs_the_restore_job_on_the_deployments_instance(
        env, engine, tmp_path, monkeypatch):
    from favorites_maintenance.cli import main
    from favorites_maintenance.components import policy_tree

    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    with dg.instance_for_test() as instance:
        before, run = over_deleted(engine, env, instance)
    env.setenv(shop.RETENTION_VAR, "365")
    with policy_sandbox(shop.policy()) as sandbox, sandbox.tree() as tree:
        monkeypatch.setattr(policy_tree, "component_tree", lambda: tree)
        no_home = CliRunner().invoke(main, ["restore", "--policy", "shop_items",
                                            "--run-id", run.run_id])
        env.setenv("DAGSTER_HOME", str(home))
        pretend = CliRunner().invoke(main, ["restore", "--policy", "shop_items",
                                            "--run-id", run.run_id, "--pretend"])
        done = CliRunner().invoke(main, ["restore", "--policy", "shop_items",
                                         "--run-id", run.run_id, "--batch-size", "7"])
        no_archive = CliRunner().invoke(main, ["restore", "--policy", "guest_favorites",
                                               "--run-id", run.run_id])
        both = CliRunner().invoke(main, ["restore", "--policy", "shop_items", "--run-id", "x",
                                         "--since", "2026-01-01T00:00:00Z"])
    assert no_home.exit_code == 2 and "DAGSTER_HOME is not set" in no_home.output
    assert pretend.exit_code == 0, pretend.output
    assert "pretend: nothing moved" in pretend.output
    assert "archived rows selected          30" in pretend.output
    assert done.exit_code == 0, done.output
    assert "restored                        30" in done.output
    assert shop.rows_of(engine, shop.TABLE) == before
    with dg.DagsterInstance.get() as deployed:  # DAGSTER_HOME's
        runs = deployed.get_runs()
    assert [r.job_name for r in runs] == [shop.RESTORE_JOB, shop.RESTORE_JOB]
    assert no_archive.exit_code == 2
    assert "the policy keeps no archive (no archive_table in its defs.yaml)" in no_archive.output
    assert both.exit_code == 2 and "give --run-id, or --since/--until, not both" in both.output
