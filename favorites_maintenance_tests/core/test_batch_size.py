"""The adaptive batch size: its rule, batch by batch (pure), and inside a real purge."""

from __future__ import annotations

import datetime as dt

import pytest

from favorites_maintenance.retention.batch_size import FLOOR, BatchSizeController
from favorites_maintenance.retention.scan import ScanMode
from favorites_maintenance_tests.helpers.purging import purge_rows

UTC = dt.timezone.utc
TARGET = dt.timedelta(milliseconds=200)


def test_fast_batches_grow_the_size_at_most_twofold_per_batch_up_to_the_max():
    sizes = BatchSizeController(1000, 10_000, TARGET)
    seen = [sizes.after_batch(sizes.size, 0.005) for _ in range(6)]
    assert seen == [2000, 4000, 8000, 10_000, 10_000, 10_000]


def test_growth_aims_below_the_target_at_the_batch_rate():
    sizes = BatchSizeController(1000, 100_000, TARGET)
    # 1000 rows in 90 ms: 0.45 of the target, so it grows, to 0.8 of the target at that rate.
    assert sizes.after_batch(1000, 0.090) == int(1000 * 0.8 * 0.2 / 0.090)


def test_a_batch_in_the_band_keeps_the_size():
    sizes = BatchSizeController(4000, 10_000, TARGET)
    for duration in (0.100, 0.150, 0.200):
        assert sizes.after_batch(4000, duration) == 4000
    assert sizes.shrinks == 0


def test_a_batch_over_the_target_shrinks_the_next_at_once():
    sizes = BatchSizeController(1000, 10_000, TARGET)
    for _ in range(3):
        sizes.after_batch(sizes.size, 0.01)
    assert sizes.size == 8000
    # 8000 rows in 800 ms: the next aims at 0.8 x 200 ms at 10 rows/ms.
    assert sizes.after_batch(8000, 0.800) == 1600
    assert sizes.shrinks == 1


def test_just_over_the_target_still_shrinks():
    sizes = BatchSizeController(5000, 10_000, TARGET)
    assert sizes.after_batch(5000, 0.201) < 5000


def test_the_size_never_goes_below_the_floor_nor_above_the_max():
    sizes = BatchSizeController(1000, 3000, TARGET)
    assert sizes.after_batch(1000, 60.0) == FLOOR
    assert sizes.after_batch(FLOOR, 60.0) == FLOOR
    for _ in range(20):
        sizes.after_batch(sizes.size, 0.0)
    assert sizes.size == 3000


def test_the_floor_is_never_above_the_first_size():
    sizes = BatchSizeController(10, 1000, TARGET)
    assert sizes.after_batch(10, 5.0) == 10


def test_another_session_waiting_on_the_purge_halves_the_size():
    sizes = BatchSizeController(8000, 10_000, TARGET)
    assert sizes.lock_waiters(0) == 8000
    assert sizes.lock_waiters(1) == 4000
    assert sizes.lock_waiters(3) == 2000
    assert sizes.shrinks == 2


def test_a_known_time_per_row_sizes_the_first_batch():
    # 0.8 of the 200 ms target at the previous run's time per row, within [floor, max].
    assert BatchSizeController(1000, 10_000, TARGET, row_s=100e-6).size == 1600
    assert BatchSizeController(1000, 10_000, TARGET, row_s=2e-3).size == FLOOR
    assert BatchSizeController(1000, 10_000, TARGET, row_s=1e-6).size == 10_000
    # Unknown: the first size. A fixed size (no target) takes no rate either.
    assert BatchSizeController(1000, 10_000, TARGET).size == 1000
    assert BatchSizeController(1000, 10_000, dt.timedelta(0), row_s=1e-6).size == 1000
    # An explicit size stays the bound: a known rate may only lower the first batch.
    assert BatchSizeController(500, 500, TARGET, row_s=1e-6).size == 500
    assert BatchSizeController(500, 500, TARGET, row_s=1e-3).size == 160


