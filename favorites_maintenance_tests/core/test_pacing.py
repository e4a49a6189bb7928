"""``sleep_ratio``: the purge pauses between batches, no transaction open, that multiple of the
last batch's time, and says how long it paused; a stop request or the time budget ends a pause."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.config.policy_settings import parse_policy_settings
from favorites_maintenance.retention import StopReason
from favorites_maintenance_tests.conftest import slow_batches
from favorites_maintenance_tests.core.test_purge import CUTOFF, OLD, open_transactions
from favorites_maintenance_tests.helpers.purging import purge_rows

TEN_MIN = dt.timedelta(minutes=10)


def run(engine, **kwargs):
    kwargs.setdefault("batch_size", 50)
    kwargs.setdefault("max_run_duration", TEN_MIN)
    return purge_rows(engine, CUTOFF, **kwargs)


def test_without_a_sleep_ratio_the_purge_never_pauses(engine, rows):
    rows.add_many(300, updated_at=OLD)
    report = run(engine)
    assert report.deleted_total == 300 and report.paced_s == 0


def test_each_pause_is_the_ratio_times_the_batch_before_it(engine, rows):
    rows.add_many(300, updated_at=OLD)
    batches = []
    report = run(engine, sleep_ratio=2.0, on_batch=batches.append)

    assert report.deleted_total == 300 and report.stop_reason is StopReason.EXHAUSTED
    assert len(batches) == 7  # six full batches and the empty one that ends the run
    # A pause follows every batch but the last; each is at least twice its batch's time.
    assert report.paced_s >= 2.0 * sum(b.duration_s for b in batches[:-1])
    assert open_transactions(engine) == 0


def test_a_stop_request_ends_a_pause(engine, rows):
    rows.add_many(300, updated_at=OLD)
    stop = threading.Event()
    with slow_batches(engine, 0.1):
        # Each pause would last 100 x 0.1 s: the request 0.5 s into the first one ends it.
        timer = threading.Timer(0.5, stop.set)
        timer.start()
        try:
            report = run(engine, sleep_ratio=100, should_stop=stop.is_set)
        finally:
            timer.cancel()
    assert report.stop_reason is StopReason.STOP_REQUESTED
    assert report.deleted_total == 50
    assert 0 < report.paced_s < 10
    assert rows.count() == 250


def test_the_time_budget_ends_a_pause(engine, rows):
    rows.add_many(300, updated_at=OLD)
    with slow_batches(engine, 0.1):
        report = run(engine, sleep_ratio=100, max_run_duration=dt.timedelta(seconds=1))
    assert report.stop_reason is StopReason.MAX_RUN_DURATION
    assert report.deleted_total == 50
    assert 0 < report.paced_s < 10


@pytest.mark.parametrize("ratio", ["-0.5", "nan"])
def test_a_negative_ratio_is_refused(ratio):
    with pytest.raises(SettingsError, match="sleep_ratio"):
        parse_policy_settings({"sleep_ratio": ratio}, {})
