"""Timeouts: a short server-side limit makes a batch fail, and the run says so.

The limits a DBA puts on the job's role are the ones in force: the job's own per-batch
``statement_timeout``/``lock_timeout`` may tighten them, never loosen them.
"""

from __future__ import annotations

import datetime as dt
import time

import dagster as dg
import pytest

from favorites_maintenance.retention import BatchError, TableCheckError, purge
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.schema import dev_favorites
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    OLD,
    in_thread,
    mark_slow,
    materialization,
    run_job,
    sleeping_backend,
    slow_delete,
    step_failure,
)

MINUTE = dt.timedelta(minutes=1)
guest = dev_favorites.c.user_id.is_(None)


def test_a_short_statement_timeout_of_the_role_fails_the_batch(engine, rows, roles):
    url = roles.create("short", least_privilege=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER ROLE "{url.username}" SET statement_timeout = \'200ms\'')
    rows.add_many(300, updated_at=OLD)
    mark_slow(engine, 150)  # batch 2 of 100
    as_role = create_engine(url)
    try:
        with slow_delete(engine, seconds=3):
            t0 = time.monotonic()
            with pytest.raises(BatchError) as raised:
                purge(as_role, CUTOFF, batch_size=100, max_run_duration=MINUTE)
            elapsed = time.monotonic() - t0
    finally:
        as_role.dispose()
    err = raised.value
    assert err.kind == "statement_timeout"
    assert "QueryCanceled (SQLSTATE 57014)" in str(err)
    assert (err.batch_no, err.report.deleted_total) == (2, 100)
    assert elapsed < 2.5  # the role's 200 ms, not the job's own 30 s, nor the 3 s sleep
    assert rows.count(guest) == 200


def test_a_short_lock_timeout_of_the_role_is_kept(engine, rows, roles):
    url = roles.create("impatient", least_privilege=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER ROLE "{url.username}" SET lock_timeout = \'100ms\'')
    rows.add_many(10, updated_at=OLD)
    as_role = create_engine(url)
    migration = engine.connect()
    try:
        migration.begin()
        migration.exec_driver_sql("LOCK TABLE favorites.favorites IN ACCESS EXCLUSIVE MODE")
        t0 = time.monotonic()
        # The first statement to need the table's lock is the check of its shape, bounded like
        # the batches.
        with pytest.raises(TableCheckError) as raised:
            purge(as_role, CUTOFF, batch_size=100, max_run_duration=MINUTE,
                  lock_timeout=dt.timedelta(seconds=10))
        elapsed = time.monotonic() - t0
    finally:
        migration.rollback()
        migration.close()
        as_role.dispose()
    assert raised.value.kind == "lock_not_available"
    assert elapsed < 2
    assert rows.count() == 10


def test_the_jobs_own_statement_timeout_applies_when_the_role_has_none(engine, rows):
    rows.add_many(50, updated_at=OLD)
    mark_slow(engine, 10)
    with slow_delete(engine, seconds=3):
        with pytest.raises(BatchError) as raised:
            purge(engine, CUTOFF, batch_size=100, max_run_duration=MINUTE,
                  statement_timeout=dt.timedelta(milliseconds=300))
    assert raised.value.kind == "statement_timeout"
    assert rows.count() == 50


def test_a_run_under_a_role_with_a_short_statement_timeout_fails_naming_it(
        engine, rows, roles, monkeypatch):
    url = roles.create("short", least_privilege=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER ROLE "{url.username}" SET statement_timeout = \'200ms\'')
    rows.add_many(30, updated_at=OLD)
    mark_slow(engine, 0)  # the very first batch: a failure must not look like an empty run
    with slow_delete(engine, seconds=3), dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch)
        assert not result.success
        assert materialization(result) is None
        step, error = step_failure(result)
        failed = [e.user_message for e in instance.all_logs(result.run_id)
                  if e.user_message.startswith("run failed")]
    assert step.endswith("purge")
    text = error.message + (error.cause.message if error.cause else "")
    assert "statement_timeout" in text and "SQLSTATE 57014" in text
    assert len(failed) == 1 and "batch_no=1" in failed[0] and "statement_timeout" in failed[0]
    assert rows.count() == 30


def test_a_migration_lock_after_the_purge_fails_the_backlog_instead_of_hanging_the_run(
        db_url, engine, rows, monkeypatch):
    rows.add_many(50, updated_at=OLD)
    mark_slow(engine, 10)
    holding = []

    def migrate():
        # Queued behind the purge's batch, granted when it commits: then held for 8 s.
        sleeping_backend(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("LOCK TABLE favorites.favorites IN ACCESS EXCLUSIVE MODE")
            holding.append(time.monotonic())
            conn.exec_driver_sql("SELECT pg_sleep(8)")

    with slow_delete(engine, seconds=1), dg.instance_for_test() as instance:
        migration, _ = in_thread(migrate)
        t0 = time.monotonic()
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
        took = time.monotonic() - t0
        observed = [e.dagster_event.asset_observation_data.asset_observation.metadata
                    for e in instance.all_logs(result.run_id)
                    if e.dagster_event and e.dagster_event.event_type
                    == dg.DagsterEventType.ASSET_OBSERVATION]
        migration.join(20)
    assert holding  # the lock was really taken between the purge and the backlog
    assert not result.success and took < 7
    step, error = step_failure(result)
    assert step.endswith("measure_backlog")
    assert "lock_not_available" in error.message + (error.cause.message if error.cause else "")
    # The rows the purge deleted are still reported, though the run could not finish.
    assert [m["deletedTotal"].value for m in observed] == [50]
    assert rows.count() == 0
