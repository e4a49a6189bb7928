"""The retention rule and the cutoff."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy.dialects import postgresql

from favorites_maintenance.local.guest_favorites import (
    GUEST_FAVORITES,
    create_partitioned_dev_schema,
    drop_dev_schema,
)
from favorites_maintenance.retention.archive import ArchiveTarget
from favorites_maintenance.retention.backlog import measure_backlog
from favorites_maintenance.retention.errors import RetentionError
from favorites_maintenance.retention.health import HealthLimits, HealthMonitor
from favorites_maintenance.retention.least_privilege import apply_partition_functions
from favorites_maintenance.retention.partition_plan import prunable_partitions
from favorites_maintenance.retention.partitioned import drop_expired_partitions
from favorites_maintenance.retention.purge import purge
from favorites_maintenance.retention.rule import RetentionRule, compute_cutoff
from favorites_maintenance.retention.scan import ScanMode
from favorites_maintenance.retention.table_check import check_table
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers import archive as shop
from favorites_maintenance_tests.helpers.purging import purge_rows

UTC = dt.timezone.utc
MINUTE = dt.timedelta(minutes=1)
DAY = dt.timedelta(days=1)


def sql(clause) -> str:
    return str(clause.compile(dialect=postgresql.dialect()))


def test_the_predicate_writes_user_id_is_null_literally_and_binds_only_the_cutoff():
    text = sql(GUEST_FAVORITES.prunable(dt.datetime(2025, 1, 1, tzinfo=UTC)))
    assert "favorites.favorites.user_id IS NULL" in text
    assert "favorites.favorites.updated_at < %(cutoff)s" in text


def test_every_delete_carries_the_guard_even_when_narrowed():
    stmt = GUEST_FAVORITES.delete_prunable(dt.datetime(2025, 1, 1, tzinfo=UTC),
                                           GUEST_FAVORITES.key == 5)
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
    lambda: GUEST_FAVORITES.prunable(dt.datetime(2026, 1, 1)),
])
def test_naive_datetimes_and_non_positive_days_are_refused(call):
    # A ValueError, as argument checks are, and one of the core's errors.
    with pytest.raises(ValueError) as raised:
        call()
    assert isinstance(raised.value, RetentionError) and not raised.value.transient


# -- cutoff_inclusive: the row exactly at the cutoff --------------------------------------------

MICRO = dt.timedelta(microseconds=1)
#: A midnight, so that partitions can end and start at it.
CUTOFF = dt.datetime(2025, 6, 1, tzinfo=UTC)


def guest_rule(inclusive: bool) -> RetentionRule:
    return RetentionRule.define("favorites.favorites", key_column="id", age_column="updated_at",
                                null_columns=["user_id"], cutoff_inclusive=inclusive)


def test_an_inclusive_rule_compares_with_less_or_equal_everywhere_a_strict_one_with_less():
    strict, inclusive = guest_rule(False), guest_rule(True)
    assert "favorites.favorites.updated_at < %(cutoff)s" in sql(strict.prunable(CUTOFF))
    assert "favorites.favorites.updated_at <= %(cutoff)s" in sql(inclusive.prunable(CUTOFF))
    assert "updated_at <= %(cutoff)s" in sql(inclusive.delete_prunable(CUTOFF))
    assert (strict.predicate_sql, inclusive.predicate_sql) == (
        "user_id IS NULL AND updated_at < cutoff", "user_id IS NULL AND updated_at <= cutoff")
    # The rules derived from it (a partition's, the archive move's) compare the same way.
    assert "updated_at <= %(cutoff)s" in sql(
        inclusive.within([(CUTOFF - MICRO, CUTOFF + MICRO)]).prunable(CUTOFF))
    assert "updated_at <= %(cutoff)s" in sql(inclusive.with_columns(["note"]).prunable(CUTOFF))
    assert strict != inclusive
    assert (strict.prunable_before(CUTOFF), inclusive.prunable_before(CUTOFF)) == (
        CUTOFF, CUTOFF + MICRO)


def boundary_rows(rows) -> dict[str, set[int]]:
    """Guest rows just before, exactly at (two, one key apart) and just after :data:`CUTOFF`, a
    few older ones, and an account row at the cutoff."""
    return {
        "older": {rows.add(updated_at=CUTOFF - n * MICRO) for n in (3, 2, 1)},
        "at": {rows.add(updated_at=CUTOFF), rows.add(updated_at=CUTOFF)},
        "newer": {rows.add(updated_at=CUTOFF + MICRO)},
        "account": {rows.add(updated_at=CUTOFF, user_id=8)},
    }


@pytest.mark.parametrize("inclusive", [True, False], ids=["inclusive", "strict"])
@pytest.mark.parametrize("batch_size", [2, 1])
@pytest.mark.parametrize("scan", [ScanMode.KEYSET, ScanMode.PAGE_ORDER])
def test_the_row_at_the_cutoff_is_deleted_with_cutoff_inclusive_and_kept_without(
        engine, rows, scan, batch_size, inclusive):
    rule = guest_rule(inclusive)
    placed = boundary_rows(rows)
    prunable = placed["older"] | (placed["at"] if inclusive else set())
    backlog = measure_backlog(engine, rule, CUTOFF)
    assert (backlog.remaining, backlog.oldest_age) == (len(prunable), CUTOFF - 3 * MICRO)

    # Batches of two: the first locks first, the ones after it are optimistic (two
    # statements); batches of one name their row first (the next-key statement).
    report = purge_rows(engine, CUTOFF, batch_size=batch_size, max_run_duration=MINUTE,
                        rule=rule, scan=scan)

    assert report.scan_mode == str(scan)
    assert report.deleted_total == len(prunable)
    assert rows.ids() == placed["newer"] | placed["account"] | (
        set() if inclusive else placed["at"])
    assert measure_backlog(engine, rule, CUTOFF).remaining == 0


@pytest.mark.parametrize("inclusive", [True, False], ids=["inclusive", "strict"])
def test_partitions_ending_at_the_cutoff_go_whole_and_the_row_at_it_goes_only_when_inclusive(
        engine, inclusive):
    """A day partition ends at the cutoff, the next one starts at it with a row exactly there:
    the first is detached under either comparison (its upper bound is exclusive), the second is
    planned and its row at the cutoff deleted only by an inclusive rule."""
    rule = guest_rule(inclusive)
    drop_dev_schema(engine)
    before, at = create_partitioned_dev_schema(
        engine, [CUTOFF - dt.timedelta(days=1), CUTOFF, CUTOFF + dt.timedelta(days=1)])
    rows = Rows(engine)
    rows.add(updated_at=CUTOFF - MICRO)
    at_cutoff = rows.add(updated_at=CUTOFF)
    newer = rows.add(updated_at=CUTOFF + MICRO)

    planned = prunable_partitions(engine, rule, CUTOFF)
    assert [p.name for p in planned] == ([before, at] if inclusive else [before])

    dropped = drop_expired_partitions(engine, rule, CUTOFF)
    assert dropped.detached == (f"favorites.{before}",) and dropped.rows_removed == 1
    # What is left goes one planned partition per step, each purged through the table within
    # the partition's range.
    for partition in prunable_partitions(engine, rule, CUTOFF):
        assert partition.name == at
        purge_rows(engine, CUTOFF, batch_size=10, max_run_duration=MINUTE,
                   rule=rule.within(partition.ages))
    assert rows.ids() == ({newer} if inclusive else {at_cutoff, newer})


@pytest.mark.parametrize("inclusive", [True, False], ids=["inclusive", "strict"])
def test_the_archive_receives_the_row_at_the_cutoff_only_from_an_inclusive_rule(
        engine, inclusive):
    shop.create_items(engine)
    rule = RetentionRule.define(shop.TABLE, key_column="id", age_column="updated_at",
                                null_columns=["owner_id"], cutoff_inclusive=inclusive)
    same_instant = dt.timedelta(0)
    older = set(shop.add_items(engine, 2, updated_at=shop.CUTOFF - MICRO, step=same_instant))
    at = set(shop.add_items(engine, 2, updated_at=shop.CUTOFF, step=same_instant))
    newer = set(shop.add_items(engine, 1, updated_at=shop.CUTOFF + MICRO))
    moved = older | (at if inclusive else set())

    report = purge_rows(engine, shop.CUTOFF, batch_size=2, max_run_duration=MINUTE, rule=rule,
                        archive=ArchiveTarget(shop.ARCHIVE, shop.POLICY, "run-1"))

    assert report.deleted_total == len(moved)
    assert set(shop.ids_of(engine, shop.ARCHIVE)) == moved
    assert set(shop.ids_of(engine, shop.TABLE)) == newer | (set() if inclusive else at)


def _check_table(engine):
    with engine.connect() as conn:
        return check_table(conn)


#: Each entry point of the core, called as if its rule were forgotten.
_WITHOUT_RULE = {
    "purge": lambda engine: purge(engine, CUTOFF, batch_size=10, max_run_duration=MINUTE),
    "measure_backlog": lambda engine: measure_backlog(engine, CUTOFF),
    "check_table": _check_table,
    "HealthMonitor": lambda engine: HealthMonitor(HealthLimits()),
    "apply_partition_functions": lambda engine: apply_partition_functions(engine, "cleanup"),
}


@pytest.mark.parametrize("entry", _WITHOUT_RULE)
def test_a_core_entry_point_without_its_rule_is_a_type_error_never_a_run_on_one_table(
        engine, rows, entry):
    old_guest = rows.add(updated_at=CUTOFF - 30 * DAY)
    with pytest.raises(TypeError):
        _WITHOUT_RULE[entry](engine)
    assert rows.ids() == {old_guest}
