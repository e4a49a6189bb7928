"""Database health between batches, read from a real server: a VACUUM on the table pauses the
purge, the WAL rate does when a threshold is set, an unreadable indicator is skipped, and a
session waiting on the purge's locks shrinks the next batch. (Replication lag is tested with a
real standby in ``test_replica.py``.)"""

from __future__ import annotations

import datetime as dt
import logging
import time

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES, dev_favorites
from favorites_maintenance.retention import HealthLimits, StopReason
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.least_privilege import least_privilege_sql
from favorites_maintenance_tests.conftest import VACUUM_PROGRESS
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    Roles,
    in_thread,
    mark_slow,
    sleeping_backend,
    slow_delete,
)

UTC = dt.timezone.utc
OLD = dt.datetime(2020, 1, 1, tzinfo=UTC)
CUTOFF = dt.datetime(2024, 1, 1, tzinfo=UTC)
#: Quick pacing for tests: read every time, sleep briefly while paused.
QUICK = dict(check_every=dt.timedelta(0), first_backoff=dt.timedelta(milliseconds=100),
             max_backoff=dt.timedelta(milliseconds=200))


@pytest.fixture
def roles(db_url, engine):
    made = Roles(db_url, engine)
    yield made
    made.drop_all()


def guests(rows) -> int:
    return rows.count(dev_favorites.c.user_id.is_(None))


def vacuum_running(engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(VACUUM_PROGRESS).first() is not None


def purge_paused_by_a_vacuum(engine, rows, slow_vacuum):
    """300 prunable rows, a VACUUM running, and the purge started on a thread (pauses up to
    30 s); after a second, return ``end_vacuum``, the thread, its output list and, per batch,
    whether a VACUUM was running."""
    rows.add_many(300, updated_at=OLD)
    start_vacuum, end_vacuum = slow_vacuum
    start_vacuum()
    vacuum_at_batch = []
    thread, out = in_thread(
        purge_rows, engine, CUTOFF, batch_size=100, max_run_duration=dt.timedelta(minutes=1),
        health=HealthLimits(max_pause=dt.timedelta(seconds=30), **QUICK),
        on_batch=lambda b: vacuum_at_batch.append(vacuum_running(engine)))
    time.sleep(1.0)
    return end_vacuum, thread, out, vacuum_at_batch


def test_a_vacuum_on_the_table_pauses_the_purge_until_it_ends(engine, rows, slow_vacuum,
                                                               caplog):
    caplog.set_level(logging.INFO, logger="favorites_maintenance")
    end_vacuum, thread, out, vacuum_at_batch = purge_paused_by_a_vacuum(engine, rows,
                                                                        slow_vacuum)
    assert thread.is_alive() and guests(rows) == 300  # paused: nothing deleted
    end_vacuum()
    thread.join(30)
    [report] = out
    assert report.stop_reason is StopReason.EXHAUSTED
    assert guests(rows) == 0 and rows.accounts() == 5000
    assert vacuum_at_batch and not any(vacuum_at_batch)  # no batch ran beside the VACUUM
    assert report.pauses == 1 and report.paused_s > 0
    assert report.throttled_by.startswith("vacuum running on favorites.favorites (VACUUM pid")
    text = caplog.text
    assert "purge paused, no transaction open: vacuum running on favorites.favorites" in text
    assert "purge resumed after" in text and "vacuum cleared" in text


def test_a_session_killed_while_paused_does_not_end_the_pause(engine, rows, slow_vacuum,
                                                            caplog):
    caplog.set_level(logging.INFO, logger="favorites_maintenance")
    end_vacuum, thread, out, vacuum_at_batch = purge_paused_by_a_vacuum(engine, rows,
                                                                        slow_vacuum)
    with engine.connect() as conn:
        killed = conn.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'favorites-maintenance' AND pid <> pg_backend_pid() "
            "AND pid NOT IN (SELECT pid FROM pg_stat_progress_vacuum)")).scalars().all()
    assert killed == [True]
    time.sleep(1.0)
    assert thread.is_alive() and guests(rows) == 300  # still paused: nothing deleted
    end_vacuum()
    thread.join(30)
    [report] = out
    assert report.stop_reason is StopReason.EXHAUSTED and guests(rows) == 0
    assert vacuum_at_batch and not any(vacuum_at_batch)  # no batch ran beside the VACUUM
    assert "could not read the database's health while paused (still paused: vacuum" in caplog.text


