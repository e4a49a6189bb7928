"""The batched purge against a real PostgreSQL."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import threading
import time

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES, dev_favorites
from favorites_maintenance.retention import (
    BatchError,
    StopReason,
    measure_backlog,
)
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.helpers.sessions import run_concurrently

UTC = dt.timezone.utc
CUTOFF = dt.datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
OLD = CUTOFF - dt.timedelta(days=30)
TEN_MIN = dt.timedelta(minutes=10)
guest = dev_favorites.c.user_id.is_(None)
# The loop's module, whose tunable constants a test may patch.
purge_module = importlib.import_module("favorites_maintenance.retention.batch_loop")


def run(engine, **kwargs):
    kwargs.setdefault("batch_size", 1000)
    kwargs.setdefault("max_run_duration", TEN_MIN)
    return purge_rows(engine, CUTOFF, **kwargs)


def open_transactions(engine) -> int:
    """Sessions of the purge left idle inside a transaction."""
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'favorites-maintenance'"
            " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()")).scalar_one()


def test_empty_table_is_a_successful_no_op(engine):
    report = run(engine)
    assert (report.deleted_total, report.batches, report.stop_reason) == (
        0, 0, StopReason.EXHAUSTED)


def test_boundary_points_on_both_sides_of_the_cutoff(engine, rows):
    micro = dt.timedelta(microseconds=1)
    just_older = rows.add(updated_at=CUTOFF - micro)
    at_cutoff = rows.add(updated_at=CUTOFF)
    just_newer = rows.add(updated_at=CUTOFF + micro)
    fresh = rows.add(updated_at=CUTOFF + dt.timedelta(days=300))
    old_account = rows.add(updated_at=CUTOFF - dt.timedelta(days=3000), user_id=7)
    account_at_boundary = rows.add(updated_at=CUTOFF - micro, user_id=8)

    report = run(engine)

    assert report.deleted_total == 1
    assert rows.ids() == {at_cutoff, just_newer, fresh, old_account, account_at_boundary}
    assert just_older not in rows.ids()


def test_many_rows_go_in_several_batches_each_committed_on_its_own(engine, rows):
    rows.add_many(2500, updated_at=OLD)
    rows.add_many(300, updated_at=OLD - dt.timedelta(days=900), user_id=42)
    seen_from_outside = []

    def on_batch(batch):
        # Another session sees the batch deleted: it was committed before the next one began.
        seen_from_outside.append(rows.count(guest))

    report = run(engine, batch_size=1000, on_batch=on_batch)

    assert report.deleted_total == 2500
    assert report.batches == 3
    assert seen_from_outside == [1500, 500, 0]
    assert rows.accounts() == 300
    assert rows.count(guest) == 0


def test_a_second_run_deletes_nothing(engine, rows):
    rows.add_many(1200, updated_at=OLD)
    assert run(engine, batch_size=500).deleted_total == 1200
    second = run(engine, batch_size=500)
    assert (second.deleted_total, second.batches) == (0, 0)


def test_a_full_last_batch_ends_with_an_empty_batch_that_is_not_counted(engine, rows):
    rows.add_many(1000, updated_at=OLD)
    report = run(engine, batch_size=500)
    assert (report.deleted_total, report.batches) == (1000, 2)


def test_rows_sharing_one_updated_at_across_batch_borders_are_all_deleted(engine, rows):
    # 700 rows with the same updated_at: the keyset must go on by id within one timestamp.
    rows.add_many(700, updated_at=OLD, step=dt.timedelta(0))
    report = run(engine, batch_size=100)
    assert (report.deleted_total, report.batches) == (700, 7)
    assert rows.count() == 0


def test_two_workers_at_once_delete_every_row_exactly_once(db_url, rows):
    prunable_ids = set(rows.add_many(6000, updated_at=OLD))
    accounts = set(rows.add_many(500, updated_at=OLD, user_id=3))
    fresh = set(rows.add_many(200, updated_at=CUTOFF + dt.timedelta(days=1)))

    def worker(_):
        engine = create_engine(db_url)
        try:
            # A short pause per batch makes the two runs overlap for real.
            return run(engine, batch_size=100, on_batch=lambda b: time.sleep(0.002))
        finally:
            engine.dispose()

    reports = run_concurrently(2, worker)
    assert sum(r.deleted_total for r in reports) == len(prunable_ids)
    assert all(r.deleted_total > 0 for r in reports), [r.deleted_total for r in reports]
    assert rows.ids() == accounts | fresh


@contextlib.contextmanager
def held_by_a_user(engine, row_id: int):
    """A user transaction holding ``row_id`` (``FOR UPDATE``) until the block ends."""
    user = engine.connect()
    try:
        user.begin()
        user.execute(sa.select(dev_favorites.c.id).where(dev_favorites.c.id == row_id)
                     .with_for_update())
        yield
    finally:
        user.rollback()
        user.close()


def test_a_row_locked_by_a_user_is_skipped_not_waited_on(engine, rows):
    locked = rows.add(updated_at=OLD)
    others = rows.add_many(50, updated_at=OLD + dt.timedelta(seconds=5))
    with held_by_a_user(engine, locked):
        t0 = time.monotonic()
        # A wait for the user's lock would last the whole minute of the lock timeout.
        report = run(engine, batch_size=10, lock_timeout=dt.timedelta(seconds=60))
        assert time.monotonic() - t0 < 30  # never waited for the user's lock
        assert report.deleted_total == len(others)
        assert measure_backlog(engine, GUEST_FAVORITES, CUTOFF).remaining == 1
    assert rows.ids() == {locked}


def test_stop_request_between_batches_keeps_committed_batches_and_no_open_transaction(
        engine, rows):
    rows.add_many(1000, updated_at=OLD)
    done = []

    report = run(engine, batch_size=100, on_batch=done.append, should_stop=lambda: len(done) >= 3)

    assert report.stop_reason is StopReason.STOP_REQUESTED
    assert report.deleted_total == 300 and report.batches == 3
    assert rows.count() == 700
    assert open_transactions(engine) == 0


def test_max_run_duration_ends_the_run_successfully_with_a_backlog(engine, rows):
    rows.add_many(1000, updated_at=OLD)
    report = run(engine, batch_size=100, max_run_duration=dt.timedelta(milliseconds=250),
                 on_batch=lambda b: time.sleep(0.1))

    assert report.stop_reason is StopReason.MAX_RUN_DURATION
    assert 100 <= report.deleted_total < 1000
    assert measure_backlog(engine, GUEST_FAVORITES, CUTOFF).remaining == 1000 - report.deleted_total


def test_a_failing_batch_rolls_back_alone_and_is_raised(engine, rows):
    rows.add_many(500, updated_at=OLD)
    blocker = engine.connect()

    def on_batch(batch):
        if batch.batch_no == 1:  # a migration takes the table after batch 1
            blocker.begin()
            blocker.execute(sa.text("LOCK TABLE favorites.favorites IN ACCESS EXCLUSIVE MODE"))

    try:
        with pytest.raises(BatchError) as raised:
            run(engine, batch_size=100, on_batch=on_batch,
                lock_timeout=dt.timedelta(milliseconds=100))
    finally:
        blocker.rollback()
        blocker.close()

    err = raised.value
    assert err.batch_no == 2
    assert err.report.deleted_total == 100
    assert "LockNotAvailable" in str(err) or "lock timeout" in str(err)
    assert rows.count() == 400
    assert open_transactions(engine) == 0


def test_session_time_zone_does_not_change_what_is_deleted(db_url, rows):
    micro = dt.timedelta(microseconds=1)
    keep = {rows.add(updated_at=CUTOFF), rows.add(updated_at=CUTOFF + micro)}
    rows.add(updated_at=CUTOFF - micro)
    far_east = create_engine(db_url, connect_args={"options": "-c timezone=Pacific/Kiritimati"})
    try:
        with far_east.connect() as conn:
            assert conn.execute(sa.text("SHOW timezone")).scalar_one() == "Pacific/Kiritimati"
        report = purge_rows(far_east, CUTOFF, batch_size=10, max_run_duration=TEN_MIN)
    finally:
        far_east.dispose()
    assert report.deleted_total == 1
    assert rows.ids() == keep


def partition_by_updated_at(engine, boundary: str) -> None:
    """Make favorites.favorites a table partitioned by ``updated_at``: before and from
    ``boundary`` (an ISO date), keyed by ``(id, updated_at)``."""
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE favorites.favorites"))
        conn.execute(sa.text(
            "CREATE TABLE favorites.favorites (id bigint GENERATED BY DEFAULT AS IDENTITY, "
            "user_id bigint, anonymous_id uuid, item_id bigint NOT NULL, note text, "
            "created_at timestamptz NOT NULL DEFAULT now(), "
            "updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, updated_at)) "
            "PARTITION BY RANGE (updated_at)"))
        conn.execute(sa.text(
            "CREATE TABLE favorites.favorites_old PARTITION OF favorites.favorites "
            f"FOR VALUES FROM (MINVALUE) TO ('{boundary}')"))
        conn.execute(sa.text(
            "CREATE TABLE favorites.favorites_new PARTITION OF favorites.favorites "
            f"FOR VALUES FROM ('{boundary}') TO (MAXVALUE)"))
        conn.execute(sa.text(
            "CREATE INDEX ON favorites.favorites (updated_at, id) WHERE user_id IS NULL"))


def test_a_partitioned_table_is_purged_by_primary_key(engine, rows):
    # Row addresses repeat across partitions, so the purge must not match rows by ctid there.
    partition_by_updated_at(engine, "2025-01-01")
    # Prunable rows at the same row addresses in both partitions, account rows after them.
    older_guests = set(rows.add_many(300, updated_at=dt.datetime(2024, 1, 1, tzinfo=UTC)))
    old_guests = set(rows.add_many(300, updated_at=OLD))
    accounts = set(rows.add_many(100, updated_at=OLD, user_id=5))
    fresh = set(rows.add_many(100, updated_at=CUTOFF + dt.timedelta(days=1)))
    per_batch = []

    report = run(engine, batch_size=100, on_batch=lambda b: per_batch.append(b.deleted))

    assert report.deleted_total == len(older_guests | old_guests)
    assert per_batch == [100] * 6 + [0]
    assert rows.ids() == accounts | fresh


def test_rows_at_minus_infinity_and_before_christ_are_deleted_like_any_old_row(engine, rows):
    accounts = {rows.add(updated_at=OLD, user_id=1)}
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO favorites.favorites (anonymous_id, item_id, created_at, updated_at) "
            "SELECT gen_random_uuid(), 1, now(), v::timestamptz FROM (VALUES ('-infinity'), "
            "('-infinity'), ('0044-03-15 12:00:00+00 BC'), ('0001-01-01 00:00:00+00')) AS t(v)"))
        conn.execute(sa.text(
            "INSERT INTO favorites.favorites (user_id, item_id, created_at, updated_at) "
            "VALUES (2, 1, now(), '-infinity')"))
        future = conn.execute(sa.text(
            "INSERT INTO favorites.favorites (anonymous_id, item_id, created_at, updated_at) "
            "VALUES (gen_random_uuid(), 1, now(), 'infinity') RETURNING id")).scalar_one()
    before = measure_backlog(engine, GUEST_FAVORITES, CUTOFF)
    assert before.remaining == 4

    report = run(engine, batch_size=2)

    assert report.deleted_total == 4
    assert measure_backlog(engine, GUEST_FAVORITES, CUTOFF).remaining == 0
    assert rows.count(guest) == 1 and future in rows.ids()
    assert rows.accounts() == 2 and accounts <= rows.ids()


def test_every_run_deletes_at_least_one_batch_however_small_its_budget(engine, rows):
    rows.add_many(30, updated_at=OLD)
    report = run(engine, batch_size=10, max_run_duration=dt.timedelta(microseconds=1))
    assert (report.deleted_total, report.stop_reason) == (10, StopReason.MAX_RUN_DURATION)


def note_settings_of_each_batch(engine, *names: str) -> None:
    """Record, in ``favorites.seen.settings``, the values of ``names`` (space-separated) that
    each DELETE statement runs under, from a statement trigger."""
    values = ", ".join(f"current_setting('{name}')" for name in names)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE favorites.seen (settings text)"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.note_settings() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN INSERT INTO favorites.seen VALUES (concat_ws(' ', {values})); "
            "RETURN NULL; END $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER note_settings AFTER DELETE ON favorites.favorites "
            "FOR EACH STATEMENT EXECUTE FUNCTION favorites.note_settings()"))


@pytest.mark.parametrize("synchronous_commit", [False, True])
@pytest.mark.parametrize("optimistic", [False, True])
def test_each_batch_runs_under_its_limits_and_commit_mode_and_leaves_the_session_as_it_was(
        engine, rows, synchronous_commit, optimistic):
    rows.add_many(30, updated_at=OLD)
    note_settings_of_each_batch(engine, "lock_timeout", "statement_timeout", "synchronous_commit",
                                "enable_incremental_sort", "enable_hashjoin", "enable_mergejoin")
    report = run(engine, batch_size=10, lock_timeout=dt.timedelta(milliseconds=1500),
                 statement_timeout=dt.timedelta(seconds=20),
                 synchronous_commit=synchronous_commit, optimistic=optimistic)
    assert report.deleted_total == 30
    with engine.connect() as conn:
        seen = list(conn.execute(sa.text("SELECT settings FROM favorites.seen")).scalars())
        after = conn.execute(sa.text("SELECT concat_ws(' ', current_setting('lock_timeout'), "
                                     "current_setting('synchronous_commit'))")).scalar_one()
    commit = "on" if synchronous_commit else "off"
    # Optimistic batches wait 5 ms for a lock, from the first: nothing on this table can
    # refuse the lock the locking form would take (no row-level security, UPDATE granted).
    # enable_incremental_sort off: the partial index hands the batch its rows in keyset order.
    # Hash and merge joins off: the DELETE reaches the batch's rows by their address.
    assert set(seen) == {f"{'5ms' if optimistic else '1500ms'} 20s {commit} off off off"}
    # Three full batches and the empty one that ends the run; an optimistic batch that counts
    # no candidate runs no DELETE.
    assert len(seen) == (3 if optimistic else 4)
    assert after == "0 on"  # SET LOCAL: the pooled session keeps its own values


def test_on_a_table_with_row_level_security_the_first_batch_locks_first(engine, rows):
    rows.add_many(30, updated_at=OLD)
    note_settings_of_each_batch(engine, "lock_timeout")
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE favorites.favorites ENABLE ROW LEVEL SECURITY"))
    report = run(engine, batch_size=10, lock_timeout=dt.timedelta(milliseconds=1500))
    assert report.deleted_total == 30
    with engine.connect() as conn:
        seen = list(conn.execute(sa.text("SELECT settings FROM favorites.seen")).scalars())
    # The first batch proves the role may lock what the rule matches; the others need not.
    # (The empty optimistic batch that ends the run counts no candidate and runs no DELETE.)
    assert seen == ["1500ms", "5ms", "5ms"]


def test_an_optimistic_batch_that_meets_a_held_row_is_taken_again_with_skip_locked(engine,
                                                                                    rows):
    ids = rows.add_many(50, updated_at=OLD)
    held = ids[25]  # in the third batch: the first batch always locks first
    with held_by_a_user(engine, held):
        t0 = time.monotonic()
        report = run(engine, batch_size=10, lock_timeout=dt.timedelta(seconds=60))
        assert time.monotonic() - t0 < 30  # waited 5 ms for the user's lock, not the minute
        assert report.deleted_total == 49
        assert report.skipped_rows == 0  # a held row is backlog, not a skipped row
    assert rows.ids() == {held}


def wait_until_the_purge_waits_on_a_lock(engine) -> None:
    """Return once the purge's batch statement waits on a row lock (fail after 20 s)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND application_name = 'favorites-maintenance' "
                    "AND (query LIKE 'WITH retention_batch%' "
                    "     OR query LIKE 'DELETE FROM favorites.favorites%')")).scalar_one():
                return
        time.sleep(0.02)
    raise AssertionError("the batch statement never waited on a lock")


