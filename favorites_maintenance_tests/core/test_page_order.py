"""Page order against a real PostgreSQL: a backlog spread over the table walked in heap page
order, with every guarantee of the keyset order kept (held rows skipped, the rule checked again
by the DELETE, concurrent purges disjoint, the batch size a bound, stops between batches,
failing rows skipped), and the keyset order where the table, the role or the backlog call for
it."""

from __future__ import annotations

import datetime as dt
import importlib
import re
import time

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES, dev_favorites
from favorites_maintenance.retention import ScanMode, StopReason, measure_backlog
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.scan import PAGE_ORDER_MIN_PAGES
from favorites_maintenance_tests.core.test_purge import (
    CUTOFF,
    OLD,
    held_by_a_user,
    partition_by_updated_at,
)
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.helpers.sessions import run_concurrently
from favorites_maintenance_tests.reliability.conftest import Roles

UTC = dt.timezone.utc
TEN_MIN = dt.timedelta(minutes=10)
FRESH = CUTOFF + dt.timedelta(days=30)
PAGE = ScanMode.PAGE_ORDER
guest = dev_favorites.c.user_id.is_(None)
loop_preparation = importlib.import_module("favorites_maintenance.retention.loop_preparation")


def run(engine, **kwargs):
    kwargs.setdefault("batch_size", 1000)
    kwargs.setdefault("max_run_duration", TEN_MIN)
    return purge_rows(engine, CUTOFF, **kwargs)


