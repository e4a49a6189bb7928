"""The retention rule and the cutoff."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy.dialects import postgresql

from favorites_maintenance.retention.errors import RetentionError
from favorites_maintenance.retention.rule import compute_cutoff, delete_prunable, prunable

UTC = dt.timezone.utc


def sql(clause) -> str:
    return str(clause.compile(dialect=postgresql.dialect()))


def test_the_predicate_writes_user_id_is_null_literally_and_binds_only_the_cutoff():
    text = sql(prunable(dt.datetime(2025, 1, 1, tzinfo=UTC)))
    assert "favorites.favorites.user_id IS NULL" in text
    assert "favorites.favorites.updated_at < %(cutoff)s" in text


def test_every_delete_carries_the_guard_even_when_narrowed():
    from favorites_maintenance.retention.rule import favorites

    stmt = delete_prunable(dt.datetime(2025, 1, 1, tzinfo=UTC), favorites.c.id == 5)
    text = sql(stmt)
    assert text.startswith("DELETE FROM favorites.favorites WHERE")
    assert "user_id IS NULL" in text and "updated_at <" in text and "id = " in text


def test_cutoff_is_now_minus_days_in_utc():
    now = dt.datetime(2026, 11, 30, 4, 35, tzinfo=UTC)
    assert compute_cutoff(now, 365) == dt.datetime(2025, 11, 30, 4, 35, tzinfo=UTC)
    assert compute_cutoff(now, 365).tzinfo == UTC


def test_cutoff_of_a_partition_is_anchored_at_its_end_but_never_after_now():
    now = dt.datetime(2026, 11, 30, 4, 35, tzinfo=UTC)
    past_end = dt.datetime(2026, 11, 1, tzinfo=UTC)
    future_end = dt.datetime(2026, 12, 1, tzinfo=UTC)
    assert compute_cutoff(now, 10, past_end) == past_end - dt.timedelta(days=10)
    assert compute_cutoff(now, 10, future_end) == now - dt.timedelta(days=10)


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe",
                                  "Asia/Kathmandu", "Pacific/Kiritimati"])
def test_the_zone_of_the_input_does_not_move_the_instant(zone):
    # 2026-03-29 is the EU spring-forward day; the instant is what counts, not the wall clock.
    now_utc = dt.datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    local = now_utc.astimezone(ZoneInfo(zone))
    assert compute_cutoff(local, 1) == compute_cutoff(now_utc, 1)
    assert compute_cutoff(local, 1) == now_utc - dt.timedelta(hours=24)


def test_days_are_24_hour_periods_across_a_leap_day():
    now = dt.datetime(2028, 3, 1, tzinfo=UTC)
    assert compute_cutoff(now, 1) == dt.datetime(2028, 2, 29, tzinfo=UTC)
    assert compute_cutoff(now, 366) == dt.datetime(2027, 3, 1, tzinfo=UTC)


@pytest.mark.parametrize("call", [
    lambda: compute_cutoff(dt.datetime(2026, 1, 1), 365),
    lambda: compute_cutoff(dt.datetime(2026, 1, 1, tzinfo=UTC), 365, dt.datetime(2026, 1, 1)),
    lambda: compute_cutoff(dt.datetime(2026, 1, 1, tzinfo=UTC), 0),
    lambda: prunable(dt.datetime(2026, 1, 1)),
])
def test_naive_datetimes_and_non_positive_days_are_refused(call):
    # A ValueError, as argument checks are, and one of the core's errors.
    with pytest.raises(ValueError) as raised:
        call()
    assert isinstance(raised.value, RetentionError) and not raised.value.transient
