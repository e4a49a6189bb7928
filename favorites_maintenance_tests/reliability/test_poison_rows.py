"""Rows that cannot be deleted (a reference, a trigger, a cascade) never stop the rest.

A failed batch is split into halves, each in its own transaction, down to the single rows that
fail; those are skipped for the run and reported (count, causes by schema object, a WARN check),
and the purge goes on past them. A table where every candidate fails ends the run as a failure
that names the cause, after a bounded number of transactions.
"""

from __future__ import annotations

import datetime as dt
import logging

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES, dev_favorites
from favorites_maintenance.retention import SkippedRowsError
from favorites_maintenance.retention.run_counts import BLOCKED_AFTER
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    OLD,
    SENTINEL_ANON,
    SENTINEL_NOTE,
    delete_trigger,
    error_text,
    everything_dagster_recorded,
    materialization,
    run_job,
    step_failure,
)

TEN_MIN = dt.timedelta(minutes=10)


def nth_oldest(engine, n: int) -> int:
    """Id of the ``n``-th oldest row (1-based) in the purge's order."""
    with engine.connect() as conn:
        return conn.execute(sa.select(dev_favorites.c.id)
                            .order_by(dev_favorites.c.updated_at, dev_favorites.c.id)
                            .offset(n - 1).limit(1)).scalar_one()


def reference(engine, favorite_id: int, *, on_delete: str = "RESTRICT",
              deferred: bool = False, table: str = "refs") -> None:
    """A row of ``favorites.<table>`` referencing ``favorite_id``."""
    deferrable = " DEFERRABLE INITIALLY DEFERRED" if deferred else ""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS favorites.{table} (id serial PRIMARY KEY, "
            f"favorite_id bigint CONSTRAINT {table}_favorite_fk REFERENCES "
            f"favorites.favorites(id) ON DELETE {on_delete}{deferrable})")
        conn.exec_driver_sql(f"INSERT INTO favorites.{table} (favorite_id) VALUES ({favorite_id})")


def guest_rows_with_sentinels(rows, n: int) -> None:
    for i in range(n):
        rows.add(updated_at=OLD + dt.timedelta(minutes=i), note=SENTINEL_NOTE,
                 anonymous_id=SENTINEL_ANON)


