"""Termination, at the core level: a stop request is honoured between batches only.

The run-level behaviour (a terminated run ends CANCELED, is not retried, and the staleness
sensor does not count it) belongs to the Dagster layer and its own tests.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import dev_favorites
from favorites_maintenance.retention import StopReason
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    OLD,
    in_thread,
    mark_slow,
    our_backends,
    sleeping_backend,
    slow_delete,
)

# The stop guarantees are checked one at a time (docs/testing.md).
pytestmark = pytest.mark.xdist_group("stop")

MINUTE = dt.timedelta(minutes=1)


def test_a_stop_requested_during_a_batch_lets_it_commit_and_starts_no_other(engine, rows):
    rows.add_many(500, updated_at=OLD)
    mark_slow(engine, 150)  # batch 2 of 100 sleeps while the stop arrives
    stop = threading.Event()
    batches, polls = [], []

    def should_stop():
        polls.append(stop.is_set())
        return stop.is_set()

    with slow_delete(engine, seconds=1):
        purger, out = in_thread(purge_rows, engine, CUTOFF, batch_size=100, max_run_duration=MINUTE,
                                should_stop=should_stop, on_batch=batches.append)
        sleeping_backend(engine)
        stop.set()  # e.g. the UI's Terminate, captured by the op and polled here
        purger.join(30)

    [report] = out
    assert report.stop_reason is StopReason.STOP_REQUESTED
    # The open batch was not torn: it committed whole, and it was the last one.
    assert [b.batch_no for b in batches] == [1, 2] and batches[-1].deleted == 100
    assert polls == [False, False, True]
    assert (report.deleted_total, report.batches) == (200, 2)
    assert rows.count(dev_favorites.c.user_id.is_(None)) == 300
    assert our_backends(engine, state="idle in transaction") == []


def test_a_stop_requested_before_the_first_batch_deletes_nothing(engine, rows):
    rows.add_many(50, updated_at=OLD)
    report = purge_rows(engine, CUTOFF, batch_size=10, max_run_duration=MINUTE,
                        should_stop=lambda: True)
    assert report.stop_reason is StopReason.STOP_REQUESTED
    assert (report.deleted_total, report.batches) == (0, 0)
    assert rows.count() == 50


def test_no_session_is_left_behind_after_a_stop(engine, rows):
    rows.add_many(300, updated_at=OLD)
    calls = []
    purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=MINUTE,
               should_stop=lambda: calls.append(1) or len(calls) > 2)
    with engine.connect() as conn:
        open_xacts = conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND xact_start IS NOT NULL AND pid <> pg_backend_pid()")).scalar_one()
    assert open_xacts == 0
    assert rows.count() == 100
