"""Connection loss: the purge's backend is killed in the middle of a batch.

The batch in flight rolls back whole, the batches committed before it stay deleted, the run
fails and says so, the next run finishes the work, and the totals reported by both runs add up
to what really disappeared.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import dev_favorites
from favorites_maintenance.retention import BatchError
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.helpers.sessions import kill_when
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    FRESH,
    OLD,
    mark_slow,
    materialization,
    run_job,
    slow_delete,
    step_failure,
)

BATCH = 100
N = 1000
SLOW_AT = 350  # the 351st oldest row: inside batch 4


def test_a_killed_backend_rolls_back_its_batch_only_and_the_next_purge_finishes(engine, rows):
    rows.add_many(N, updated_at=OLD)
    keep = rows.add_many(50, updated_at=FRESH) + rows.add_many(50, updated_at=OLD, user_id=4)
    mark_slow(engine, SLOW_AT)

    with slow_delete(engine):
        with kill_when(engine) as killed:
            with pytest.raises(BatchError) as raised:
                purge_rows(engine, CUTOFF, batch_size=BATCH, max_run_duration=dt.timedelta(minutes=5))
    assert killed

    err = raised.value
    assert err.batch_no == 4
    assert (err.report.deleted_total, err.report.batches) == (300, 3)
    # Batch 4 rolled back whole: the 50 rows it had deleted before the slow one are back too.
    assert rows.count(dev_favorites.c.user_id.is_(None)) == N - 300 + 50
    assert err.kind == "connection_lost"

    # Same engine, nothing reset by hand: the dead connection is replaced.
    again = purge_rows(engine, CUTOFF, batch_size=BATCH, max_run_duration=dt.timedelta(minutes=5))
    assert again.deleted_total == N - 300
    assert err.report.deleted_total + again.deleted_total == N
    assert rows.ids() == set(keep)


def test_a_run_whose_backend_is_killed_fails_and_the_next_run_finishes(db_url, engine, rows):
    rows.add_many(N, updated_at=OLD)
    keep = set(rows.add_many(20, updated_at=FRESH) + rows.add_many(20, updated_at=OLD, user_id=4))
    mark_slow(engine, SLOW_AT)

    with dg.instance_for_test() as instance:
        with slow_delete(engine):
            with kill_when(engine) as killed:
                first = run_job(db_url, instance, batch_size=BATCH)
        assert killed
        assert not first.success
        assert materialization(first) is None  # never reported as a successful (no-)op
        step, error = step_failure(first)
        assert step.endswith("purge")
        assert "batch 4" in error.cause.message if error.cause else "batch 4" in error.message
        logs = [e.user_message for e in instance.all_logs(first.run_id)]
        [failed_line] = [m for m in logs if m.startswith("run failed")]
        assert "batch_no=4" in failed_line and "deleted_before=300" in failed_line
        assert rows.count(dev_favorites.c.user_id.is_(None)) == N - 300 + 20

        second = run_job(db_url, instance, batch_size=BATCH)
        assert second.success
        meta = materialization(second)
    assert meta["deletedTotal"] == N - 300
    assert meta["backlogRemaining"] == 0
    assert rows.ids() == keep


def test_a_killed_batch_is_retried_and_the_run_reports_everything_it_deleted(
        db_url, engine, rows):
    rows.add_many(N, updated_at=OLD)
    keep = set(rows.add_many(20, updated_at=FRESH))
    mark_slow(engine, SLOW_AT)

    with dg.instance_for_test() as instance:
        with slow_delete(engine, once=True):
            with kill_when(engine) as killed:
                result = run_job(db_url, instance, batch_size=BATCH, retries=2)
        assert killed
        assert result.success  # a lost connection is transient: the op retried
        retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        meta = materialization(result)
    assert len(retries) == 1
    # The run deleted all N rows, 300 of them in the attempt that failed: it says so.
    assert meta["deletedTotal"] == N
    assert meta["batches"] == N // BATCH
    assert meta["backlogRemaining"] == 0
    assert rows.ids() == keep


def sleep_in_delete_number(engine, table: str, n: int) -> None:
    """The ``n``-th DELETE statement on ``table`` sleeps 60 s inside its transaction (a
    statement-level trigger): its backend can be killed mid-batch."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SEQUENCE favorites.deletes"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.sleep_once() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF nextval('favorites.deletes') = {n} THEN PERFORM pg_sleep(60); END IF; "
            "RETURN NULL; END $$"))
        conn.execute(sa.text(f"CREATE TRIGGER sleep_once BEFORE DELETE ON {table} "
                             "FOR EACH STATEMENT EXECUTE FUNCTION favorites.sleep_once()"))


def test_a_page_order_batch_whose_backend_is_killed_is_retried_and_counted_once(
        db_url, engine, rows, monkeypatch):
    from favorites_maintenance_tests.core.test_page_order import fill

    fill(engine, 60_000, old_guest_every=3, old_account_every=7, old=OLD)
    monkeypatch.setattr("favorites_maintenance.retention.scan.PAGE_ORDER_MIN_ROWS", 5_000)
    monkeypatch.setattr("favorites_maintenance.retention.scan.PAGE_ORDER_MIN_PAGES", 256)
    accounts, total = rows.accounts(), rows.count()
    sleep_in_delete_number(engine, "favorites.favorites", 3)

    with dg.instance_for_test() as instance:
        with kill_when(engine) as killed:
            result = run_job(db_url, instance, batch_size=2000, retries=2)
        assert killed
        assert result.success
        retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        meta = materialization(result)
    assert len(retries) == 1
    assert meta["scanMode"] == "page_order"
    assert rows.accounts() == accounts
    assert meta["deletedTotal"] == total - rows.count() == 20_000
    assert meta["backlogRemaining"] == 0