def check_results(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_a_referenced_row_is_skipped_and_the_other_29_are_deleted_every_day(
        db_url, engine, rows, monkeypatch, all_logs):
    guest_rows_with_sentinels(rows, 30)
    accounts = set(rows.add_many(5, updated_at=OLD, user_id=3))
    poison = nth_oldest(engine, 13)
    reference(engine, poison)

    with dg.instance_for_test() as instance:
        results = [run_job(db_url, instance, monkeypatch=monkeypatch, batch_size=10)
                   for _ in range(3)]
        recorded = everything_dagster_recorded(instance, results[0].run_id)
        messages = [entry.user_message for entry in instance.all_logs(results[0].run_id)]

    first = results[0]
    assert first.success
    assert rows.ids() == {poison} | accounts
    meta = materialization(first)
    assert meta["deletedTotal"] == 29
    assert meta["skippedRows"] == 1
    assert meta["skippedCauses"] == ("restrict_violation (SQLSTATE 23001) from constraint "
                                     "favorites.refs_favorite_fk on favorites.refs")
    # Split 10 -> 5 -> 2 -> 1 around the row, then grown back: a handful of transactions.
    assert 0 < meta["isolationBatches"] <= 12
    assert meta["backlogRemaining"] == 1
    checks = check_results(first)
    assert not checks["no_rows_skipped"].passed
    assert checks["no_rows_skipped"].severity == dg.AssetCheckSeverity.WARN
    assert "refs_favorite_fk" in checks["no_rows_skipped"].description
    # One log line per distinct cause, the key at WARNING, and never a private column.
    assert sum("rows skipped: restrict_violation" in m for m in messages) == 1
    assert sum(f"skipped row id={poison} " in m for m in messages) == 1
    for text in (recorded, all_logs.text):
        assert SENTINEL_NOTE not in text and SENTINEL_ANON not in text

    # The next days: the row is still referenced, still skipped, and the run still succeeds.
    for later in results[1:]:
        assert later.success
        later_meta = materialization(later)
        assert (later_meta["deletedTotal"], later_meta["skippedRows"]) == (0, 1)
    assert rows.ids() == {poison} | accounts


@pytest.mark.parametrize("blocker", ["no_action", "deferred", "trigger", "cascade"])
def test_each_kind_of_row_level_error_is_isolated_and_named(engine, rows, blocker):
    rows.add_many(40, updated_at=OLD)
    poison = {nth_oldest(engine, 7), nth_oldest(engine, 31)}
    if blocker == "no_action":
        for favorite_id in poison:
            reference(engine, favorite_id, on_delete="NO ACTION")
        cause = ("foreign_key_violation (SQLSTATE 23503) from constraint "
                 "favorites.refs_favorite_fk on favorites.refs")
    elif blocker == "deferred":
        # Checked at COMMIT, not at the statement: the batch's commit fails.
        for favorite_id in poison:
            reference(engine, favorite_id, on_delete="NO ACTION", deferred=True)
        cause = ("foreign_key_violation (SQLSTATE 23503) from constraint "
                 "favorites.refs_favorite_fk on favorites.refs")
    elif blocker == "trigger":
        delete_trigger(engine, "refuse_flagged", f"""
            IF OLD.id IN ({', '.join(map(str, poison))}) THEN
                RAISE EXCEPTION 'cannot delete %%', OLD.note;
            END IF;
            RETURN OLD;""")
        cause = "raise_exception (SQLSTATE P0001) from function favorites.refuse_flagged()"
    else:
        # A cascade into a child table whose own child restricts: the violation is raised on
        # the child table, by the cascade.
        with engine.begin() as conn:
            conn.exec_driver_sql("""
                CREATE TABLE favorites.shares (id serial PRIMARY KEY, favorite_id bigint
                    REFERENCES favorites.favorites(id) ON DELETE CASCADE);
                CREATE TABLE favorites.share_views (id serial PRIMARY KEY, share_id int
                    CONSTRAINT share_views_share_fk REFERENCES favorites.shares(id)
                    ON DELETE RESTRICT);""")
            for favorite_id in poison:
                share = conn.exec_driver_sql(
                    f"INSERT INTO favorites.shares (favorite_id) VALUES ({favorite_id}) "
                    "RETURNING id").scalar_one()
                conn.exec_driver_sql(
                    f"INSERT INTO favorites.share_views (share_id) VALUES ({share})")
        cause = ("restrict_violation (SQLSTATE 23001) from constraint "
                 "favorites.share_views_share_fk on favorites.share_views")

    report = purge_rows(engine, CUTOFF, batch_size=16, max_run_duration=TEN_MIN)

    assert rows.ids() == poison
    assert (report.deleted_total, report.skipped_rows) == (38, 2)
    assert report.skipped_causes == (cause,)
    assert report.isolation_batches > 0


def refuse_all_deletes(engine) -> None:
    delete_trigger(engine, "refuse_all", "RAISE EXCEPTION 'deletes are frozen';")


def test_a_table_where_every_row_fails_fails_the_run_naming_the_cause(
        db_url, engine, rows, monkeypatch):
    rows.add_many(500, updated_at=OLD)
    refuse_all_deletes(engine)

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch, batch_size=100)
        [failed] = [e.user_message for e in instance.all_logs(result.run_id)
                    if e.user_message.startswith("run failed")]

    assert not result.success
    step, error = step_failure(result)
    assert step.endswith("purge")
    text = error_text(error)
    assert "SkippedRowsError" in text and "looks blocked" in text
    assert "raise_exception (SQLSTATE P0001) from function favorites.refuse_all()" in text
    # The batch that ended the run: six halvings (100 -> 3 rows), then ten one-row batches.
    assert "batch_no=16 " in failed
    assert rows.count() == 500