def purge_while_a_user_commits(engine, monkeypatch, change):
    """Run the purge (batches of 10) while a user transaction holds ``change`` uncommitted;
    commit it once an optimistic DELETE waits on it; return the purge's report."""
    # Long enough to commit the change while the DELETE waits, in a test.
    monkeypatch.setattr(purge_module, "OPTIMISTIC_LOCK_TIMEOUT", dt.timedelta(seconds=20))
    user = engine.connect()
    result = {}
    try:
        user.begin()
        user.execute(change)
        worker = threading.Thread(target=lambda: result.update(
            report=run(engine, batch_size=10, lock_timeout=dt.timedelta(seconds=30))))
        worker.start()
        wait_until_the_purge_waits_on_a_lock(engine)
        user.commit()
        worker.join(30)
    finally:
        user.close()
    return result["report"]


def test_a_row_claimed_while_an_optimistic_delete_waits_for_it_is_not_deleted(
        engine, rows, monkeypatch):
    """The DELETE re-checks the guard on the row's newest version: a guest row that became an
    account row while the batch waited for it stays, and so does its new owner."""
    ids = rows.add_many(50, updated_at=OLD)
    claimed = ids[25]
    report = purge_while_a_user_commits(engine, monkeypatch, sa.update(dev_favorites).where(
        dev_favorites.c.id == claimed).values(user_id=42))
    assert report.deleted_total == 49
    assert rows.ids() == {claimed}
    with engine.connect() as conn:
        assert conn.execute(sa.select(dev_favorites.c.user_id)
                            .where(dev_favorites.c.id == claimed)).scalar_one() == 42