def test_after_a_batch_the_rest_of_a_counted_backlog_fits_at_the_rate_it_showed():
    sizes = BatchSizeController(1000, 10_000, TARGET)
    # Nothing measured: a batch of unknown cost is never larger than the first size.
    assert sizes.fit(3600) == 1000
    sizes.after_batch(1000, 0.005)  # 5 us a row
    assert sizes.row_s == pytest.approx(5e-6)
    assert sizes.fit(6000) == 6001  # 30 ms
    slow = BatchSizeController(1000, 10_000, TARGET)
    slow.after_batch(1000, 0.090)  # 90 us a row: 6,000 rows would take 540 ms
    assert slow.fit(6000) == slow.size < 6000
    # Larger than the max: the size grows toward it batch after batch.
    large = BatchSizeController(1000, 10_000, TARGET)
    large.after_batch(1000, 0.001)
    assert large.fit(10_000) == 2000
    # An explicit size is the bound of every batch: never above it.
    fixed = BatchSizeController(1000, 1000, TARGET)
    fixed.after_batch(1000, 0.001)
    assert fixed.fit(3600) == 1000
    assert BatchSizeController(1000, 10_000, dt.timedelta(0)).fit(3600) == 1000


def test_a_zero_target_keeps_the_first_size_whatever_happens():
    sizes = BatchSizeController(1000, 10_000, dt.timedelta(0))
    assert not sizes.adaptive
    assert sizes.after_batch(1000, 0.001) == 1000
    assert sizes.after_batch(1000, 30.0) == 1000
    assert sizes.lock_waiters(5) == 1000


def test_a_max_below_the_first_size_is_the_first_size():
    sizes = BatchSizeController(5000, 1000, TARGET)
    assert sizes.maximum == 5000
    assert sizes.after_batch(5000, 0.001) == 5000


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="first"):
        BatchSizeController(0, 10, TARGET)
    with pytest.raises(ValueError, match="floor"):
        BatchSizeController(10, 10, TARGET, floor=0)
    for row_s in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="row_s must be a number of seconds > 0"):
            BatchSizeController(10, 10, TARGET, row_s=row_s)


def test_a_purge_grows_its_batches_and_reports_the_largest(engine, rows):
    old = dt.datetime(2020, 1, 1, tzinfo=UTC)
    rows.add_many(1500, updated_at=old)
    keep = set(rows.add_many(20, updated_at=old, user_id=3))
    sizes = []
    report = purge_rows(engine, dt.datetime(2024, 1, 1, tzinfo=UTC), batch_size=100,
                        batch_size_max=400, target_batch_duration=dt.timedelta(seconds=5),
                        max_run_duration=dt.timedelta(minutes=1),
                        on_batch=lambda b: sizes.append(b.batch_size))
    assert report.deleted_total == 1500 and rows.ids() == keep
    # 100 + 200 + 400 + 400 + 400 = 1500: the last batch is full, one more finds nothing.
    assert sizes == [100, 200, 400, 400, 400, 400]
    assert (report.batch_size_first, report.batch_size_max) == (100, 400)


@pytest.mark.parametrize("scan, largest, sizes_expected", [
    # 100 + 200 + 400 + 800 + 1600 = 3100: past batch_size_max, the first batch within it.
    (ScanMode.KEYSET, 1600, [100, 200, 400, 800, 1600, 1600]),
    # Page order's ranges hold what their pages hold: only the largest is fixed.
    (ScanMode.PAGE_ORDER, 400, None),
], ids=["keyset-grows-to-its-max", "page-order-keeps-batch-size-max"])
def test_only_keyset_order_grows_its_batches_past_the_max_up_to_the_keyset_max(
        engine, rows, scan, largest, sizes_expected):
    old = dt.datetime(2020, 1, 1, tzinfo=UTC)
    rows.add_many(3100, updated_at=old)
    keep = set(rows.add_many(20, updated_at=old, user_id=3))
    sizes = []
    report = purge_rows(engine, dt.datetime(2024, 1, 1, tzinfo=UTC), batch_size=100,
                        batch_size_max=400, keyset_batch_size_max=1600,
                        target_batch_duration=dt.timedelta(seconds=5),
                        max_run_duration=dt.timedelta(minutes=1), scan=scan,
                        on_batch=lambda b: sizes.append(b.batch_size))
    assert report.scan_mode == scan.value
    assert report.deleted_total == 3100 and rows.ids() == keep
    assert max(sizes) == report.batch_size_max == largest
    assert report.batch_size_first == 100
    assert sizes_expected is None or sizes == sizes_expected