def test_the_cost_of_finding_a_blocked_table_is_bounded(engine, rows):
    rows.add_many(5000, updated_at=OLD)
    refuse_all_deletes(engine)

    with pytest.raises(SkippedRowsError) as raised:
        purge_rows(engine, CUTOFF, batch_size=1000, max_run_duration=TEN_MIN)

    report = raised.value.report
    assert (report.deleted_total, report.skipped_rows) == (0, BLOCKED_AFTER)
    # 1000 -> 500 -> ... -> 1 is 9 splits, then one transaction per row up to BLOCKED_AFTER:
    # bounded by the batch size's logarithm, not by the table's size.
    assert report.isolation_batches <= 9 + BLOCKED_AFTER


def test_the_cap_on_skipped_rows_stops_a_run_that_would_skip_too_many(engine, rows):
    ids = rows.add_many(60, updated_at=OLD)
    # Every third row referenced: never ten failures in a row, but many in all.
    for favorite_id in sorted(ids)[::3]:
        reference(engine, favorite_id)

    with pytest.raises(SkippedRowsError) as raised:
        purge_rows(engine, CUTOFF, batch_size=8, max_run_duration=TEN_MIN, max_skipped_rows=5)

    assert raised.value.report.skipped_rows == 6
    assert "more than 5 prunable rows could not be deleted" in str(raised.value)
    assert "refs_favorite_fk" in str(raised.value)


def test_an_account_row_is_never_deleted_while_batches_are_split(engine, rows):
    guests = rows.add_many(20, updated_at=OLD)
    accounts = set(rows.add_many(20, updated_at=OLD, user_id=9))
    reference(engine, sorted(guests)[4])

    report = purge_rows(engine, CUTOFF, batch_size=8, max_run_duration=TEN_MIN)

    assert report.deleted_total == 19
    assert rows.ids() == accounts | {sorted(guests)[4]}


def test_database_errors_name_the_constraint_never_the_detail_values(engine, rows, caplog):
    caplog.set_level(logging.DEBUG)
    rows.add(updated_at=OLD, note=SENTINEL_NOTE, anonymous_id=SENTINEL_ANON)
    favorite_id = 987654321  # a value the DETAIL line quotes, to be found nowhere else
    with engine.begin() as conn:
        conn.execute(sa.update(dev_favorites).values(id=favorite_id))
    reference(engine, favorite_id)
    with pytest.raises(sa.exc.IntegrityError) as raised:
        with engine.begin() as conn:
            conn.execute(sa.delete(dev_favorites))
    from favorites_maintenance.retention.errors import describe

    error = describe(raised.value)
    assert "Key (id)" in str(raised.value.orig.diag.message_detail)  # what the server said
    assert str(error) == (
        "restrict_violation: RestrictViolation (SQLSTATE 23001): update or delete on table "
        '"favorites" violates RESTRICT setting of foreign key constraint "refs_favorite_fk" on '
        'table "refs" [schema favorites, table refs, constraint refs_favorite_fk]')
    assert str(favorite_id) not in str(error)


@pytest.mark.parametrize("when", ["0100-01-01 00:00:00+00 BC", "0001-01-01 00:00:00+00",
                                  "-infinity"])
def test_a_referenced_row_at_an_instant_python_cannot_hold_is_skipped_once(engine, rows, when):
    # Such instants load as datetime.min; the keyset must still move past the skipped row.
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO favorites.favorites (id, anonymous_id, item_id, updated_at) "
            f"OVERRIDING SYSTEM VALUE VALUES (1000000, gen_random_uuid(), 1, '{when}')")
    reference(engine, 1000000)
    ordinary = rows.add_many(20, updated_at=OLD)

    report = purge_rows(engine, CUTOFF, batch_size=5, max_run_duration=TEN_MIN)

    assert (report.deleted_total, report.skipped_rows) == (len(ordinary), 1)
    assert rows.ids() == {1000000}