def test_a_pause_longer_than_the_max_ends_the_run_db_unhealthy(engine, rows, slow_vacuum,
                                                               caplog):
    caplog.set_level(logging.INFO, logger="favorites_maintenance")
    rows.add_many(300, updated_at=OLD)
    start_vacuum, end_vacuum = slow_vacuum
    start_vacuum()
    report = purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=dt.timedelta(minutes=1),
                        health=HealthLimits(max_pause=dt.timedelta(seconds=1), **QUICK))
    end_vacuum()
    assert report.stop_reason is StopReason.DB_UNHEALTHY
    assert report.deleted_total == 0 and guests(rows) == 300
    assert report.paused_s >= 1.0 and report.throttled_by.startswith("vacuum")
    assert "the backlog waits for the next run" in caplog.text


def test_the_time_budget_ends_a_pause(engine, rows, slow_vacuum, caplog):
    caplog.set_level(logging.INFO, logger="favorites_maintenance")
    rows.add_many(300, updated_at=OLD)
    start_vacuum, end_vacuum = slow_vacuum
    start_vacuum()
    report = purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=dt.timedelta(seconds=1),
                        health=HealthLimits(max_pause=dt.timedelta(minutes=2), **QUICK))
    end_vacuum()
    assert report.stop_reason is StopReason.DB_UNHEALTHY
    assert guests(rows) == 300
    assert "time budget ran out" in caplog.text


def test_a_stop_request_ends_a_pause(engine, rows, slow_vacuum):
    rows.add_many(300, updated_at=OLD)
    start_vacuum, end_vacuum = slow_vacuum
    start_vacuum()
    asked = []

    def should_stop():
        asked.append(1)
        return len(asked) > 3  # the first poll is before the pause

    report = purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=dt.timedelta(minutes=1),
                        should_stop=should_stop,
                        health=HealthLimits(max_pause=dt.timedelta(minutes=2), **QUICK))
    end_vacuum()
    assert report.stop_reason is StopReason.STOP_REQUESTED
    assert guests(rows) == 300 and report.pauses == 1


def test_a_run_with_nothing_prunable_does_not_wait_for_a_vacuum(engine, rows, slow_vacuum,
                                                               caplog):
    caplog.set_level(logging.INFO, logger="favorites_maintenance")
    rows.add_many(50, updated_at=CUTOFF + dt.timedelta(days=1))  # guest rows, none expired
    start_vacuum, end_vacuum = slow_vacuum
    start_vacuum()
    report = purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=dt.timedelta(minutes=1),
                        health=HealthLimits(max_pause=dt.timedelta(seconds=1), **QUICK))
    assert vacuum_running(engine)  # the VACUUM ran the whole time
    end_vacuum()
    # Health pauses are for batches: with no prunable row there is none to hold back.
    assert report.stop_reason is StopReason.EXHAUSTED
    assert (report.deleted_total, report.pauses, report.paused_s) == (0, 0, 0.0)
    assert report.throttled_by is None
    assert guests(rows) == 50 and "purge paused" not in caplog.text


def test_a_wal_rate_over_its_threshold_pauses_the_purge_between_batches(engine, rows, caplog):
    caplog.set_level(logging.INFO, logger="favorites_maintenance")
    rows.add_many(600, updated_at=OLD)
    report = purge_rows(engine, CUTOFF, batch_size=200, max_run_duration=dt.timedelta(minutes=1),
                        health=HealthLimits(max_wal_bytes_per_second=200_000,
                                       max_pause=dt.timedelta(seconds=30), **QUICK))
    # Each batch writes its WAL in milliseconds, far above 200 kB/s; the pause after it lets
    # the rate over the pause fall back.
    assert report.stop_reason is StopReason.EXHAUSTED and rows.count() == 0
    assert report.pauses >= 1 and report.throttled_by.startswith("wal_rate ")
    assert "bytes/s > 200,000" in caplog.text and "wal_rate cleared" in caplog.text


def test_the_wal_rate_is_not_watched_by_default(engine, rows):
    rows.add_many(600, updated_at=OLD)
    report = purge_rows(engine, CUTOFF, batch_size=200, max_run_duration=dt.timedelta(minutes=1),
                        health=HealthLimits(**QUICK))
    assert report.stop_reason is StopReason.EXHAUSTED and rows.count() == 0
    assert report.pauses == 0 and report.throttled_by is None and not report.health_unreadable


def purge_during_a_vacuum(url, rows, slow_vacuum, *, max_pause_s: float):
    """300 prunable rows purged as the role of ``url`` while a VACUUM runs on the table."""
    rows.add_many(300, updated_at=OLD)
    start_vacuum, end_vacuum = slow_vacuum
    start_vacuum()
    as_role = create_engine(url)
    try:
        return purge_rows(as_role, CUTOFF, batch_size=100, max_run_duration=dt.timedelta(minutes=1),
                          health=HealthLimits(max_pause=dt.timedelta(seconds=max_pause_s), **QUICK))
    finally:
        as_role.dispose()
        end_vacuum()