def test_a_purge_without_a_target_keeps_the_first_size(engine, rows):
    old = dt.datetime(2020, 1, 1, tzinfo=UTC)
    rows.add_many(250, updated_at=old)
    sizes = []
    report = purge_rows(engine, dt.datetime(2024, 1, 1, tzinfo=UTC), batch_size=100,
                        batch_size_max=400, max_run_duration=dt.timedelta(minutes=1),
                        on_batch=lambda b: sizes.append(b.batch_size))
    assert report.deleted_total == 250 and rows.count() == 0
    assert sizes == [100, 100, 100]
    assert report.batch_size_max == 100


def test_splitting_a_failed_batch_works_from_the_adaptive_size_and_grows_back_to_it(
        engine, rows):
    from favorites_maintenance_tests.reliability.conftest import delete_trigger

    old = dt.datetime(2020, 1, 1, tzinfo=UTC)
    ids = sorted(rows.add_many(1500, updated_at=old))
    poison = ids[350]  # in the third batch: 100 + 200, then 400 from offset 300
    delete_trigger(engine, "refuse_one", f"""
        IF OLD.id = {poison} THEN RAISE EXCEPTION 'refused'; END IF;
        RETURN OLD;""")
    sizes = []
    report = purge_rows(engine, dt.datetime(2024, 1, 1, tzinfo=UTC), batch_size=100,
                        batch_size_max=800, target_batch_duration=dt.timedelta(seconds=10),
                        max_run_duration=dt.timedelta(minutes=1),
                        on_batch=lambda b: sizes.append(b.batch_size))
    assert rows.ids() == {poison} and report.skipped_rows == 1
    assert sizes[:2] == [100, 200]
    # The third batch (400) fails and is split in halves down to the poisoned row; the pieces
    # that go through double back up to 400, the size the split started from, never past it.
    back = sizes.index(400)
    pieces = sizes[2:back]
    assert pieces and max(pieces) < 400 and min(pieces) == 1
    # Only after the isolation does the adaptive size grow again.
    assert sizes[back:back + 2] == [400, 800]
    assert report.batch_size_max == 800 and report.isolation_batches > 0


def test_a_step_up_that_lowers_the_rate_goes_back_and_holds_there_a_while():
    from favorites_maintenance.retention.batch_size import CEILING_BATCHES

    sizes = BatchSizeController(1000, 10_000, TARGET)
    assert sizes.after_batch(1000, 0.010) == 2000      # 100 rows/ms
    assert sizes.after_batch(2000, 0.020) == 4000      # same rate: grows on
    # 4000 rows in 150 ms (27 rows/ms): under the target, but each row costs almost four
    # times as much (a plan that scans every prunable row, say): back to 2000.
    assert sizes.after_batch(4000, 0.150) == 2000
    assert sizes.ceiling == 2000
    for _ in range(CEILING_BATCHES - 1):
        assert sizes.after_batch(2000, 0.020) == 2000
    # The ceiling lifts: the size may try again.
    assert sizes.after_batch(2000, 0.020) == 4000 and sizes.ceiling is None


def test_a_fast_batch_is_not_judged_on_its_rate():
    sizes = BatchSizeController(1000, 10_000, TARGET)
    sizes.after_batch(1000, 0.002)
    # A third of the rate, but 12 ms of a 200 ms target: noise at that scale, not a plan.
    assert sizes.after_batch(2000, 0.012) == 4000 and sizes.ceiling is None


def test_a_step_up_at_the_same_rate_is_no_step_too_far():
    sizes = BatchSizeController(1000, 10_000, TARGET)
    sizes.after_batch(1000, 0.010)
    # Twice the rows in a bit more than twice the time: noise, not a worse plan.
    assert sizes.after_batch(2000, 0.024) == 4000 and sizes.ceiling is None


def test_a_step_up_over_the_target_at_a_worse_rate_goes_back_rather_than_shrinking_by_time():
    sizes = BatchSizeController(4000, 10_000, TARGET)
    assert sizes.after_batch(4000, 0.040) == 8000      # 100 rows/ms
    # 8000 rows in 300 ms (27 rows/ms): by time alone it would shrink to 4266 and grow again.
    assert sizes.after_batch(8000, 0.300) == 4000 and sizes.ceiling == 4000
    assert sizes.after_batch(4000, 0.040) == 4000
