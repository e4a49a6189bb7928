"""Least privilege: the shipped role holds only what the job needs, and the job runs under it."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.retention.archive import (
    ArchiveTarget,
    create_archive_sql,
    table_columns,
)
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.holds import HoldTable, create_hold_table_sql, place_hold
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.retention.least_privilege import (
    apply_archive_privileges,
    apply_hold_privileges,
    apply_row_level_security,
    archive_privileges_sql,
    hold_privileges_sql,
    least_privilege_sql,
)
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    run_partition,
)
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance_tests.helpers.policies import favorites_policy, location
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    FRESH,
    OLD,
    PARTITION,
    materialization,
    run_job,
)


def refuse_updates_by(engine, role: str) -> None:
    """A statement trigger of the test table that fails any UPDATE issued by ``role``."""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"""
            CREATE FUNCTION favorites.refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF current_user = '{role}' THEN
                    RAISE EXCEPTION 'the cleanup role issued an UPDATE';
                END IF;
                RETURN NULL;
            END $$;
            CREATE TRIGGER refuse_update BEFORE UPDATE ON favorites.favorites
                FOR EACH STATEMENT EXECUTE FUNCTION favorites.refuse_update();""")


def privileges(engine, role: str) -> set[tuple[str, str]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("""
            SELECT privilege_type, '*' FROM information_schema.table_privileges
             WHERE grantee = :r
            UNION
            SELECT privilege_type, column_name FROM information_schema.column_privileges
             WHERE grantee = :r
            UNION
            SELECT 'USAGE', nspname FROM pg_namespace
             WHERE has_schema_privilege(:r, oid, 'USAGE') AND nspname = 'favorites'
            UNION
            SELECT 'CREATE', nspname FROM pg_namespace
             WHERE has_schema_privilege(:r, oid, 'CREATE') AND nspname = 'favorites'
        """), {"r": role}).all()
    return {tuple(r) for r in rows}


def test_the_shipped_role_holds_only_what_the_job_needs(engine, roles):
    url = roles.create("cleanup", least_privilege=True)
    role = url.username
    assert privileges(engine, role) == {
        ("USAGE", "favorites"),
        ("SELECT", "id"), ("SELECT", "user_id"), ("SELECT", "updated_at"),
        ("DELETE", "*"),
        # Required by PostgreSQL for FOR UPDATE SKIP LOCKED; never used (see the next test).
        ("UPDATE", "updated_at"),
    }
    with engine.connect() as conn:
        attrs = conn.execute(sa.text(
            "SELECT rolsuper, rolcreatedb, rolcreaterole, rolinherit, rolreplication, "
            "rolbypassrls, rolcanlogin FROM pg_roles WHERE rolname = :r"), {"r": role}).one()
    assert tuple(attrs) == (False, False, False, False, False, False, True)


def test_the_whole_job_runs_under_the_least_privilege_role_and_never_updates(
        db_url, engine, rows, roles, monkeypatch):
    url = roles.create("cleanup", least_privilege=True)
    refuse_updates_by(engine, url.username)
    prunable = set(rows.add_many(2500, updated_at=OLD))
    keep = set(rows.add_many(100, updated_at=FRESH)) | set(
        rows.add_many(100, updated_at=OLD, user_id=5))

    with dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch, batch_size=1000)
        assert result.success
        meta = materialization(result)
    assert meta["deletedTotal"] == len(prunable) and meta["batches"] == 3
    assert meta["backlogRemaining"] == 0
    assert rows.ids() == keep

    # The role cannot read what is private, nor write anything but deletions.
    as_role = sa.create_engine(url)
    try:
        for forbidden in ("SELECT note FROM favorites.favorites",
                          "SELECT anonymous_id FROM favorites.favorites",
                          "SELECT * FROM favorites.favorites",
                          "INSERT INTO favorites.favorites (user_id, item_id) VALUES (1, 1)",
                          "UPDATE favorites.favorites SET user_id = 1",
                          "TRUNCATE favorites.favorites",
                          "CREATE TABLE favorites.x (i int)"):
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
                with as_role.begin() as conn:
                    conn.exec_driver_sql(forbidden)
    finally:
        as_role.dispose()


def test_the_sql_takes_the_role_name_as_a_quoted_identifier():
    text = least_privilege_sql(GUEST_FAVORITES, 'odd"name')
    assert 'CREATE ROLE "odd""name" LOGIN' in text
    assert ':"role"' not in text


def _archived_favorites(url, monkeypatch) -> dg.Definitions:
    """A code location whose policy ``archived_favorites`` purges the dev table into
    ``favorites.favorites_archive``, on ``url``."""
    guest_settings_env(monkeypatch)
    return location(favorites_policy("archived_favorites", batch_size=100,
                                     archive_table="favorites.favorites_archive"),
                    env={DATABASE_URL_VAR: url.render_as_string(hide_password=False)},
                    monkeypatch=monkeypatch)


def test_a_policy_with_an_archive_runs_under_the_role_and_its_archive_grants(
        engine, rows, roles, monkeypatch):
    url = roles.create("cleanup", least_privilege=True)
    apply_archive_privileges(engine, url.username, GUEST_FAVORITES, "favorites.favorites_archive")
    refuse_updates_by(engine, url.username)
    prunable = set(rows.add_many(250, updated_at=OLD))
    keep = set(rows.add_many(20, updated_at=FRESH)) | set(
        rows.add_many(20, updated_at=OLD, user_id=5))
    defs = _archived_favorites(url, monkeypatch)
    asset_key = dg.AssetKey(["favorites", "archived_favorites_cleanup"])
    with dg.instance_for_test() as instance:
        result = run_partition(defs, instance, PARTITION, job="archived_favorites_cleanup_job")
        assert result.success
        meta = materialization(result, asset_key=asset_key)
        assert (meta["deletedTotal"], meta["archiveRows"]) == (250, 250)
        assert rows.ids() == keep
        restored = defs.resolve_job_def("restore_archived_favorites_job").execute_in_process(
            run_config={"ops": {"restore_archived_favorites": {"config": {
                "run_id": result.run_id, "allow_prunable": True}}}}, instance=instance)
        assert restored.success
    assert rows.ids() == keep | prunable
    # The owner's archive is the one the job would have created: the job accepted it.
    with engine.connect() as conn:
        columns = table_columns(conn, "favorites.favorites")
    expected = create_archive_sql(ArchiveTarget("favorites.favorites_archive", "p", "r"),
                                  columns, engine.dialect)
    shipped = archive_privileges_sql(GUEST_FAVORITES, "r", "favorites.favorites_archive", columns)
    assert " ".join(expected.split()) in " ".join(shipped.split())


def test_without_the_archive_grants_the_run_refuses_before_any_delete(
        engine, rows, roles, monkeypatch):
    url = roles.create("cleanup", least_privilege=True)
    rows.add_many(30, updated_at=OLD)
    defs = _archived_favorites(url, monkeypatch)
    with dg.instance_for_test() as instance:
        result = run_partition(defs, instance, PARTITION, job="archived_favorites_cleanup_job",
                               raise_on_error=False)
    assert not result.success
    text = failure_text(result)
    assert ("archive favorites.favorites_archive does not exist and this role may not create "
            "it. Nothing was deleted") in text
    assert "CREATE TABLE favorites.favorites_archive (" in text
    assert rows.count() == 30


def test_a_policy_with_holds_runs_under_the_role_and_its_hold_grants(
        engine, rows, roles, monkeypatch):
    """The role reads the hold table (SELECT on the columns the hold test and the held_rows
    check read) and writes nothing there: the holds are placed by others."""
    url = roles.create("cleanup", least_privilege=True)
    holds = HoldTable.define("favorites.retention_holds", "id", "held_favorites")
    apply_hold_privileges(engine, url.username, GUEST_FAVORITES.with_hold(holds))
    refuse_updates_by(engine, url.username)
    prunable = set(rows.add_many(250, updated_at=OLD))
    held = rows.add(updated_at=OLD)
    keep = set(rows.add_many(20, updated_at=FRESH)) | {held}
    place_hold(engine, holds, str(held), reason="dispute", placed_by="support")
    guest_settings_env(monkeypatch)
    defs = location(favorites_policy("held_favorites", batch_size=100,
                                     hold_table="favorites.retention_holds"),
                    env={DATABASE_URL_VAR: url.render_as_string(hide_password=False)},
                    monkeypatch=monkeypatch)
    with dg.instance_for_test() as instance:
        result = run_partition(defs, instance, PARTITION, job="held_favorites_cleanup_job")
        assert result.success, failure_text(result)
        meta = materialization(
            result, asset_key=dg.AssetKey(["favorites", "held_favorites_cleanup"]))
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert (meta["deletedTotal"], meta["heldRows"]) == (len(prunable), 1)
    assert checks["held_rows"].passed
    assert {k: v.value for k, v in checks["held_rows"].metadata.items()}["activeHolds"] == 1
    assert rows.ids() == keep
    with engine.connect() as conn:
        granted = set(conn.execute(sa.text(
            "SELECT privilege_type, column_name FROM information_schema.column_privileges "
            "WHERE grantee = :r AND table_name = 'retention_holds'"), {"r": url.username}))
        whole = conn.execute(sa.text(
            "SELECT array_agg(privilege_type) FROM information_schema.table_privileges "
            "WHERE grantee = :r AND table_name = 'retention_holds'"),
            {"r": url.username}).scalar()
    assert granted == {("SELECT", c) for c in ("policy", "held_value", "placed_at",
                                                  "released_at")}
    assert whole is None  # no INSERT, UPDATE or DELETE: the job never writes a hold
    # The owner's hold table is the one hold init creates.
    shipped = " ".join(hold_privileges_sql(GUEST_FAVORITES.with_hold(holds), "r").split())
    for statement in create_hold_table_sql("favorites.retention_holds"):
        assert " ".join(statement.split()) in shipped


#: A second table's rule: another schema, a uuid key, two guard columns and another age column.
CARTS = RetentionRule.define("shop.carts", key_column="cart_uuid", age_column="touched_at",
                             null_columns=["customer_ref", "team_id"])


def test_the_grants_of_another_rule_cover_its_table_and_columns_only(engine, roles):
    """The grants are rendered from the rule, not written for favorites.favorites: on a second
    table with row-level security enabled, the role holds SELECT on that rule's key, guard and
    age columns only, and the purge run as it deletes exactly the rows the rule prunes."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE SCHEMA shop; CREATE TABLE shop.carts (cart_uuid uuid PRIMARY KEY DEFAULT "
            "gen_random_uuid(), customer_ref text, team_id bigint, address text, "
            "touched_at timestamptz NOT NULL); ALTER TABLE shop.carts ENABLE ROW LEVEL SECURITY;"
            "INSERT INTO shop.carts (customer_ref, team_id, address, touched_at) SELECT "
            "CASE WHEN mod(i, 4) = 1 THEN 'c' || i END, CASE WHEN mod(i, 4) = 2 THEN i END, 'street', "
            "now() - CASE WHEN mod(i, 4) = 3 THEN interval '1 day' ELSE interval '400 days' END "
            "FROM generate_series(1, 40) i")
    url = roles.create("carts", least_privilege=True, rule=CARTS)
    apply_row_level_security(engine, url.username, CARTS)
    with engine.connect() as conn:
        granted = set(conn.execute(sa.text(
            "SELECT privilege_type, table_schema || '.' || table_name || '.' || column_name "
            "FROM information_schema.column_privileges WHERE grantee = :r "
            "UNION SELECT privilege_type, table_schema || '.' || table_name "
            "FROM information_schema.table_privileges WHERE grantee = :r"),
            {"r": url.username}))
    assert granted == {("SELECT", "shop.carts.cart_uuid"), ("SELECT", "shop.carts.customer_ref"),
                       ("SELECT", "shop.carts.team_id"), ("SELECT", "shop.carts.touched_at"),
                       ("UPDATE", "shop.carts.touched_at"), ("DELETE", "shop.carts")}

    as_role = create_engine(url)
    try:
        cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=365)
        report = purge_rows(as_role, cutoff, rule=CARTS, batch_size=3,
                            max_run_duration=dt.timedelta(minutes=10))
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            with as_role.connect() as conn:
                conn.exec_driver_sql("SELECT address FROM shop.carts")
    finally:
        as_role.dispose()
    assert report.deleted_total == 10  # i % 4 = 0: no guard column set, 400 days old
    with engine.connect() as conn:
        left = conn.exec_driver_sql(
            "SELECT count(*) FILTER (WHERE customer_ref IS NOT NULL), count(*) FILTER "
            "(WHERE team_id IS NOT NULL), count(*) FILTER (WHERE touched_at > now() - "
            "interval '2 days') FROM shop.carts").one()
    assert tuple(left) == (10, 10, 10)