def test_a_row_a_row_level_security_policy_raises_for_is_located_and_skipped(
        db_url, engine, rows, roles, monkeypatch, all_logs):
    """The policy's expression fails for one row (a division by zero), so even the one-row
    lookup that names a row before its delete fails on it: the row is located without being
    read, skipped and named by its key; the others are deleted."""
    from favorites_maintenance.retention.least_privilege import apply_row_level_security

    guest_rows_with_sentinels(rows, 40)
    accounts = set(rows.add_many(5, updated_at=OLD, user_id=3))
    poison = nth_oldest(engine, 23)
    url = roles.create("cleanup", least_privilege=True)
    apply_row_level_security(engine, url.username, GUEST_FAVORITES)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE favorites.favorites ENABLE ROW LEVEL SECURITY")
        conn.exec_driver_sql(
            f'CREATE POLICY fragile ON favorites.favorites AS RESTRICTIVE TO "{url.username}" '
            f"USING ((1.0 / (id - {poison})) IS NOT NULL)")

    with dg.instance_for_test() as instance:
        first = run_job(url, instance, monkeypatch=monkeypatch, batch_size=8)
        second = run_job(url, instance, monkeypatch=monkeypatch, batch_size=8)
        recorded = everything_dagster_recorded(instance, first.run_id)
        messages = [e.user_message for e in instance.all_logs(first.run_id)]

    assert first.success
    meta = materialization(first)
    assert (meta["deletedTotal"], meta["skippedRows"]) == (39, 1)
    assert meta["skippedCauses"] == "data_exception (SQLSTATE 22012)"
    # Counted around the row it cannot read, which the backlog and the SLO check count too.
    assert meta["backlogRemaining"] == 1
    overdue = {e.check_name: e for e in first.get_asset_check_evaluations()}[
        "no_guest_row_older_than_retention_plus_one_day"]
    assert overdue.metadata["overdueGuestRows"].value == 1
    assert rows.ids() == {poison} | accounts
    assert sum(f"skipped row id={poison} " in m for m in messages) == 1
    # The next day: the row is located and skipped again, the run succeeds.
    assert second.success and materialization(second)["skippedRows"] == 1
    for text in (recorded, all_logs.text):
        assert SENTINEL_NOTE not in text and SENTINEL_ANON not in text


def test_a_row_exactly_at_an_inclusive_cutoff_that_cannot_be_read_is_located_and_skipped(
        engine, rows, roles):
    """An inclusive rule prunes the row at the cutoff: when a row-level security policy
    raises for that row, it is located at the cutoff itself, skipped and counted, not missed
    by a search that would end just before it."""
    from favorites_maintenance.retention.backlog import measure_backlog
    from favorites_maintenance.retention.database import create_engine
    from favorites_maintenance.retention.least_privilege import apply_row_level_security
    from favorites_maintenance.retention.rule import RetentionRule

    rule = RetentionRule.define("favorites.favorites", key_column="id",
                                age_column="updated_at", null_columns=["user_id"],
                                cutoff_inclusive=True)
    older = set(rows.add_many(5, updated_at=OLD))
    poison = rows.add(updated_at=CUTOFF)
    newer = rows.add(updated_at=CUTOFF + dt.timedelta(microseconds=1))
    url = roles.create("cleanup", least_privilege=True)
    apply_row_level_security(engine, url.username, GUEST_FAVORITES)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE favorites.favorites ENABLE ROW LEVEL SECURITY")
        conn.exec_driver_sql(
            f'CREATE POLICY fragile ON favorites.favorites AS RESTRICTIVE TO "{url.username}" '
            f"USING ((1.0 / (id - {poison})) IS NOT NULL)")
    job = create_engine(url)
    try:
        report = purge_rows(job, CUTOFF, batch_size=8, max_run_duration=TEN_MIN, rule=rule)
        assert (report.deleted_total, report.skipped_rows) == (len(older), 1)
        assert rows.ids() == {poison, newer}
        # Counted around the row it cannot read.
        assert measure_backlog(job, rule, CUTOFF).remaining == 1
    finally:
        job.dispose()
