"""Zero progress is not success: whatever silently swallows the deletes fails the run.

Row-level security without an UPDATE policy (``FOR UPDATE`` then locks nothing), a DELETE policy
narrower than the others, a ``BEFORE DELETE`` trigger returning NULL: the statements succeed and
delete nothing. A run that sees rows no other session holds yet deletes none of them (or far
fewer than it selected) fails and names what it found on the table. Rows that users hold stay a
backlog, as before, and a few swallowed rows are skipped rows, not a failure.
"""

from __future__ import annotations

import datetime as dt
import threading

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES, dev_favorites
from favorites_maintenance.retention import BatchError
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.least_privilege import apply_row_level_security
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    OLD,
    delete_trigger,
    error_text,
    materialization,
    run_job,
    step_failure,
)


def enable_rls(engine, *policies: str) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE favorites.favorites ENABLE ROW LEVEL SECURITY")
        for i, policy in enumerate(policies):
            conn.exec_driver_sql(f"CREATE POLICY p{i} ON favorites.favorites {policy}")


def failure_text(result) -> str:
    assert not result.success
    step, error = step_failure(result)
    assert step.endswith("purge")
    return error_text(error)


def test_row_level_security_without_an_update_policy_fails_the_run(
        db_url, engine, rows, roles, monkeypatch):
    rows.add_many(50, updated_at=OLD)
    accounts = set(rows.add_many(5, updated_at=OLD, user_id=1))
    enable_rls(engine, "FOR SELECT USING (true)", "FOR DELETE USING (user_id IS NULL)")
    url = roles.create("cleanup", least_privilege=True)

    with dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch)
        [failed] = [e.user_message for e in instance.all_logs(result.run_id)
                    if e.user_message.startswith("run failed")]

    text = failure_text(result)
    assert "NoProgressError" in text
    assert "batch_no=1 " in failed  # the one batch, which locked nothing
    assert ("the rule matches 50 rows of favorites.favorites that no other session holds, yet "
            "the purge could lock none of them") in text
    assert "row-level security is enabled (2 policies)" in text
    assert "FOR UPDATE also needs an UPDATE policy" in text
    assert rows.count() == 55

    # The shipped policies admit the role to guest rows: the next run deletes them all.
    apply_row_level_security(engine, url.username, GUEST_FAVORITES)
    with dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch)
    assert result.success
    assert materialization(result)["deletedTotal"] == 50
    assert rows.ids() == accounts


def test_a_delete_policy_narrower_than_the_lock_fails_the_run(
        db_url, engine, rows, roles, monkeypatch):
    rows.add_many(30, updated_at=OLD)
    enable_rls(engine, "FOR SELECT USING (true)", "FOR UPDATE USING (true)",
               "FOR DELETE USING (false)")
    url = roles.create("cleanup", least_privilege=True)

    with dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch)

    text = failure_text(result)
    assert "the batches selected 30 rows of favorites.favorites but deleted only 0" in text
    assert "row-level security is enabled (3 policies)" in text
    assert rows.count() == 30


def swallow_deletes(engine, where: str = "true") -> None:
    delete_trigger(engine, "keep_rows", f"IF {where} THEN RETURN NULL; END IF; RETURN OLD;")


def test_a_before_delete_trigger_returning_null_fails_the_run_naming_it(
        db_url, engine, rows, monkeypatch):
    rows.add_many(2500, updated_at=OLD)
    swallow_deletes(engine)

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)

    text = failure_text(result)
    # It stops after the first full batch, not after reading the whole table.
    assert "the batches selected 1000 rows of favorites.favorites but deleted only 0" in text
    assert "BEFORE DELETE trigger keep_rows" in text
    assert rows.count() == 2500


def test_a_few_swallowed_rows_are_skipped_rows_and_the_run_succeeds(
        db_url, engine, rows, monkeypatch):
    ids = sorted(rows.add_many(30, updated_at=OLD))
    kept = ids[10]
    swallow_deletes(engine, f"OLD.id = {kept}")

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch, batch_size=10)

    assert result.success
    meta = materialization(result)
    assert (meta["deletedTotal"], meta["skippedRows"]) == (29, 1)
    assert "deleted no row although it was locked" in meta["skippedCauses"]
    assert rows.ids() == {kept}


def test_rows_held_by_users_are_a_backlog_not_a_failure(db_url, engine, rows, monkeypatch):
    ids = rows.add_many(20, updated_at=OLD)
    locked = threading.Event()
    release = threading.Event()

    def hold():
        with engine.begin() as conn:
            conn.execute(sa.select(dev_favorites.c.id).where(dev_favorites.c.id.in_(ids))
                         .with_for_update())
            locked.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert locked.wait(10)
    try:
        with dg.instance_for_test() as instance:
            result = run_job(db_url, instance, monkeypatch=monkeypatch)
    finally:
        release.set()
        holder.join(10)

    assert result.success
    meta = materialization(result)
    assert (meta["deletedTotal"], meta["backlogRemaining"], meta["stopReason"]) == (
        0, 20, "exhausted")


@pytest.mark.parametrize("setup", ["empty", "only_accounts_and_fresh"])
def test_nothing_to_delete_is_still_a_success(db_url, engine, rows, monkeypatch, setup):
    if setup == "only_accounts_and_fresh":
        rows.add_many(10, updated_at=OLD, user_id=4)
    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
    assert result.success
    assert materialization(result)["deletedTotal"] == 0


@pytest.mark.parametrize("batch_size, protected", [(10, 6), (1, 1)])
def test_a_few_swallowed_rows_at_the_head_of_the_table_never_fail_the_run(
        engine, rows, batch_size, protected):
    # Every run starts at the oldest rows: judging the first small batch alone would fail
    # every run for good.
    ids = sorted(rows.add_many(200, updated_at=OLD))
    kept = set(ids[:protected])
    swallow_deletes(engine, f"OLD.id <= {max(kept)}")

    report = purge_rows(engine, CUTOFF, batch_size=batch_size, max_run_duration=dt.timedelta(
        minutes=5))

    assert (report.deleted_total, report.skipped_rows) == (200 - protected, protected)
    assert rows.ids() == kept


def test_rows_deleted_by_another_session_during_the_check_are_no_failure(db_url, engine, rows):
    rows.add_many(5, updated_at=OLD)
    other = engine.connect()
    held = other.begin()
    other.execute(sa.delete(dev_favorites))  # another session deletes them, not yet committed
    job_engine = create_engine(db_url)

    @sa.event.listens_for(job_engine, "before_cursor_execute")
    def commit_the_other_first(conn, cursor, statement, *args):
        # The other session commits between the zero-progress check's count and its lock.
        if "NOWAIT" in statement and held.is_active:
            held.commit()

    try:
        report = purge_rows(job_engine, CUTOFF, batch_size=10, max_run_duration=dt.timedelta(
            minutes=5))
    finally:
        other.close()
        job_engine.dispose()
    assert report.deleted_total == 0
    assert rows.count() == 0


def test_a_delete_rule_fails_the_batch_naming_what_the_server_refused(engine, rows):
    rows.add_many(20, updated_at=OLD)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE RULE keep AS ON DELETE TO favorites.favorites DO INSTEAD NOTHING")
    with pytest.raises(BatchError) as raised:
        purge_rows(engine, CUTOFF, batch_size=7, max_run_duration=dt.timedelta(minutes=5))
    assert "feature_not_supported" in str(raised.value)
    assert 'cannot perform DELETE RETURNING on relation "favorites"' in str(raised.value)
    assert rows.count() == 20
