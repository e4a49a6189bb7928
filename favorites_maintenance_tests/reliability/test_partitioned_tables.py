"""A policy with ``drop_expired_partitions`` on a table partitioned by month: the partitions
wholly before the cutoff that hold nothing the rule keeps are detached (and dropped by a later
run), every other prunable row is deleted in batches, and no account row is ever removed. Runs
of a policy's job through ``execute_in_process`` on a real server, with locks held, backends
cancelled and the least-privilege role.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.retention import partition_phase, partitioned, table_partitions
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.retention.least_privilege import (
    apply_partition_functions,
    partition_functions_sql,
)
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.local.guest_favorites import (
    create_partitioned_dev_schema,
    drop_dev_schema,
    month_starts,
)
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    materialization,
    purge_retries,
    run_partition,
)
from favorites_maintenance_tests.helpers.partitioned import (
    backdate_detach,
    detached_from,
    detached_tables,
)
from favorites_maintenance_tests.helpers.policies import (
    favorites_policy,
    location,
)
from favorites_maintenance_tests.helpers.sessions import kill_when, run_concurrently
from favorites_maintenance_tests.reliability.conftest import CUTOFF, PARTITION

UTC = dt.UTC
POLICY = "monthly_favorites"
JOB = f"{POLICY}_cleanup_job"
NODE = f"favorites__{POLICY}_cleanup"
ASSET_KEY = dg.AssetKey(["favorites", f"{POLICY}_cleanup"])
#: Monthly partitions from January 2025 to December 2026; the cutoff of PARTITION is
#: 2025-06-16, so January to May 2025 lie wholly before it.
BOUNDS = month_starts(dt.datetime(2025, 1, 1, tzinfo=UTC), 24)
JAN, FEB, MAR, APR, MAY = (f"favorites.favorites_2025{m:02d}01" for m in range(1, 6))


@pytest.fixture
def table(db_url, engine, monkeypatch):
    """The test database's favorites table, partitioned by month; the code location's
    variables."""
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, BOUNDS)
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    return engine


def defs(**attributes) -> dg.Definitions:
    policy = favorites_policy(POLICY, drop_expired_partitions=True, batch_size=7, **attributes)
    return location(policy)


def run(instance, **attributes) -> dg.ExecuteInProcessResult:
    return run_partition(defs(**attributes), instance, PARTITION, job=JOB,
                         raise_on_error=False)


def log_lines(instance, result) -> str:
    return "\n".join(e.user_message or "" for e in instance.all_logs(result.run_id))


def month(m: int, day: int = 10) -> dt.datetime:
    return dt.datetime(2025, m, day, tzinfo=UTC)


def partitions_of(engine) -> set[str]:
    with engine.connect() as conn:
        return {p.qualified_name for p in table_partitions.leaf_partitions(
            conn, "favorites", "favorites", age_column="updated_at")}


def tables(engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT format('%s.%s', schemaname, tablename) FROM pg_tables "
            "WHERE schemaname = 'favorites'")).scalars())


def fill(rows: Rows) -> dict[str, list[int]]:
    """Guest rows in January (30), February (20, with one account row), April (5) and June
    2025 (5 before the cutoff, 5 after), and in 2026 (10, fresh)."""
    made = {
        "jan": rows.add_many(30, updated_at=month(1)),
        "feb": rows.add_many(20, updated_at=month(2)),
        "feb_account": [rows.add(updated_at=month(2, 20), user_id=7)],
        "apr": rows.add_many(5, updated_at=month(4)),
        "jun_old": rows.add_many(5, updated_at=month(6, 1)),
        "jun_fresh": rows.add_many(5, updated_at=month(6, 20)),
        "fresh": rows.add_many(10, updated_at=dt.datetime(2026, 3, 1, tzinfo=UTC)),
    }
    return made


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


def test_a_lock_held_on_the_table_makes_the_detach_wait_and_try_again(table, rows, monkeypatch):
    monkeypatch.setattr(partition_phase, "LOCK_BACKOFF_S", 0.2)
    jan = rows.add_many(6, updated_at=month(1))
    account = rows.add(updated_at=month(2), user_id=3)
    released = threading.Event()
    waits: set[tuple] = set()

    def hold_until_the_second_attempt() -> None:
        # SHARE conflicts with the SHARE UPDATE EXCLUSIVE lock DETACH ... CONCURRENTLY takes.
        with table.connect() as holder:
            holder.execute(sa.text("LOCK TABLE ONLY favorites.favorites IN SHARE MODE"))
            with table.connect() as watcher:
                deadline = time.monotonic() + 60
                while len(waits) < 2 and time.monotonic() < deadline:
                    waits.update(watcher.execute(sa.text(
                        "SELECT pid, query_start FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND query LIKE 'ALTER TABLE%DETACH%'")
                    ).all())
                    watcher.rollback()
                    time.sleep(0.05)
            holder.rollback()
            released.set()

    thread = threading.Thread(target=hold_until_the_second_attempt, daemon=True)
    thread.start()
    with dg.instance_for_test() as instance:
        result = run(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
    thread.join(10)
    assert released.is_set() and len(waits) >= 2
    assert f"DETACH ... CONCURRENTLY of {JAN}: lock_timeout" in lines
    assert "attempt 1/5; again in 0.2 s" in lines
    assert f"partition {JAN} detached (6 rows)" in lines
    assert meta["partitionsDetached"] >= 1 and meta["deletedTotal"] == 6
    assert rows.ids() == {account} and set(jan).isdisjoint(rows.ids())


def test_a_detach_whose_backend_is_killed_is_finished_by_the_next_run(db_url, engine, rows,
                                                                      monkeypatch):
    # January 2025, then one partition to 2027: January alone lies before the cutoff.
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, [month(1, 1), month(2, 1),
                                           dt.datetime(2027, 1, 1, tzinfo=UTC)])
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    jan = rows.add_many(8, updated_at=month(1))
    account = rows.add(updated_at=month(1, 20) + dt.timedelta(days=30), user_id=5)
    # A reader whose snapshot predates the detach: DETACH ... CONCURRENTLY waits for it after
    # its first transaction committed, and is killed there.
    holder = create_engine(db_url).connect()
    holder.execute(sa.text("BEGIN ISOLATION LEVEL REPEATABLE READ"))
    holder.execute(sa.text("SELECT count(*) FROM favorites.favorites")).scalar_one()
    try:
        with dg.instance_for_test() as instance:
            with kill_when(engine, "SELECT pid FROM pg_stat_activity "
                           "WHERE wait_event_type = 'Lock' AND datname = current_database() "
                           "AND query LIKE 'ALTER TABLE%DETACH%CONCURRENTLY'") as killed:
                first = run(instance)
            assert first.success, failure_text(first)
            assert killed
            with engine.connect() as conn:
                [pending] = [p for p in table_partitions.leaf_partitions(
                    conn, "favorites", "favorites") if p.qualified_name == JAN]
            assert pending.detach_pending
            assert materialization(first, asset_key=ASSET_KEY)["partitionsDetached"] == 0
            holder.rollback()
            holder.close()
            second = run(instance)
            assert second.success, failure_text(second)
            meta = materialization(second, asset_key=ASSET_KEY)
            lines = log_lines(instance, second)
    finally:
        holder.close()
    assert meta["partitionsDetached"] == 1 and meta["deletedTotal"] == 8
    assert f"partition {JAN} detached (8 rows)" in lines and "FINALIZE" in lines
    assert JAN not in partitions_of(engine) and JAN in detached_from(engine)
    assert rows.ids() == {account} and set(jan).isdisjoint(rows.ids())


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


def test_the_least_privilege_role_without_the_functions_deletes_rows_instead(
        table, rows, roles, monkeypatch):
    made = fill(rows)
    url = roles.create("cleanup", least_privilege=True)
    monkeypatch.setenv(DATABASE_URL_VAR, url.render_as_string(hide_password=False))
    with dg.instance_for_test() as instance:
        result = run(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
    assert "may not alter favorites.favorites and cannot execute " \
           "favorites.favorites_detach_partition(regclass, timestamptz, integer)" in lines
    assert (meta["partitionsDetached"], meta["deletedTotal"]) == (0, 60)
    assert {JAN, MAR, APR, MAY} <= partitions_of(table)
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def cleanup_role_with_functions(table, roles, monkeypatch) -> sa.URL:
    """The job runs as the least-privilege role (its URL returned), the owner's partition
    functions installed."""
    url = roles.create("cleanup", least_privilege=True)
    apply_partition_functions(table, url.username, GUEST_FAVORITES)
    monkeypatch.setenv(DATABASE_URL_VAR, url.render_as_string(hide_password=False))
    return url


def test_the_least_privilege_role_detaches_and_drops_through_the_owners_functions(
        table, rows, roles, monkeypatch):
    made = fill(rows)
    cleanup_role_with_functions(table, roles, monkeypatch)
    with dg.instance_for_test() as instance:
        first = run(instance)
        assert first.success, failure_text(first)
        meta = materialization(first, asset_key=ASSET_KEY)
        lines = log_lines(instance, first)
        assert (meta["partitionsDetached"], meta["deletedTotal"]) == (4, 60)
        assert ("favorites.favorites_detach_partition checked it again under its lock and "
                f"detached it; renamed {JAN}_detached") in lines
        assert {JAN, MAR, APR, MAY} <= detached_from(table)
        assert f"partition {FEB} kept" in lines
        for name in (JAN, MAR, APR, MAY):
            backdate_detach(table, name, 8)
        second = run(instance)
        assert second.success, failure_text(second)
        dropped = materialization(second, asset_key=ASSET_KEY)
        second_lines = log_lines(instance, second)
    assert dropped["partitionsDropped"] == 4
    assert "favorites.favorites_drop_detached checked it again and dropped it" in second_lines
    assert not {JAN, MAR, APR, MAY} & detached_from(table)
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def test_with_holds_the_least_privilege_role_never_drops_a_detached_table(
        table, rows, roles, monkeypatch):
    """The owner's drop function checks the guard, not the holds: a hold placed after the
    detach covers a row of the detached table, which is kept."""
    from favorites_maintenance.retention.holds import HoldTable, create_hold_table, place_hold

    made = fill(rows)
    url = cleanup_role_with_functions(table, roles, monkeypatch)
    create_hold_table(table, "favorites.retention_holds")
    with table.begin() as conn:
        conn.execute(sa.text(f'GRANT SELECT ON favorites.retention_holds TO "{url.username}"'))
    with dg.instance_for_test() as instance:
        first = run(instance, hold_table="favorites.retention_holds")
        assert first.success, failure_text(first)
        assert JAN in detached_from(table)
        holds = HoldTable.define("favorites.retention_holds", "id", "guest_favorites")
        place_hold(table, holds, str(made["jan"][0]), reason="dispute", placed_by="support")
        for name in (JAN, MAR, APR, MAY):
            backdate_detach(table, name, 8)
        second = run(instance, hold_table="favorites.retention_holds")
        assert second.success, failure_text(second)
        lines = log_lines(instance, second)
    assert materialization(second, asset_key=ASSET_KEY)["partitionsDropped"] == 0
    assert {JAN, MAR, APR, MAY} <= detached_from(table)
    assert "the policy has holds, which favorites.favorites_drop_detached does not check" in lines
    with table.connect() as conn:
        kept = conn.execute(sa.text(f"SELECT count(*) FROM {JAN}_detached WHERE id = :i"),
                            {"i": made["jan"][0]}).scalar_one()
    assert kept == 1


def test_the_owners_function_refuses_a_partition_holding_an_account_row(table, rows, roles):
    rows.add_many(3, updated_at=month(2))
    rows.add(updated_at=month(2, 15), user_id=1)
    url = roles.create("cleanup", least_privilege=True)
    apply_partition_functions(table, url.username, GUEST_FAVORITES)
    role_engine = create_engine(url)
    try:
        with pytest.raises(sa.exc.DBAPIError, match="kept: favorites.favorites_20250201 holds "
                                                    "a row with user_id NOT NULL"), \
                role_engine.begin() as conn:
            conn.execute(sa.text("SELECT favorites.favorites_detach_partition("
                                 "CAST(:p AS regclass), :c, 1000)"), {"p": FEB, "c": CUTOFF})
        with pytest.raises(sa.exc.DBAPIError, match="must be owner of table favorites"), \
                role_engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE favorites.favorites DETACH PARTITION {FEB}"))
    finally:
        role_engine.dispose()
    assert FEB in partitions_of(table) and rows.accounts() == 1


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


def test_a_detach_function_that_leaves_the_partitions_name_is_reported(table, rows, roles,
                                                                         monkeypatch):
    rows.add_many(3, updated_at=month(1))
    url = cleanup_role_with_functions(table, roles, monkeypatch)
    # The function as an older template wrote it: detached, marked, not renamed.
    rename = "EXECUTE format('ALTER TABLE %s RENAME TO %I', part, free_name);"
    text = partition_functions_sql(GUEST_FAVORITES, url.username)
    assert rename in text
    with table.begin() as conn:
        conn.connection.cursor().execute(text.replace(rename, ""))
    with dg.instance_for_test() as instance:
        result = run(instance)
        assert result.success, failure_text(result)
        lines = log_lines(instance, result)
    assert (f"favorites.favorites_detach_partition detached {JAN} but left it under the "
            "partition's name") in lines
    assert "install the owner's functions again" in lines
    assert JAN in tables(table) and JAN not in partitions_of(table)


def test_partition_steps_under_the_least_privilege_role_need_its_grants_on_the_table_alone(
        table, rows, roles, monkeypatch):
    made = fill(rows)
    url = cleanup_role_with_functions(table, roles, monkeypatch)
    with table.connect() as conn:
        granted = conn.execute(sa.text(
            "SELECT bool_or(has_table_privilege(:r, inhrelid, 'DELETE') "
            "OR has_any_column_privilege(:r, inhrelid, 'SELECT')) FROM pg_inherits "
            "WHERE inhparent = 'favorites.favorites'::regclass"), {"r": url.username}
        ).scalar_one()
    assert granted is False  # CREATE TABLE ... PARTITION OF copies no grant
    with dg.instance_for_test() as instance:
        result = run(instance, max_parallel_partitions=2)
        assert result.success, failure_text(result)
    # The plan probes and the steps delete through the table, whose grants the role has.
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


JUNE = "favorites.favorites_20250601"


def lock_until_a_wait_times_out(engine, table: str, pattern: str, timed_out: threading.Event,
                                *, hold_s: float = 30) -> None:
    """Hold ACCESS EXCLUSIVE on ``table``, as an application's migration would, until a
    session of the job waiting for it on a query like ``pattern`` stops waiting (its
    lock_timeout), or ``hold_s`` seconds."""
    with engine.connect() as holder, engine.connect() as watcher:
        holder.execute(sa.text(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
        waited = False
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline:
            waiting = watcher.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE :q"), {"q": pattern}).scalar_one() > 0
            watcher.rollback()
            if waited and not waiting:
                timed_out.set()
                break
            waited = waited or waiting
            time.sleep(0.02)
        holder.rollback()


def test_the_partition_read_gives_up_on_a_locked_partition_within_lock_timeout(table, rows):
    # Reading a partition's bounds (pg_get_expr) locks it: behind an application's ACCESS
    # EXCLUSIVE lock on one partition, the drop phase's read must give up within lock_timeout
    # and the step be retried, not wait for as long as the lock is held.
    made = fill(rows)
    timed_out = threading.Event()
    thread = threading.Thread(target=lock_until_a_wait_times_out, daemon=True,
                              args=(table, JUNE, "%pg_get_expr(c.relpartbound%", timed_out))
    thread.start()
    time.sleep(0.2)
    with dg.instance_for_test() as instance:
        result = run_partition(defs(), instance, PARTITION, job=JOB,
                               run_config=purge_retries(1, asset_key=ASSET_KEY),
                               raise_on_error=False)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
        retried = [e.step_key for e in result.all_events
                   if e.event_type_value == "STEP_UP_FOR_RETRY"]
    thread.join(10)
    assert timed_out.is_set() and retried == [f"{NODE}.purge"]
    assert "transient database error (lock_not_available)" in lines
    assert (meta["partitionsDetached"], meta["deletedTotal"]) == (4, 60)
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def test_a_plan_retried_after_its_drop_phase_still_counts_the_detached_rows(table, rows,
                                                                           monkeypatch):
    # The plan detaches January to May, then its look for partitions with prunable rows finds
    # June locked by the application past lock_timeout: the plan is retried, and the retry has
    # nothing left to detach. The first attempt's detached rows are still the run's.
    from favorites_maintenance.pipeline import partition_steps
    from favorites_maintenance_tests.helpers.partitioned import retries

    made = fill(rows)
    real = partition_steps.prunable_partitions
    calls = []

    def behind_a_lock_the_first_time(engine, rule, cutoff):
        calls.append(1)
        if len(calls) > 1:
            return real(engine, rule, cutoff)
        with table.connect() as holder:
            holder.execute(sa.text(f"LOCK TABLE {JUNE} IN ACCESS EXCLUSIVE MODE"))
            try:
                return real(engine, rule, cutoff)
            finally:
                holder.rollback()

    monkeypatch.setattr(partition_steps, "prunable_partitions", behind_a_lock_the_first_time)
    with dg.instance_for_test() as instance:
        result = run_partition(defs(max_parallel_partitions=2), instance, PARTITION, job=JOB,
                               run_config=retries(1), raise_on_error=False)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        retried = [e.step_key for e in result.all_events
                   if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(calls) == 2 and retried == [f"{NODE}.plan_partitions"]
    assert {JAN, MAR, APR, MAY}.isdisjoint(partitions_of(table))
    assert (meta["partitionsDetached"], meta["partitionsDropped"]) == (4, 0)
    assert meta["deletedTotal"] == 30 + 5 + 20 + 5
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def test_an_account_row_that_reaches_the_partition_after_the_check_stays_in_the_table(
        table, rows, monkeypatch):
    # Between the check and the DETACH, a guest signs up and their January favorites become
    # an account's: the partition must not leave the table with that row.
    made = fill(rows)
    claimed = made["jan"][0]
    real = partition_phase.DropPhase.alter

    def claim_then_alter(phase, statement):
        if JAN.split(".")[1] in statement and "FINALIZE" not in statement:
            with table.begin() as conn:
                conn.execute(sa.text("UPDATE favorites.favorites SET user_id = 9 "
                                     "WHERE id = :id"), {"id": claimed})
        return real(phase, statement)

    monkeypatch.setattr(partition_phase.DropPhase, "alter", claim_then_alter)
    with dg.instance_for_test() as instance:
        result = run(instance)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
        lines = log_lines(instance, result)
    assert JAN in partitions_of(table)
    assert (f"partition {JAN} was detached from favorites.favorites, but a row the rule keeps "
            "reached it after the check: attached again") in lines
    assert rows.ids() == {claimed, *made["feb_account"], *made["jun_fresh"], *made["fresh"]}
    assert (meta["partitionsDetached"], meta["deletedTotal"]) == (3, 59)



def test_two_drop_phases_at_once_detach_each_partition_once_and_count_its_rows_once(
        db_url, engine, rows):
    # Two runs of the policy at once (a run launched by hand beside the schedule's, outside
    # the run queue's pools) over 29 expired monthly partitions.
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, month_starts(dt.datetime(2023, 1, 1, tzinfo=UTC), 42))
    old = [rows.add_many(3, updated_at=dt.datetime(2023 + m // 12, m % 12 + 1, 5, tzinfo=UTC))
           for m in range(29)]
    accounts = [rows.add(updated_at=dt.datetime(2023, 1 + m, 20, tzinfo=UTC), user_id=m + 1)
                for m in (2, 7)]
    fresh = rows.add_many(4, updated_at=dt.datetime(2026, 3, 1, tzinfo=UTC))
    engines = [create_engine(db_url) for _ in range(2)]
    try:
        results = run_concurrently(2, lambda n: partitioned.drop_expired_partitions(
            engines[n], GUEST_FAVORITES, CUTOFF))
    finally:
        for e in engines:
            e.dispose()
    detached = [p for r in results for p in r.detached]
    assert len(detached) == len(set(detached)) == 27  # March and August hold an account row
    assert sum(r.rows_removed for r in results) == 27 * 3
    marks = {m.get("partition"): m["favorites_maintenance"]
             for m in detached_tables(engine).values()}
    # Each table either run detached is marked detached, so that a later run drops it.
    assert marks == dict.fromkeys(detached, "detached")
    kept = {*accounts, *fresh, *old[2], *old[7]}
    assert rows.ids() == kept


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


def test_a_detach_blocked_past_its_last_attempt_leaves_the_rows_to_the_batches(
        db_url, engine, rows, monkeypatch):
    # An application's maintenance (a VACUUM, a CREATE INDEX CONCURRENTLY) holds SHARE UPDATE
    # EXCLUSIVE on the table longer than every attempt of the detach (and of the mark before
    # it: a lock on the table blocks one on its partition); it does not block the batches'
    # DELETE.
    monkeypatch.setattr(partition_phase, "LOCK_BACKOFF_S", 0.1)
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, [month(1, 1), month(2, 1),
                                           dt.datetime(2027, 1, 1, tzinfo=UTC)])
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    jan = rows.add_many(8, updated_at=month(1))
    account = rows.add(updated_at=month(1, 20) + dt.timedelta(days=30), user_id=5)
    with engine.connect() as holder:
        holder.execute(sa.text("LOCK TABLE favorites.favorites IN SHARE UPDATE EXCLUSIVE MODE"))
        with dg.instance_for_test() as instance:
            result = run(instance)
            assert result.success, failure_text(result)
            meta = materialization(result, asset_key=ASSET_KEY)
            lines = log_lines(instance, result)
        holder.rollback()
    assert "attempt 4/5" in lines and f"DETACH ... CONCURRENTLY of {JAN} failed" in lines
    assert JAN in partitions_of(engine)
    assert (meta["partitionsDetached"], meta["deletedTotal"]) == (0, 8)
    assert rows.ids() == {account} and set(jan).isdisjoint(rows.ids())
    # No mark is left saying the job is detaching it: a detach someone else begins later and
    # leaves pending must not pass for the job's own (which the job would drop).
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT obj_description(CAST(:p AS regclass), "
                                    "'pg_class')"), {"p": JAN}).scalar() is None


def test_a_drop_phase_that_fails_after_its_detaches_still_counts_them(table, rows,
                                                                      monkeypatch):
    # After January to May are detached, the read of the detached tables fails on a lock
    # timeout (a real one: a table the application holds). A retry of the step would find
    # nothing left to detach: the phase ends with what it did, and the batches go on.
    made = fill(rows)
    real = partitioned.drop_due
    calls = []

    def behind_a_lock_the_first_time(phase, privilege):
        calls.append(1)
        if len(calls) == 1:
            with table.connect() as holder, phase.engine.connect() as conn:
                holder.execute(sa.text(f"LOCK TABLE {JUNE} IN ACCESS EXCLUSIVE MODE"))
                conn.execute(sa.text("SET lock_timeout = '100ms'"))
                conn.execute(sa.text(f"SELECT 1 FROM {JUNE} LIMIT 1"))
        return real(phase, privilege)

    monkeypatch.setattr(partitioned, "drop_due", behind_a_lock_the_first_time)
    with dg.instance_for_test() as instance:
        result = run_partition(defs(), instance, PARTITION, job=JOB,
                               run_config=purge_retries(1, asset_key=ASSET_KEY),
                               raise_on_error=False)
        assert result.success, failure_text(result)
        meta = materialization(result, asset_key=ASSET_KEY)
    assert {JAN, MAR, APR, MAY}.isdisjoint(partitions_of(table))
    assert (meta["partitionsDetached"], meta["deletedTotal"]) == (4, 60)
    assert rows.ids() == {*made["feb_account"], *made["jun_fresh"], *made["fresh"]}


def test_a_stop_request_ends_the_drop_phase_between_lock_attempts(db_url, engine, rows,
                                                                   monkeypatch, caplog):
    # A detach waiting on an application's lock retries with pauses of up to seconds: a stop
    # requested meanwhile ends the phase at once, the partition attached and unmarked.
    monkeypatch.setattr(partition_phase, "LOCK_BACKOFF_S", 30)
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, [month(1, 1), month(2, 1), month(3, 1),
                                           dt.datetime(2027, 1, 1, tzinfo=UTC)])
    jan = rows.add_many(5, updated_at=month(1))
    feb = rows.add_many(5, updated_at=month(2))
    def stop_once_a_wait_timed_out() -> bool:
        return any("lock_timeout" in r.getMessage() for r in caplog.records)

    caplog.set_level("INFO", logger="favorites_maintenance.retention.partitioned")
    with engine.connect() as holder:
        holder.execute(sa.text("LOCK TABLE favorites.favorites IN SHARE UPDATE EXCLUSIVE MODE"))
        result = partitioned.drop_expired_partitions(
            engine, GUEST_FAVORITES, CUTOFF, lock_timeout=dt.timedelta(milliseconds=200),
            should_stop=stop_once_a_wait_timed_out)
        holder.rollback()
    messages = [r.getMessage() for r in caplog.records]
    # One wait timed out, and no second attempt followed its 30 s pause.
    assert any("attempt 1/5; again in 30 s" in m for m in messages)
    assert not any("attempt 2/5" in m for m in messages)
    assert any("stopped on request" in m for m in messages)
    assert (result.detached, result.rows_removed) == ((), 0)
    assert {JAN, FEB} <= partitions_of(engine)
    assert set(jan) | set(feb) <= rows.ids()
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT obj_description(CAST(:p AS regclass), "
                                    "'pg_class')"), {"p": JAN}).scalar() is None
