"""The drop phase under the least-privilege role: without the owner's partition functions it
deletes the rows instead, with them it detaches and drops through them, which check again what
the job checked and keep a partition holding a row the rule keeps (or a detached table a hold
covers). Runs of a policy's job through ``execute_in_process`` on a real server.
"""

from __future__ import annotations

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.retention.least_privilege import (
    apply_partition_functions,
    partition_functions_sql,
)
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance_tests.helpers.drop_phase import (
    APR,
    ASSET_KEY,
    FEB,
    JAN,
    MAR,
    MAY,
    cleanup_role_with_functions,
    fill,
    log_lines,
    month,
    partitions_of,
    run,
    tables,
)
from favorites_maintenance_tests.helpers.jobs import failure_text, materialization
from favorites_maintenance_tests.helpers.partitioned import backdate_detach, detached_from
from favorites_maintenance_tests.reliability.conftest import CUTOFF


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
