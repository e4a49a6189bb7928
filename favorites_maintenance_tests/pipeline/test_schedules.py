"""Which partition each schedule tick runs: around midnight UTC and on daylight-saving days.

The schedule is evaluated in UTC and requests the latest *complete* UTC day as of the tick, so a
tick never runs a day that has not ended, whatever the cron and whatever the local clocks do.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import dagster as dg
import pytest
from favorites_maintenance_tests.helpers.dagster_internals import cron_string_iterator

from favorites_maintenance.config.policy_settings import DEFAULT_CRON
from favorites_maintenance.components.policy_tree import code_location
from favorites_maintenance_tests.helpers.jobs import load_code_location

UTC = dt.timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
SCHEDULE_NAME = "guest_favorites_cleanup_schedule"


def at(*args, tz=UTC, fold=0) -> dt.datetime:
    return dt.datetime(*args, tzinfo=tz).replace(fold=fold)


def guest_defs(**settings) -> dg.Definitions:
    """The code location for the guest-favorites ``settings`` (the others unset), the
    environment restored afterwards."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return load_code_location(monkeypatch=monkeypatch, **settings)


def partition_for_tick(tick: dt.datetime, cron: str = DEFAULT_CRON) -> str | None:
    """The partition the schedule requests for a tick at ``tick`` (None: it skips)."""
    defs = guest_defs(cron=cron)
    schedule = defs.resolve_schedule_def(SCHEDULE_NAME)
    context = dg.build_schedule_context(scheduled_execution_time=tick,
                                        repository_def=defs.get_repository_def())
    result = schedule.evaluate_tick(context)
    if not result.run_requests:
        assert result.skip_message
        return None
    [request] = result.run_requests
    assert request.run_key == request.partition_key
    return request.partition_key


@pytest.mark.parametrize("tick, partition", [
    # Around midnight UTC: a day is complete only once it has ended.
    (at(2026, 5, 9, 23, 59), "2026-05-08"),
    (at(2026, 5, 9, 23, 59, 59, 999999), "2026-05-08"),
    (at(2026, 5, 10, 0, 0), "2026-05-09"),
    (at(2026, 5, 10, 0, 1), "2026-05-09"),
    (at(2026, 5, 10, 3, 0), "2026-05-09"),
    (at(2026, 5, 10, 23, 59), "2026-05-09"),
    # Across a month and a year boundary.
    (at(2026, 3, 1, 3, 0), "2026-02-28"),
    (at(2027, 1, 1, 0, 0), "2026-12-31"),
])
def test_a_tick_runs_the_latest_complete_utc_day(tick, partition):
    assert partition_for_tick(tick) == partition


@pytest.mark.parametrize("tick, partition", [
    # EU: clocks go forward on 2026-03-29 at 01:00 UTC and back on 2026-10-25 at 01:00 UTC.
    (at(2026, 3, 29, 0, 59), "2026-03-28"),
    (at(2026, 3, 29, 1, 0), "2026-03-28"),
    (at(2026, 3, 29, 3, 0), "2026-03-28"),
    (at(2026, 3, 30, 3, 0), "2026-03-29"),  # the 23-hour local day is still a 24-hour UTC day
    (at(2026, 10, 25, 1, 0), "2026-10-24"),
    (at(2026, 10, 25, 3, 0), "2026-10-24"),
    (at(2026, 10, 26, 3, 0), "2026-10-25"),
    # US: forward on 2026-03-08 at 07:00 UTC, back on 2026-11-01 at 06:00 UTC.
    (at(2026, 3, 8, 7, 0), "2026-03-07"),
    (at(2026, 3, 9, 3, 0), "2026-03-08"),
    (at(2026, 11, 1, 6, 0), "2026-10-31"),
    (at(2026, 11, 2, 3, 0), "2026-11-01"),
])
def test_daylight_saving_days_change_nothing_in_utc(tick, partition):
    assert partition_for_tick(tick) == partition


@pytest.mark.parametrize("tick, partition", [
    # 04:00 CEST on the EU spring-forward day is 02:00 UTC.
    (at(2026, 3, 29, 4, 0, tz=BERLIN), "2026-03-28"),
    # 01:00 CET, after the EU fall-back, is 00:00 UTC of the 26th: the 25th has ended.
    (at(2026, 10, 26, 1, 0, tz=BERLIN), "2026-10-25"),
    # The repeated 01:30 of the US fall-back day: 05:30 UTC the first time, 06:30 the second.
    (at(2026, 11, 1, 1, 30, tz=NEW_YORK, fold=0), "2026-10-31"),
    (at(2026, 11, 1, 1, 30, tz=NEW_YORK, fold=1), "2026-10-31"),
    # 20:00 EDT on 2026-03-08 is midnight UTC: the UTC day 2026-03-08 has just ended.
    (at(2026, 3, 8, 20, 0, tz=NEW_YORK), "2026-03-08"),
    (at(2026, 3, 8, 19, 59, tz=NEW_YORK), "2026-03-07"),
])
def test_a_tick_given_in_local_time_is_read_as_the_utc_instant(tick, partition):
    assert partition_for_tick(tick) == partition


def test_before_the_first_day_has_ended_the_tick_skips():
    assert partition_for_tick(at(2026, 1, 1, 3, 0)) is None
    assert partition_for_tick(at(2026, 1, 2, 0, 0)) == "2026-01-01"


@pytest.mark.parametrize("start", [at(2026, 3, 27), at(2026, 10, 23), at(2026, 3, 6),
                                   at(2026, 10, 30)])
def test_the_default_cron_ticks_at_03_00_utc_every_day_across_daylight_saving(start):
    """What the daemon fires: one tick a day at 03:00 UTC, 24 hours apart, each running the
    day before it."""
    schedule = guest_defs().resolve_schedule_def(SCHEDULE_NAME)
    ticks = cron_string_iterator(start.timestamp(), schedule.cron_schedule,
                                 schedule.execution_timezone)
    days = [next(ticks) for _ in range(5)]
    assert [(t.hour, t.minute, t.utcoffset()) for t in days] == [(3, 0, dt.timedelta(0))] * 5
    assert {b - a for a, b in zip(days, days[1:])} == {dt.timedelta(days=1)}
    for tick in days:
        assert partition_for_tick(tick) == (tick.date() - dt.timedelta(days=1)).isoformat()


def test_the_schedule_is_utc_running_by_default_and_runs_the_job():
    schedule = guest_defs().resolve_schedule_def(SCHEDULE_NAME)
    assert schedule.cron_schedule == DEFAULT_CRON
    assert schedule.execution_timezone == "UTC"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedule.job_name == "guest_favorites_cleanup_job"


def test_a_custom_cron_from_the_environment_is_honoured(monkeypatch):
    monkeypatch.setenv("FAVORITES_GUEST_RETENTION_CRON", "*/15 6-18 * * 1-5")
    schedule = code_location().resolve_schedule_def(SCHEDULE_NAME)
    assert schedule.cron_schedule == "*/15 6-18 * * 1-5"
    assert schedule.execution_timezone == "UTC"
    ticks = cron_string_iterator(at(2026, 5, 8, 18, 40).timestamp(), schedule.cron_schedule,
                                 "UTC")
    # Friday 18:45 UTC, then Monday 06:00 UTC; each runs the day before its own date.
    first, second = next(ticks), next(ticks)
    assert (first, second) == (at(2026, 5, 8, 18, 45), at(2026, 5, 11, 6, 0))
    assert partition_for_tick(first, schedule.cron_schedule) == "2026-05-07"
    assert partition_for_tick(second, schedule.cron_schedule) == "2026-05-10"