def fill(engine, rows: int, *, old_guest_every: int, old_account_every: int = 0,
         old: dt.datetime = OLD) -> None:
    """Append ``rows`` rows in one statement: every ``old_guest_every``-th an old guest row
    (prunable, aged ``old``), every ``old_account_every``-th an old account row, the others
    fresh rows (aged a year after ``old``), so the prunable rows are spread over every page."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO favorites.favorites (user_id, anonymous_id, item_id, created_at, "
            "updated_at) "
            "SELECT CASE WHEN g % :guest = 0 THEN NULL ELSE 1 + g % 50 END, "
            "       CASE WHEN g % :guest = 0 THEN gen_random_uuid() END, g, :old, "
            "       CASE WHEN g % :guest = 0 OR (:account > 0 AND g % :account = 0) "
            "            THEN CAST(:old AS timestamptz) ELSE :fresh END "
            "  FROM generate_series(1, :n) AS g"),
            {"n": rows, "guest": old_guest_every, "account": old_account_every,
             "old": old, "fresh": old + dt.timedelta(days=365)})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE favorites.favorites"))


def heap_pages(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT pg_relation_size('favorites.favorites') / 8192")).scalar_one()


def test_page_order_deletes_exactly_the_prunable_rows_and_no_account_row(engine, rows):
    micro = dt.timedelta(microseconds=1)
    keep = set()
    # Prunable and kept rows side by side on the same pages, in several runs of each.
    for _ in range(3):
        rows.add_many(40, updated_at=OLD)
        keep |= set(rows.add_many(15, updated_at=OLD - dt.timedelta(days=900), user_id=7))
        keep |= set(rows.add_many(15, updated_at=FRESH))
    rows.add(updated_at=CUTOFF - micro)
    keep |= {rows.add(updated_at=CUTOFF), rows.add(updated_at=CUTOFF + micro),
             rows.add(updated_at=CUTOFF - micro, user_id=8)}
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO favorites.favorites (anonymous_id, item_id, created_at, updated_at) "
            "VALUES (gen_random_uuid(), 1, now(), '-infinity')"))

    report = run(engine, batch_size=7, scan=PAGE)

    assert report.scan_mode == "page_order"
    assert report.deleted_total == 122 and report.stop_reason is StopReason.EXHAUSTED
    assert rows.ids() == keep
    assert measure_backlog(engine, GUEST_FAVORITES, CUTOFF).remaining == 0


def large_from(monkeypatch, rows: int) -> None:
    """Take a backlog of ``rows`` rows (sampled) for a large one, as if it were a million."""
    monkeypatch.setattr("favorites_maintenance.retention.scan.PAGE_ORDER_MIN_ROWS", rows)


def test_a_backlog_spread_over_the_table_goes_in_page_order_a_days_worth_by_keyset(
        engine, rows, monkeypatch):
    fill(engine, 130_000, old_guest_every=3, old_account_every=7)
    assert heap_pages(engine) >= PAGE_ORDER_MIN_PAGES
    accounts = rows.accounts()

    # About 43,000 rows: spread, but done in keyset order before its batches slow down.
    small = run(engine, scan=None, max_run_duration=dt.timedelta(microseconds=1))
    assert small.scan_mode == "keyset"
    assert re.fullmatch(r"keyset order: about [0-9,]+ prunable rows \([0-9.]+ a page \(a sample "
                        r"of 256 of [0-9,]+ pages\)\), page order from 1,000,000",
                        small.scan_reason), small.scan_reason

    large_from(monkeypatch, 10_000)
    spread = run(engine)

    assert spread.scan_mode == "page_order"
    assert spread.scan_reason.startswith("page order: about ")
    assert small.deleted_total + spread.deleted_total == 130_000 // 3
    assert rows.accounts() == accounts
    assert measure_backlog(engine, GUEST_FAVORITES, CUTOFF).remaining == 0

    # A day's worth of newly expired rows on the same table: a few rows over many pages.
    day = set(rows.add_many(40, updated_at=OLD))
    daily = run(engine)
    assert daily.scan_mode == "keyset"
    assert daily.scan_reason.startswith("keyset order: 40 prunable rows over ")
    assert daily.deleted_total == 40 and not day & rows.ids()


def test_a_backlog_thin_over_every_page_goes_by_keyset_from_a_sample_of_the_pages(engine,
                                                                                    rows):
    # One row in 30 prunable: about 4 a page, more than a batch's 1,000 rows in all.
    fill(engine, 130_000, old_guest_every=30)
    report = run(engine, batch_size=1000)
    assert report.scan_mode == "keyset"
    sampled = re.fullmatch(r"keyset order: about ([0-9.]+) prunable rows a page \(a sample of "
                           r"256 of ([0-9,]+) pages\), page order from 15", report.scan_reason)
    assert sampled, report.scan_reason
    pages = int(sampled[2].replace(",", ""))
    assert pages == heap_pages(engine)
    # The sample's density is within a quarter of the table's.
    assert abs(float(sampled[1]) - 130_000 / 30 / pages) < 130_000 / 30 / pages / 4
    assert report.deleted_total == 130_000 // 30


def test_a_days_worth_counted_whole_goes_in_one_batch_when_the_size_adapts(engine, rows):
    fill(engine, 130_000, old_guest_every=3, old=OLD - dt.timedelta(days=400))
    cleared = run(engine)  # the backlog cleared: its time per row is known
    # A target far above what these batches take on any machine: the sizes below follow the
    # rows counted, not how loaded the machine was (at 200 ms, a slow first batch of 1,000
    # rows sized the next one under the 2,000 left).
    adaptive = dict(batch_size=1000, batch_size_max=10_000,
                    target_batch_duration=dt.timedelta(seconds=10))
    rows.add_many(1500, updated_at=OLD)
    batches = []
    report = run(engine, previous_row_s=cleared.row_s, on_batch=batches.append, **adaptive)
    assert report.scan_mode == "keyset"
    # At the previous run's time per row, the first batch holds the 1,500 rows counted.
    assert [b.deleted for b in batches] == [1500] and batches[0].batch_size > 1500
    assert report.deleted_total == 1500 and report.batches == 1
    # Nothing known: 1,000 rows first; at the rate they showed, the rest in one more, which
    # ends the run (a batch of exactly the rest would come back full, and one more would
    # find nothing).
    rows.add_many(3000, updated_at=OLD)
    unknown = []
    run(engine, on_batch=unknown.append, **adaptive)
    assert [(b.batch_size, b.deleted) for b in unknown] == [(1000, 1000), (2001, 2000)]
    # An explicit size stays the bound of every batch.
    rows.add_many(1500, updated_at=OLD)
    fixed = []
    run(engine, batch_size=1000, on_batch=fixed.append)
    assert [b.deleted for b in fixed] == [1000, 500]


def test_keyset_order_when_page_order_would_not_clear_the_backlog_within_the_budget(
        engine, rows, monkeypatch):
    fill(engine, 130_000, old_guest_every=3)
    large_from(monkeypatch, 10_000)
    # As if each page cost a second: page order would outlast the run, so the oldest go first.
    monkeypatch.setattr("favorites_maintenance.retention.scan.PAGE_COST_S", 1.0)
    report = run(engine, batch_size=500, max_run_duration=dt.timedelta(seconds=600))
    assert report.scan_mode == "keyset"
    assert "would take up to" in report.scan_reason and "more than the run's 600 s" in (
        report.scan_reason)


def test_a_run_that_falls_behind_in_page_order_goes_on_oldest_first(engine, rows, monkeypatch):
    fill(engine, 130_000, old_guest_every=3)
    oldest = set(rows.add_many(30, updated_at=OLD - dt.timedelta(days=400)))
    monkeypatch.setattr(loop_preparation, "PROJECT_AFTER_S", 0.0)
    # Each batch sleeps 0.3 s: at 50 rows a batch the pages left would take far longer than
    # the 20 s budget, so after its first batch the run turns to keyset order.
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.slow() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(0.3); RETURN NULL; END $$"))
        conn.execute(sa.text("CREATE TRIGGER slow AFTER DELETE ON favorites.favorites "
                             "FOR EACH STATEMENT EXECUTE FUNCTION favorites.slow()"))
    done = []
    report = run(engine, batch_size=50, scan=PAGE, max_run_duration=dt.timedelta(seconds=20),
                 on_batch=done.append, should_stop=lambda: len(done) >= 3)

    assert report.scan_mode == "page_order,keyset"
    assert "then keyset order, oldest first, from batch 2" in report.scan_reason
    # The keyset batches took the oldest rows: the 30 rows 400 days older than the others.
    assert not oldest & rows.ids()
    assert report.deleted_total == 150


def test_page_order_skips_rows_other_sessions_hold_and_leaves_them_as_backlog(engine, rows):
    ids = rows.add_many(60, updated_at=OLD)
    held = {ids[3], ids[30]}  # in the first (locking) batch and in an optimistic one
    with held_by_a_user(engine, ids[3]), held_by_a_user(engine, ids[30]):
        # Waiting on a held row for more than a second would fail the batch (lock_timeout).
        report = run(engine, batch_size=10, scan=PAGE, lock_timeout=dt.timedelta(seconds=1))
        assert report.scan_mode == "page_order"
        assert report.deleted_total == 58 and report.skipped_rows == 0
        assert measure_backlog(engine, GUEST_FAVORITES, CUTOFF).remaining == 2
    assert rows.ids() == held


def test_a_row_claimed_between_the_count_and_the_delete_is_not_deleted(engine, rows,
                                                                        monkeypatch):
    """An optimistic page-order batch counts its rows, then deletes them: the DELETE checks the
    guard again, so a row an account claims in between is left, the counts differ, and the
    batch is taken again locking first; the claimed row stays."""
    from favorites_maintenance.retention import scan

    ids = rows.add_many(50, updated_at=OLD)
    claimed = ids[25]  # in an optimistic batch: the first batch always locks first
    with engine.connect() as conn:
        where = scan.parse_tid(conn.execute(sa.text(
            "SELECT ctid::text FROM favorites.favorites WHERE id = :id"), {"id": claimed}
        ).scalar_one())
    execute, claims = scan.PageScan.execute, []

    def claim_after_the_count(self, conn, statement, params):
        if statement is not self.statements.delete:
            return execute(self, conn, statement, params)
        bound = conn.execute(self.statements.bound, params).one()
        if not claims and (scan.parse_tid(bound.first_tid) <= where
                           <= scan.parse_tid(bound.last_tid)):
            claims.append(claimed)  # the user's transaction commits between the two
            with engine.begin() as user:
                user.execute(sa.update(dev_favorites).where(dev_favorites.c.id == claimed)
                             .values(user_id=42))
        deleted = conn.execute(statement, {"after_tid": params["after_tid"],
                                           "last_tid": bound.last_tid}).rowcount
        return scan.PageBatch(bound.selected, deleted, bound.first_tid, bound.last_tid)

    monkeypatch.setattr(scan.PageScan, "execute", claim_after_the_count)
    report = run(engine, batch_size=10, scan=PAGE)

    assert claims == [claimed]
    assert report.deleted_total == 49
    assert rows.ids() == {claimed}
    with engine.connect() as conn:
        assert conn.execute(sa.select(dev_favorites.c.user_id)
                            .where(dev_favorites.c.id == claimed)).scalar_one() == 42


def test_two_purges_at_once_in_page_order_delete_each_row_once(db_url, rows):
    prunable = set(rows.add_many(3000, updated_at=OLD))
    accounts = set(rows.add_many(300, updated_at=OLD, user_id=3))
    fresh = set(rows.add_many(200, updated_at=FRESH))

    def worker(_):
        engine = create_engine(db_url)
        try:
            return run(engine, batch_size=100, scan=PAGE, on_batch=lambda b: time.sleep(0.002))
        finally:
            engine.dispose()

    reports = run_concurrently(2, worker)
    assert [r.scan_mode for r in reports] == ["page_order", "page_order"]
    left = rows.ids() - accounts - fresh
    assert left <= prunable
    # Disjoint: together they deleted each row they took once, and both took some.
    assert sum(r.deleted_total for r in reports) == len(prunable) - len(left)
    assert all(r.deleted_total > 0 for r in reports), [r.deleted_total for r in reports]
    assert rows.ids() == accounts | fresh | left


@pytest.mark.parametrize("sizes", [{"batch_size": 64},
                                   {"batch_size": 40, "batch_size_max": 90,
                                    "target_batch_duration": dt.timedelta(milliseconds=200)}],
                         ids=["fixed", "capped"])
def test_the_batch_size_bounds_every_transaction_in_page_order(engine, rows, sizes):
    for _ in range(4):
        rows.add_many(300, updated_at=OLD)
        rows.add_many(20, updated_at=OLD, user_id=5)
    with engine.begin() as conn:
        # Each DELETE statement notes its transaction and how many rows it deleted.
        conn.execute(sa.text("CREATE TABLE favorites.per_tx (tx bigint, n bigint)"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.per_tx() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN INSERT INTO favorites.per_tx SELECT txid_current(), count(*) FROM gone; "
            "RETURN NULL; END $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER per_tx AFTER DELETE ON favorites.favorites REFERENCING OLD TABLE "
            "AS gone FOR EACH STATEMENT EXECUTE FUNCTION favorites.per_tx()"))

    report = run(engine, scan=PAGE, **sizes)

    bound = sizes.get("batch_size_max", sizes["batch_size"])
    with engine.connect() as conn:
        per_tx = dict(conn.execute(sa.text(
            "SELECT tx, sum(n) FROM favorites.per_tx GROUP BY tx")).all())
    assert report.scan_mode == "page_order" and report.deleted_total == 1200
    assert sum(per_tx.values()) == 1200
    assert max(per_tx.values()) <= bound and report.batch_size_max <= bound
    assert len([n for n in per_tx.values() if n]) >= 1200 // bound


def test_a_row_whose_delete_fails_is_skipped_and_the_others_are_deleted(engine, rows):
    ids = rows.add_many(40, updated_at=OLD)
    failing = ids[17]
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF OLD.id = {failing} THEN RAISE EXCEPTION 'kept'; END IF; RETURN OLD; "
            "END $$"))
        conn.execute(sa.text("CREATE TRIGGER refuse BEFORE DELETE ON favorites.favorites "
                             "FOR EACH ROW EXECUTE FUNCTION favorites.refuse()"))

    report = run(engine, batch_size=8, scan=PAGE)

    assert report.scan_mode == "page_order"
    assert (report.deleted_total, report.skipped_rows) == (39, 1)
    assert report.isolation_batches > 0
    assert rows.ids() == {failing}


def test_rows_a_trigger_swallows_are_skipped_rows_in_page_order(engine, rows):
    ids = rows.add_many(300, updated_at=OLD)
    swallowed = ids[150]
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.keep_one() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF OLD.id = {swallowed} THEN RETURN NULL; END IF; RETURN OLD; END $$"))
        conn.execute(sa.text("CREATE TRIGGER keep_one BEFORE DELETE ON favorites.favorites "
                             "FOR EACH ROW EXECUTE FUNCTION favorites.keep_one()"))

    report = run(engine, batch_size=50, scan=PAGE)

    assert (report.deleted_total, report.skipped_rows) == (299, 1)
    assert rows.ids() == {swallowed}


def test_stop_requests_and_the_time_budget_end_a_page_order_run_between_batches(engine,
                                                                                 rows):
    rows.add_many(500, updated_at=OLD)
    done = []
    stopped = run(engine, batch_size=50, scan=PAGE, on_batch=done.append,
                  should_stop=lambda: len(done) >= 3)
    assert (stopped.stop_reason, stopped.deleted_total) == (StopReason.STOP_REQUESTED, 150)

    budget = run(engine, batch_size=50, scan=PAGE, max_run_duration=dt.timedelta(microseconds=1))
    assert (budget.stop_reason, budget.deleted_total) == (StopReason.MAX_RUN_DURATION, 50)
    assert rows.count() == 300


def test_page_order_is_refused_for_a_partitioned_table(engine, rows):
    partition_by_updated_at(engine, "2025-01-01")
    older = set(rows.add_many(200, updated_at=dt.datetime(2024, 1, 1, tzinfo=UTC)))
    old = set(rows.add_many(200, updated_at=OLD))
    accounts = set(rows.add_many(50, updated_at=OLD, user_id=5))

    report = run(engine, batch_size=100, scan=PAGE)

    assert report.scan_mode == "keyset"
    assert report.scan_reason == ("keyset order: the table is partitioned (row addresses "
                                  "repeat across partitions)")
    assert report.deleted_total == len(older | old)
    assert rows.ids() == accounts


def test_page_order_is_refused_for_a_role_that_may_not_read_ctid(db_url, engine, rows):
    roles = Roles(db_url, engine)
    try:
        url = roles.create(
            "noctid", "GRANT USAGE ON SCHEMA favorites TO {role}",
            "GRANT SELECT (id, user_id, updated_at) ON favorites.favorites TO {role}",
            "GRANT DELETE ON favorites.favorites TO {role}",
            "GRANT UPDATE (updated_at) ON favorites.favorites TO {role}")
        prunable = set(rows.add_many(120, updated_at=OLD))
        accounts = set(rows.add_many(20, updated_at=OLD, user_id=5))
        as_role = create_engine(url)
        try:
            report = run(as_role, batch_size=50, scan=PAGE)
        finally:
            as_role.dispose()
    finally:
        roles.drop_all()
    assert (report.scan_mode, report.scan_reason) == (
        "keyset", "keyset order: the role may not read ctid")
    assert report.deleted_total == len(prunable)
    assert rows.ids() == accounts


def test_page_order_is_refused_for_a_table_with_row_level_security(engine, rows):
    rows.add_many(30, updated_at=OLD)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE favorites.favorites ENABLE ROW LEVEL SECURITY"))
    report = run(engine, batch_size=10, scan=PAGE)
    assert (report.scan_mode, report.scan_reason) == (
        "keyset", "keyset order: the table has row-level security")
    assert report.deleted_total == 30


def test_keyset_order_asked_for_reads_no_estimate(engine, rows):
    fill(engine, 130_000, old_guest_every=3)
    report = run(engine, scan=ScanMode.KEYSET)
    assert (report.scan_mode, report.scan_reason) == ("keyset", "keyset order, as asked")
    assert report.deleted_total == 130_000 // 3