def test_an_indicator_the_role_cannot_read_is_reported_once_and_skipped(
        engine, rows, roles, slow_vacuum, caplog):
    caplog.set_level(logging.INFO, logger="favorites_maintenance")
    url = roles.create("cleanup", least_privilege=True)
    report = purge_during_a_vacuum(url, rows, slow_vacuum, max_pause_s=30)
    # The role cannot see the VACUUM: no pause, no failure, and it says what it skipped.
    assert report.stop_reason is StopReason.EXHAUSTED and guests(rows) == 0
    assert report.pauses == 0
    assert [u.split(":")[0] for u in report.health_unreadable] == [
        "replication_lag of standbys (pg_stat_replication)", "vacuum (pg_stat_progress_vacuum)"]
    assert all("pg_monitor" in u for u in report.health_unreadable)
    skipped = [r for r in caplog.records if "cannot be read by this role" in r.getMessage()]
    assert len(skipped) == 2 and all(r.levelno == logging.WARNING for r in skipped)


def test_the_grant_least_privilege_sql_names_lets_the_role_see_a_vacuum(
        engine, rows, roles, slow_vacuum):
    url = roles.create("cleanup", least_privilege=True)
    [grant] = [line.removeprefix("-- ") for line in
               least_privilege_sql(GUEST_FAVORITES, url.username).splitlines()
               if line.startswith("-- GRANT pg_monitor")]
    with engine.begin() as conn:
        conn.exec_driver_sql(grant)
    report = purge_during_a_vacuum(url, rows, slow_vacuum, max_pause_s=1)
    assert report.stop_reason is StopReason.DB_UNHEALTHY and guests(rows) == 300
    assert report.throttled_by.startswith("vacuum") and not report.health_unreadable


def test_a_session_waiting_on_the_purges_locks_halves_the_next_batch(engine, rows, caplog):
    caplog.set_level(logging.INFO, logger="favorites_maintenance")
    rows.add_many(1000, updated_at=OLD)
    mark_slow(engine, 50)  # in the first batch
    sizes = []
    with slow_delete(engine, seconds=1.0):
        thread, out = in_thread(
            purge_rows, engine, CUTOFF, batch_size=400, batch_size_max=800,
            target_batch_duration=dt.timedelta(seconds=10),
            max_run_duration=dt.timedelta(minutes=1),
            on_batch=lambda b: sizes.append(b.batch_size))
        sleeping_backend(engine)
        # A user touching a row the sleeping batch holds waits for its commit.
        with engine.connect() as conn:
            first_id = conn.execute(sa.select(sa.func.min(dev_favorites.c.id))).scalar_one()
            conn.execute(sa.text("SET lock_timeout = '20s'"))
            conn.execute(sa.update(dev_favorites).where(dev_favorites.c.id == first_id)
                         .values(note="touched"))
            conn.commit()
        thread.join(30)
    [report] = out
    assert report.stop_reason is StopReason.EXHAUSTED and rows.count() == 0
    # 1.0 s is far under the 10 s target, so the size would have doubled; the waiter halved it.
    assert sizes[:2] == [400, 200]
    assert report.lock_waits == 1
    assert "batch 1 held a lock 1 other sessions waited on; next batch 200 rows" in caplog.text


def test_a_view_the_server_refuses_the_role_leaves_the_other_indicators_read(
        db_url, engine, rows, roles):
    """A reading is one statement; where the server refuses the role a part of it (here the
    replication slots, revoked from PUBLIC in this database), the indicators are read one at a
    time, that one skipped and named, the others read."""
    rows.add_many(40, updated_at=OLD)
    url = roles.create("cleanup", least_privilege=True)
    with engine.begin() as conn:
        conn.exec_driver_sql("REVOKE SELECT ON pg_catalog.pg_replication_slots FROM PUBLIC")
    role = create_engine(url)
    try:
        report = purge_rows(role, CUTOFF, batch_size=10, max_run_duration=dt.timedelta(minutes=1),
                            health=HealthLimits(max_wal_bytes_per_second=2**40, **QUICK))
    finally:
        role.dispose()
        with engine.begin() as conn:
            conn.exec_driver_sql("GRANT SELECT ON pg_catalog.pg_replication_slots TO PUBLIC")
    assert report.stop_reason is StopReason.EXHAUSTED and guests(rows) == 0
    assert report.pauses == 0
    assert [u.split(":")[0] for u in report.health_unreadable] == [
        "replication_lag of standbys (pg_stat_replication)", "vacuum (pg_stat_progress_vacuum)",
        "replication_lag"]