def test_without_the_keyset_index_the_planner_keeps_its_incremental_sort(engine, rows):
    from favorites_maintenance.local.guest_favorites import RECOMMENDED_INDEX_NAME

    rows.add_many(15, updated_at=OLD)
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP INDEX favorites.{RECOMMENDED_INDEX_NAME}"))
    note_settings_of_each_batch(engine, "enable_incremental_sort")
    assert run(engine, batch_size=10).deleted_total == 15
    with engine.connect() as conn:
        # Without that index a full sort of the whole range could cost far more.
        assert set(conn.execute(sa.text("SELECT settings FROM favorites.seen")).scalars()) == {"on"}


def test_a_row_moved_to_another_partition_while_an_optimistic_delete_waits_is_left_alone(
        engine, rows, monkeypatch):
    """PostgreSQL fails a statement that meets a row an update moved to another partition
    (SQLSTATE 40001): the batch is taken again, locking first, and the run goes on."""
    partition_by_updated_at(engine, "2025-06-01")  # between OLD and the day after CUTOFF
    ids = rows.add_many(50, updated_at=OLD)
    moved = ids[25]
    report = purge_while_a_user_commits(engine, monkeypatch, sa.update(dev_favorites).where(
        dev_favorites.c.id == moved).values(updated_at=CUTOFF + dt.timedelta(days=1)))
    assert report.deleted_total == 49
    assert rows.ids() == {moved}


def test_rows_a_trigger_swallows_count_against_the_rows_a_run_may_skip(engine, rows):
    from favorites_maintenance.retention.errors import SkippedRowsError

    rows.add_many(1000, updated_at=OLD)
    with engine.begin() as conn:
        # One row in ten is never deleted: a trigger returns NULL for it.
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.keep_some() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF OLD.item_id % 10 = 0 THEN RETURN NULL; END IF; RETURN OLD; END $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER keep_some BEFORE DELETE ON favorites.favorites "
            "FOR EACH ROW EXECUTE FUNCTION favorites.keep_some()"))
    with pytest.raises(SkippedRowsError, match="more than 50 prunable rows could not be deleted"
                       ) as caught:
        run(engine, batch_size=100, max_skipped_rows=50)
    assert caught.value.report.skipped_rows > 50
    assert rows.count() == 1000 - caught.value.report.deleted_total
