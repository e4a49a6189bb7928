"""Concurrency: user sessions write while purges run; four purges at once."""

from __future__ import annotations

import datetime as dt
import threading
import time

import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES, dev_favorites
from favorites_maintenance.retention import measure_backlog
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    FRESH,
    OLD,
    in_thread,
    mark_slow,
    sleeping_backend,
    slow_delete,
)
from favorites_maintenance_tests.reliability.workload import (
    UserSessions,
    assert_exactly_the_prunable_rows_are_gone,
    final_state,
)

MINUTE = dt.timedelta(minutes=1)
f = dev_favorites.c


def ordered_ids(engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(f.id).order_by(f.updated_at, f.id)).scalars())


def audit_deletions(engine) -> None:
    """Record every deleted id with the backend that deleted it (rolled back with its batch)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE TABLE favorites.deleted_log (id bigint NOT NULL, pid int NOT NULL);
            CREATE FUNCTION favorites.audit_delete() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO favorites.deleted_log VALUES (OLD.id, pg_backend_pid());
                RETURN OLD;
            END $$;
            CREATE TRIGGER audit_delete AFTER DELETE ON favorites.favorites
                FOR EACH ROW EXECUTE FUNCTION favorites.audit_delete();""")


def deletions(engine) -> list[tuple[int, int]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql("SELECT id, pid FROM favorites.deleted_log")]


def test_writes_during_a_batch_survive_with_their_values_and_nobody_deadlocks(
        db_url, engine, rows):
    rows.add_many(300, updated_at=OLD)
    ids = ordered_ids(engine)
    mark_slow(engine, 0)  # batch 1 hangs on its first row while holding its candidates
    fresh = rows.add(updated_at=FRESH)

    def write(stmt):
        eng = create_engine(db_url, application_name="favorites-user-session")
        try:
            t0 = time.monotonic()
            with eng.begin() as conn:
                got = conn.execute(stmt.returning(f.id)).first()
            return got is not None, time.monotonic() - t0
        finally:
            eng.dispose()

    claim = lambda i, u: sa.update(dev_favorites).where(f.id == i).values(user_id=u)  # noqa: E731
    touch = lambda i, n: sa.update(dev_favorites).where(f.id == i).values(  # noqa: E731
        note=n, updated_at=sa.func.now())
    with slow_delete(engine, seconds=1.5):
        purger, report = in_thread(purge_rows, engine, CUTOFF, batch_size=100,
                                   max_run_duration=MINUTE)
        sleeping_backend(engine)
        # Rows of batch 1 (held by the purge, or not yet reached by it) and of batch 2.
        writes = {
            ids[5]: in_thread(write, claim(ids[5], 501)),
            ids[6]: in_thread(write, touch(ids[6], "came back")),
            ids[150]: in_thread(write, claim(ids[150], 502)),
            ids[151]: in_thread(write, touch(ids[151], "came back too")),
        }
        inserted = in_thread(write, sa.insert(dev_favorites).values(
            anonymous_id="00000000-0000-4000-8000-0000000000aa", item_id=1))
        purger.join(30)
        for t, _ in writes.values():
            t.join(30)
        inserted[0].join(30)

    [result] = report
    assert not isinstance(result, BaseException), result
    outcome = {i: out[0] for i, (t, out) in writes.items()}
    assert all(not isinstance(o, BaseException) for o in outcome.values()), outcome
    state = final_state(engine)
    # Batch 2 had not started: those writes succeeded, and their rows survived with them.
    assert outcome[ids[150]][0] and state[ids[150]][0] == 502
    assert outcome[ids[151]][0] and state[ids[151]][1] == "came back too"
    # Batch 1 rows: a write that reported success survived with its value; a write that found
    # the row gone (it waited for the batch, which had locked the row first) reports 0 rows.
    for i, value in ((ids[5], 501), (ids[6], "came back")):
        succeeded, waited = outcome[i]
        if succeeded:
            assert value in state[i]
        else:
            assert i not in state
        assert waited < 10  # at most one batch, never a deadlock
    assert fresh in state
    assert inserted[1][0][0] is True
    # Everything else prunable is gone; the purge reported exactly what disappeared.
    written = {i for i, (ok, _) in outcome.items() if ok}
    assert set(ids) - set(state) == set(ids) - written
    assert result.deleted_total == len(set(ids) - set(state))


def test_a_row_locked_by_a_user_claim_is_skipped_not_waited_on_and_keeps_the_claim(
        engine, rows):
    rows.add_many(250, updated_at=OLD)
    ids = ordered_ids(engine)
    user = engine.connect()
    try:
        user.begin()
        user.execute(sa.update(dev_favorites).where(f.id == ids[120]).values(user_id=77))
        user.execute(sa.update(dev_favorites).where(f.id == ids[121]).values(note="abandoned"))
        t0 = time.monotonic()
        report = purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=MINUTE,
                            lock_timeout=dt.timedelta(seconds=60))
        took = time.monotonic() - t0
        user.commit()
    finally:
        user.close()
    assert took < 30  # neither lock was waited on (lock_timeout was a minute)
    assert report.deleted_total == 248
    state = final_state(engine)
    assert set(state) == {ids[120], ids[121]}
    assert state[ids[120]][0] == 77
    # The other row stays prunable: the next run takes it, the backlog showed it meanwhile.
    assert measure_backlog(engine, GUEST_FAVORITES, CUTOFF).remaining == 1
    assert purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=MINUTE).deleted_total == 1


def test_four_purges_at_once_delete_each_row_exactly_once_under_user_writes(db_url, engine,
                                                                            rows):
    audit_deletions(engine)
    prunable = set(rows.add_many(20_000, updated_at=OLD))
    kept = set(rows.add_many(1_000, updated_at=OLD, user_id=9)) | set(
        rows.add_many(1_000, updated_at=FRESH))
    reports, errors, backends = [], [], []
    start = threading.Barrier(4)

    def purger():
        eng = create_engine(db_url)
        try:
            start.wait()
            with eng.connect() as conn:
                backends.append(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
            reports.append(purge_rows(eng, CUTOFF, batch_size=250, max_run_duration=MINUTE,
                                      on_batch=lambda b: time.sleep(0.003)))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            eng.dispose()

    with UserSessions(db_url, sorted(prunable)[:4000], writers=4, hold_s=0.01) as users:
        threads = [threading.Thread(target=purger) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        writes = users.stop()
    assert errors == [] and writes.errors == []
    assert len(reports) == 4 and all(r.deleted_total > 0 for r in reports), \
        [r.deleted_total for r in reports]
    # Rows a user held when a purge passed are left for the next run, which takes them.
    last = purge_rows(engine, CUTOFF, batch_size=250, max_run_duration=MINUTE)

    log = deletions(engine)
    deleted_ids = [i for i, _ in log]
    assert len(deleted_ids) == len(set(deleted_ids))  # nobody deleted a row twice
    assert sum(r.deleted_total for r in reports) + last.deleted_total == len(deleted_ids)
    assert_exactly_the_prunable_rows_are_gone(final_state(engine), writes, kept=kept,
                                              prunable=prunable, cutoff=CUTOFF)
    assert set(deleted_ids) == prunable - set(writes.claimed) - set(writes.touched)
