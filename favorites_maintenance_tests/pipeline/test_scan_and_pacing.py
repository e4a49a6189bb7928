"""Through Dagster: the run records the order its batches took (``scanMode``, ``scanReason``)
and the time it paused between them for ``sleep_ratio`` (``pacedMs``)."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance_tests.core.test_page_order import fill
from favorites_maintenance_tests.helpers.clock import OLD, PARTITION
from favorites_maintenance_tests.helpers.jobs import materialization, run_job

UTC = dt.timezone.utc


def per_transaction(engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(
            "SELECT count(*) FROM favorites.deleted_by GROUP BY txid")).scalars())


def test_a_spread_backlog_goes_in_page_order_within_the_explicit_batch_size(
        db_url, engine, rows, monkeypatch):
    fill(engine, 130_000, old_guest_every=3, old=OLD)
    # A backlog of 43,000 rows taken for a large one (the threshold is a million).
    monkeypatch.setattr("favorites_maintenance.retention.scan.PAGE_ORDER_MIN_ROWS", 10_000)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE favorites.deleted_by (txid bigint NOT NULL)"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.record_delete() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN INSERT INTO favorites.deleted_by VALUES (txid_current()); RETURN OLD; "
            "END $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER record_delete AFTER DELETE ON favorites.favorites "
            "FOR EACH ROW EXECUTE FUNCTION favorites.record_delete()"))

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, partition=PARTITION, monkeypatch=monkeypatch,
                         batch_size=3000)
        messages = [e.user_message for e in instance.all_logs(result.run_id)
                    if not e.dagster_event]

    assert result.success
    meta = materialization(result)
    assert meta["scanMode"] == "page_order"
    assert meta["scanReason"].startswith("page order: about ")
    # The core's reason is in the run's log too, where the operator reads the run.
    assert f"favorites.favorites: {meta['scanReason']}" in messages
    assert meta["deletedTotal"] == 130_000 // 3 and meta["backlogRemaining"] == 0
    assert meta["batchSizeMode"] == "fixed" and meta["pacedMs"] == 0
    counts = per_transaction(engine)
    assert sum(counts) == 130_000 // 3 and max(counts) <= 3000


def test_a_days_worth_goes_by_keyset_and_sleep_ratio_paces_it(db_url, engine, rows,
                                                               monkeypatch):
    rows.add_many(120, updated_at=OLD)
    with dg.instance_for_test() as instance:
        paced = run_job(db_url, instance, partition=PARTITION, monkeypatch=monkeypatch,
                        batch_size=25, sleep_ratio=1)
        rows.add_many(120, updated_at=OLD)
        unpaced = run_job(db_url, instance, partition=PARTITION, monkeypatch=monkeypatch,
                          batch_size=25)

    assert paced.success and unpaced.success
    meta, plain = materialization(paced), materialization(unpaced)
    assert meta["scanMode"] == plain["scanMode"] == "keyset"
    assert meta["scanReason"].startswith("keyset order: the table has ")
    assert meta["deletedTotal"] == plain["deletedTotal"] == 120
    # Five full batches, each followed by a pause at least as long as itself.
    assert meta["pacedMs"] > 0 and plain["pacedMs"] == 0
