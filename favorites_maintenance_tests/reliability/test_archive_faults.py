"""Faults during a purge with an archive: a backend killed in the middle of a batch, a run
terminated while a batch is open. Whatever happens, every row is in the table or in the
archive: never both, never neither, and an archived row is the row as it was.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
import time

import dagster as dg
import pytest

from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers import archive as shop
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    materialization,
    purge_retries,
    run_partition,
)
from favorites_maintenance_tests.helpers.policies import location
from favorites_maintenance_tests.helpers.sessions import kill_when

BATCH = 10


@pytest.fixture
def env(db_url, engine, monkeypatch):
    shop.create_items(engine)
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    monkeypatch.delenv(shop.RETENTION_VAR, raising=False)
    guest_settings_env(monkeypatch)
    return monkeypatch


def shop_defs(batch_size: int) -> dg.Definitions:
    return location(shop.policy(batch_size=batch_size))


def run_shop(defs, instance) -> dg.ExecuteInProcessResult:
    return run_partition(defs, instance, shop.PARTITION, job=shop.JOB, raise_on_error=False,
                         run_config=purge_retries(0, asset_key=shop.ASSET_KEY))


def assert_each_row_in_one_place(engine, original: dict[int, tuple]) -> tuple[set, set]:
    """Every original row in exactly one of the table and the archive, archived as it was."""
    in_table = shop.ids_of(engine, shop.TABLE)
    in_archive = shop.ids_of(engine, shop.ARCHIVE)
    assert len(in_archive) == len(set(in_archive)), "a row archived twice"
    assert not set(in_table) & set(in_archive), "a row in both places"
    assert set(in_table) | set(in_archive) == set(original), "a row in neither place"
    assert shop.rows_of(engine, shop.ARCHIVE) == {i: original[i] for i in in_archive}
    assert shop.rows_of(engine, shop.TABLE) == {i: original[i] for i in in_table}
    return set(in_table), set(in_archive)


def slow_row_trigger(engine, seconds: float) -> None:
    """A batch sleeps ``seconds`` inside its DELETE when it reaches the row noted ``SLOW``."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION shop.slow_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"IF OLD.note = 'SLOW' THEN PERFORM pg_sleep({seconds}); END IF; RETURN OLD; "
            "END $$; CREATE TRIGGER slow_row BEFORE DELETE ON shop.items FOR EACH ROW "
            "EXECUTE FUNCTION shop.slow_row()")


def test_a_backend_killed_mid_batch_leaves_each_row_in_one_place(env, engine):
    shop.add_items(engine, 35, updated_at=shop.OLD)
    # The 36th row, in batch 4, makes its batch sleep.
    shop.add_items(engine, 1, updated_at=shop.OLD + dt.timedelta(seconds=40), note="SLOW")
    shop.add_items(engine, 34, updated_at=shop.OLD + dt.timedelta(seconds=50))
    original = shop.rows_of(engine, shop.TABLE)
    slow_row_trigger(engine, 30)
    defs = shop_defs(BATCH)

    with dg.instance_for_test() as instance:
        with kill_when(engine) as killed:
            first = run_shop(defs, instance)
        assert killed
        assert not first.success
        assert "batch 4 failed and was rolled back" in failure_text(first)
        # Batches 1-3 moved; batch 4 rolled back whole, the rows it had deleted included.
        in_table, in_archive = assert_each_row_in_one_place(engine, original)
        assert len(in_archive) == 3 * BATCH

        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER slow_row ON shop.items")
        second = run_shop(defs, instance)
        assert second.success, failure_text(second)
        meta = materialization(second, asset_key=shop.ASSET_KEY)
    assert (meta["deletedTotal"], meta["archiveRows"]) == (len(in_table), 70)
    assert assert_each_row_in_one_place(engine, original) == (set(), set(original))


class Terminator(threading.Thread):
    """Terminates the run as the UI's "Terminate" does (the run marked CANCELING, then SIGINT
    to its worker, this process) while a batch is open, once ``rows_in(table)`` reached
    ``after_rows``; notes that count at the signal."""

    def __init__(self, engine, instance, table: str, after_rows: int):
        super().__init__(daemon=True)
        self.engine, self.instance, self.table = engine, instance, table
        self.after_rows = after_rows
        self.rows_at_signal = None

    def run(self):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with self.engine.connect() as conn:
                exists = conn.exec_driver_sql(
                    f"SELECT to_regclass('{self.table}') IS NOT NULL").scalar()
                rows = conn.exec_driver_sql(
                    f"SELECT count(*) FROM {self.table}").scalar() if exists else 0
                open_batch = conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                    "AND application_name = 'favorites-maintenance'").scalar()
            if rows >= self.after_rows and open_batch:
                [run] = self.instance.get_runs(limit=1)
                self.instance.report_run_canceling(run)
                self.rows_at_signal = rows
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)


