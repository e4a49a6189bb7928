"""A policy with ``drop_expired_partitions`` on a table partitioned by month: the partitions
wholly before the cutoff that hold nothing the rule keeps are detached (and dropped by a later
run, once ``detached_retention`` is over), every other prunable row is deleted in batches, also
when a plan runs a step per partition, and no account row is ever removed. Runs of a policy's
job through ``execute_in_process`` on a real server.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.local.guest_favorites import (
    create_partitioned_dev_schema,
    drop_dev_schema,
)
from favorites_maintenance_tests.helpers.drop_phase import (
    APR,
    ASSET_KEY,
    BOUNDS,
    FEB,
    JAN,
    JOB,
    MAR,
    MAY,
    UTC,
    cleanup_role_with_functions,
    defs,
    fill,
    log_lines,
    month,
    partitions_of,
    run,
    tables,
)
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    materialization,
)
from favorites_maintenance_tests.helpers.partitioned import (
    backdate_detach,
    detached_from,
    detached_tables,
)
from favorites_maintenance_tests.reliability.conftest import PARTITION


def test_wholly_expired_partitions_are_detached_and_the_rest_deleted_in_batches(table, rows):
    made = fill(rows)
    with dg.instance_for_test() as instance:
        result = run(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
    # January (30 rows), March and April (5) and May (empty) are detached; February keeps its
    # account row, so its 20 guest rows are deleted in batches, as are June's 5 old ones.
    assert meta["partitionsDetached"] == 4
    assert meta["partitionsDropped"] == 0
    assert meta["deletedTotal"] == 30 + 5 + 20 + 5
    assert meta["backlogRemaining"] == 0
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}
    assert not {JAN, MAR, APR, MAY} & partitions_of(table)
    assert FEB in partitions_of(table)
    # Detached, kept for detached_retention (7 days) under another name.
    assert {JAN, APR} <= detached_from(table) and not {JAN, APR} & tables(table)
    assert f"{JAN}_detached" in tables(table)
    assert f"partition {FEB} kept" in lines and "holds a row the rule keeps" in lines
    assert f"partition {JAN} detached (30 rows)" in lines
    assert f"DETACH ... CONCURRENTLY; renamed {JAN}_detached" in lines
    assert "no DELETE trigger, row-level security, publication or foreign key" in lines


def test_a_later_run_drops_the_detached_tables_once_detached_retention_is_over(table, rows):
    made = fill(rows)
    with dg.instance_for_test() as instance:
        first = run(instance)
        assert first.success, failure_text(first)
        # Six days later by the recorded instants: still kept.
        for name in (JAN, MAR, APR, MAY):
            backdate_detach(table, name, 6)
        second = run(instance)
        assert materialization(second, asset_key=ASSET_KEY)["partitionsDropped"] == 0
        assert {JAN, MAR, APR, MAY} <= detached_from(table)
        for name in (JAN, MAR, APR, MAY):
            backdate_detach(table, name, 2)
        third = run(instance)
        assert third.success, failure_text(third)
        meta = materialization(third, asset_key=ASSET_KEY)
        lines = log_lines(instance, third)
    assert (meta["partitionsDropped"], meta["partitionsDetached"], meta["deletedTotal"]) \
        == (4, 0, 0)
    assert not {JAN, MAR, APR, MAY} & detached_from(table)
    assert f"detached table {JAN}_detached dropped (30 rows): partition {JAN}" in lines
    assert "detached_retention P7D over" in lines
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


@pytest.mark.parametrize("privilege", ["owner", "function"])
def test_a_partition_detached_where_its_name_is_taken_takes_the_next_free_one(
        table, rows, roles, monkeypatch, privilege):
    if privilege == "function":
        cleanup_role_with_functions(table, roles, monkeypatch)
    rows.add_many(3, updated_at=month(1))
    with dg.instance_for_test() as instance:
        assert run(instance).success
        # January made again (as a tool creating partitions by name would), and March under a
        # name of PostgreSQL's full 63 bytes; a guest row in each.
        long_name = "m" * 63
        with table.begin() as conn:
            conn.execute(sa.text(
                f"CREATE TABLE {JAN} PARTITION OF favorites.favorites "
                f"FOR VALUES FROM ('{month(1, 1).isoformat()}') TO ('{month(2, 1).isoformat()}')"))
            conn.execute(sa.text(
                f"CREATE TABLE favorites.{long_name} PARTITION OF favorites.favorites "
                f"FOR VALUES FROM ('{month(3, 1).isoformat()}') TO ('{month(4, 1).isoformat()}')"))
        rows.add(updated_at=month(1, 5))
        rows.add(updated_at=month(3, 5))
        second = run(instance)
        assert second.success, failure_text(second)
        assert materialization(second, asset_key=ASSET_KEY)["partitionsDetached"] == 2
    names = {mark["partition"]: name for name, mark in detached_tables(table).items()
             if mark["rows"] == 1}
    assert names == {JAN: f"{JAN}_detached_2",
                     f"favorites.{long_name}": f"favorites.{'m' * 54}_detached"}
    assert f"{JAN}_detached" in detached_tables(table)  # the first, kept as it was


def test_detached_retention_null_keeps_detached_tables_for_good(table, rows):
    fill(rows)
    with dg.instance_for_test() as instance:
        first = run(instance, detached_retention=None)
        assert first.success, failure_text(first)
        backdate_detach(table, JAN, 3650)
        second = run(instance, detached_retention=None)
        meta = materialization(second, asset_key=ASSET_KEY)
        lines = log_lines(instance, second)
    assert meta["partitionsDropped"] == 0
    assert JAN in detached_from(table)
    assert f"detached table {JAN}_detached kept" in lines and "kept for good" in lines


def test_a_partition_with_a_delete_trigger_is_kept_and_its_rows_deleted_in_batches(table, rows):
    march = rows.add_many(10, updated_at=month(3))
    jan = rows.add_many(4, updated_at=month(1))
    account = rows.add(updated_at=month(3, 20), user_id=9)
    with table.begin() as conn:
        conn.execute(sa.text("CREATE TABLE favorites.deleted_log (id bigint)"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.log_delete() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO favorites.deleted_log VALUES (OLD.id); RETURN OLD; END $$"))
        conn.execute(sa.text(
            f"CREATE TRIGGER log_delete AFTER DELETE ON {MAR} "
            "FOR EACH ROW EXECUTE FUNCTION favorites.log_delete()"))
    with dg.instance_for_test() as instance:
        result = run(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
    assert MAR in partitions_of(table) and JAN not in partitions_of(table)
    assert f"a DROP would bypass DELETE trigger log_delete on {MAR}" in lines
    with table.connect() as conn:
        logged = set(conn.execute(sa.text("SELECT id FROM favorites.deleted_log")).scalars())
    assert logged == set(march)  # the trigger saw every delete of March
    assert meta["deletedTotal"] == 14
    assert rows.ids() == {account}
    assert set(jan).isdisjoint(rows.ids())


def test_with_a_default_partition_the_detach_is_a_plain_one(db_url, engine, rows, monkeypatch):
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, BOUNDS, default_partition=True)
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    jan = rows.add_many(3, updated_at=month(1))
    old_default = rows.add_many(2, updated_at=dt.datetime(2020, 1, 1, tzinfo=UTC))
    with dg.instance_for_test() as instance:
        result = run(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
    assert "DETACH (the table has a default partition, which refuses CONCURRENTLY)" in lines
    assert "partition favorites.favorites_default kept: the default partition" in lines
    assert meta["deletedTotal"] == 5  # January detached, the default's two rows in batches
    assert set(jan + old_default).isdisjoint(rows.ids())


def test_an_archive_table_with_drop_expired_partitions_is_refused_at_load(table):
    from favorites_maintenance.components.load_errors import PolicyLoadError

    with pytest.raises(PolicyLoadError, match="archive_table and .*drop_expired_partitions"):
        defs(archive_table="favorites.favorites_archive")


def test_a_table_not_partitioned_by_the_age_column_fails_the_run_naming_it(db_url, engine,
                                                                          rows, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    old = rows.add(updated_at=month(1))
    with dg.instance_for_test() as instance:
        result = run(instance)
    assert not result.success
    assert "favorites.favorites is not a partitioned table" in failure_text(result)
    assert old in rows.ids()


def test_with_partition_steps_the_plan_detaches_and_the_steps_delete_the_rest(table, rows):
    made = fill(rows)
    with dg.instance_for_test() as instance:
        result = run(instance, max_parallel_partitions=2)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
        steps = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"}
    # The plan detached January, March, April and May; one step each for February and June.
    assert (meta["partitionsDetached"], meta["partitionsDropped"]) == (4, 0)
    assert meta["deletedTotal"] == 30 + 5 + 20 + 5
    assert f"partition {JAN} detached (30 rows)" in lines
    assert "2 partitions of favorites.favorites hold rows older than" in lines
    assert sum(1 for key in steps if "purge_partition" in key) == 2
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def test_a_range_run_with_partition_steps_counts_the_detached_rows_once_on_its_last_day(
        table, rows):
    made = fill(rows)
    days = ["2026-06-13", "2026-06-14", PARTITION]
    with dg.instance_for_test() as instance:
        result = defs(max_parallel_partitions=2).resolve_job_def(JOB).execute_in_process(
            instance=instance, raise_on_error=False,
            tags={"dagster/asset_partition_range_start": days[0],
                  "dagster/asset_partition_range_end": days[-1]})
        assert result.success, failure_text(result)
        metas = {}
        for day in days:
            [record] = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=ASSET_KEY, asset_partitions=[day]),
                limit=5).records
            metas[day] = {k: v.value for k, v in
                          record.asset_materialization.metadata.items()}
    assert sum(m["deletedTotal"] for m in metas.values()) == 30 + 5 + 20 + 5
    assert sum(m.get("partitionsDetached", 0) for m in metas.values()) == 4
    assert metas[PARTITION]["partitionsDetached"] == 4
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def test_partition_steps_with_nothing_left_after_the_detach_still_record_it(table, rows):
    # Every prunable row lies in partitions wholly before the cutoff: the plan detaches them
    # (January to May), and no partition step is left to run.
    jan, apr = rows.add_many(4, updated_at=month(1)), rows.add_many(3, updated_at=month(4))
    fresh = rows.add_many(2, updated_at=dt.datetime(2026, 3, 1, tzinfo=UTC))
    with dg.instance_for_test() as instance:
        result = run(instance, max_parallel_partitions=2)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        starts = [e.step_key for e in result.all_events if e.event_type_value == "STEP_START"]
    assert not [k for k in starts if "purge_partition" in k]
    assert (meta["partitionsDetached"], meta["deletedTotal"], meta["batches"]) == (5, 7, 0)
    assert meta["backlogRemaining"] == 0
    assert rows.ids() == set(fresh) and set(jan + apr).isdisjoint(rows.ids())


def test_a_hold_written_otherwise_than_postgresql_writes_the_key_keeps_its_partition(
        table, rows):
    """A hold an application wrote ``00<id>`` holds the bigint ``<id>`` for the batches: the
    drop phase reads it so too, and keeps the partition its row is in, with the row."""
    from favorites_maintenance.retention.holds import create_hold_table
    from favorites_maintenance_tests.helpers.partitioned import POLICY

    made = fill(rows)
    create_hold_table(table, "favorites.retention_holds")
    held = made["jan"][0]
    with table.begin() as conn:
        conn.execute(sa.text("INSERT INTO favorites.retention_holds (policy, held_value, "
                             "placed_by, reason) VALUES (:p, :v, 'app', 'case')"),
                     {"p": POLICY, "v": f"00{held}"})
    with dg.instance_for_test() as instance:
        result = run(instance, hold_table="favorites.retention_holds")
        assert result.success, failure_text(result)
        lines = log_lines(instance, result)
    assert JAN in partitions_of(table) and JAN not in detached_from(table)
    assert f"partition {JAN} kept" in lines
    assert held in rows.ids()


def test_a_hold_written_otherwise_placed_after_the_detach_keeps_the_detached_table(
        table, rows):
    """Placed after the detach as an application writes it (``00<id>``), the hold keeps the
    detached table from the drop, as it would keep the row from the batches."""
    from favorites_maintenance.retention.holds import create_hold_table
    from favorites_maintenance_tests.helpers.partitioned import POLICY

    made = fill(rows)
    create_hold_table(table, "favorites.retention_holds")
    with dg.instance_for_test() as instance:
        first = run(instance, hold_table="favorites.retention_holds")
        assert first.success, failure_text(first)
        assert JAN in detached_from(table)
        held = made["jan"][0]
        with table.begin() as conn:
            conn.execute(sa.text("INSERT INTO favorites.retention_holds (policy, held_value, "
                                 "placed_by, reason) VALUES (:p, :v, 'app', 'case')"),
                         {"p": POLICY, "v": f"00{held}"})
        for name in (JAN, MAR, APR, MAY):
            backdate_detach(table, name, 8)
        second = run(instance, hold_table="favorites.retention_holds")
        assert second.success, failure_text(second)
    assert materialization(second, asset_key=ASSET_KEY)["partitionsDropped"] == 3
    assert f"{JAN}_detached" in tables(table)
    with table.connect() as conn:
        kept = conn.execute(sa.text(f"SELECT count(*) FROM {JAN}_detached WHERE id = :i"),
                            {"i": held}).scalar_one()
    assert kept == 1