def test_a_run_terminated_with_a_batch_open_leaves_each_row_in_one_place(env, engine):
    batch = 50
    shop.add_items(engine, 1500, updated_at=shop.OLD)
    original = shop.rows_of(engine, shop.TABLE)
    with engine.begin() as conn:  # every batch stays open 0.2 s, inside its DELETE
        conn.exec_driver_sql(
            "CREATE FUNCTION shop.slow_batch() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "PERFORM pg_sleep(0.2); RETURN NULL; END $$; CREATE TRIGGER slow_batch BEFORE "
            "DELETE ON shop.items FOR EACH STATEMENT EXECUTE FUNCTION shop.slow_batch()")
    defs = shop_defs(batch)
    with dg.instance_for_test() as instance:
        terminator = Terminator(engine, instance, shop.ARCHIVE, after_rows=5 * batch)
        terminator.start()
        result = run_shop(defs, instance)
        terminator.join(30)
        run = instance.get_run_by_id(result.run_id)
    assert run.status == dg.DagsterRunStatus.CANCELED
    assert terminator.rows_at_signal is not None
    _, in_archive = assert_each_row_in_one_place(engine, original)
    # The batch open at the request committed whole, and none started after it.
    assert len(in_archive) % batch == 0
    assert 0 <= len(in_archive) - terminator.rows_at_signal <= batch
    assert len(in_archive) < len(original)


def test_a_backend_killed_mid_restore_batch_leaves_each_row_in_one_place(env, engine):
    import datetime as dt

    shop.add_items(engine, 400, updated_at=shop.OLD)
    shop.add_items(engine, 1, updated_at=shop.OLD + dt.timedelta(hours=1), note="SLOW")
    original = shop.rows_of(engine, shop.TABLE)
    defs = shop_defs(100)
    with engine.begin() as conn:  # a restored row noted SLOW sleeps in the table's trigger
        conn.exec_driver_sql(
            "CREATE FUNCTION shop.slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.note = 'SLOW' THEN PERFORM pg_sleep(30); END IF; RETURN NEW; END $$; "
            "CREATE TRIGGER slow_insert BEFORE INSERT ON shop.items FOR EACH ROW "
            "EXECUTE FUNCTION shop.slow_insert()")

    def restore(run_id):
        return defs.resolve_job_def(shop.RESTORE_JOB).execute_in_process(
            run_config={"ops": {shop.RESTORE_OP: {"config": {
                "run_id": run_id, "allow_prunable": True, "batch_size": 50}}}},
            instance=instance, raise_on_error=False)

    with dg.instance_for_test() as instance:
        purged = run_shop(defs, instance)
        assert purged.success, failure_text(purged)
        with kill_when(engine) as killed:
            first = restore(purged.run_id)
        assert killed
        assert not first.success
        assert "failed and was rolled back, its rows left in the archive" in failure_text(first)
        in_table, in_archive = assert_each_row_in_one_place(engine, original)
        assert in_archive  # the batch with the slow row, and those after it
        with engine.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER slow_insert ON shop.items")
        second = restore(purged.run_id)
        assert second.success, failure_text(second)
    assert assert_each_row_in_one_place(engine, original) == (set(original), set())


def test_a_restore_terminated_with_a_batch_open_ends_canceled_each_row_in_one_place(env,
                                                                                   engine):
    shop.add_items(engine, 1500, updated_at=shop.OLD)
    original = shop.rows_of(engine, shop.TABLE)
    defs = shop_defs(500)
    with dg.instance_for_test() as instance:
        purged = run_shop(defs, instance)
        assert purged.success, failure_text(purged)
        with engine.begin() as conn:  # every restore batch stays open 0.2 s in its INSERT
            conn.exec_driver_sql(
                "CREATE FUNCTION shop.slow_restore() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN PERFORM pg_sleep(0.2); RETURN NULL; END $$; CREATE TRIGGER slow_restore "
                "BEFORE INSERT ON shop.items FOR EACH STATEMENT "
                "EXECUTE FUNCTION shop.slow_restore()")
        terminator = Terminator(engine, instance, shop.TABLE, after_rows=200)
        terminator.start()
        result = defs.resolve_job_def(shop.RESTORE_JOB).execute_in_process(
            run_config={"ops": {shop.RESTORE_OP: {"config": {
                "run_id": purged.run_id, "allow_prunable": True, "batch_size": 50}}}},
            instance=instance, raise_on_error=False)
        terminator.join(30)
        run = instance.get_run_by_id(result.run_id)
    assert run.status == dg.DagsterRunStatus.CANCELED
    assert terminator.rows_at_signal is not None
    in_table, in_archive = assert_each_row_in_one_place(engine, original)
    assert in_table and in_archive
