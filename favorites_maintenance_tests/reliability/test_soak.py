"""Load: at least 20 s of concurrent user writes during a purge of 100,000 rows, then a row by
row comparison of what is left with what the rule says must be gone.

Marked ``soak`` (about 40 s); deselect locally with ``-m "not soak"``. The figures are
printed (``pytest -s`` or ``-rA`` shows them). ``FAVORITES_TEST_SOAK_ROWS`` and
``FAVORITES_TEST_SOAK_SECONDS`` make it longer (e.g. 500000 and 60 for a soak of minutes).
"""

from __future__ import annotations

import datetime as dt
import os
import time

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES, dev_favorites
from favorites_maintenance.retention import measure_backlog
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import CUTOFF
from favorites_maintenance_tests.reliability.workload import UserSessions

PRUNABLE = int(os.environ.get("FAVORITES_TEST_SOAK_ROWS", "100000"))
ACCOUNTS = 20_000
FRESH_GUESTS = 20_000
TARGETS = PRUNABLE * 12 // 100  # prunable rows the user sessions claim, touch and hold
WRITERS = 4
MIN_SOAK_S = float(os.environ.get("FAVORITES_TEST_SOAK_SECONDS", "20"))
BATCH = 500
f = dev_favorites.c


def seed(engine) -> None:
    """Server-side: prunable guests over the 90 days before the cutoff, old account rows and
    fresh guests (all ids ascending in that order)."""
    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO favorites.favorites (user_id, anonymous_id, item_id, note, created_at,
                                             updated_at)
            SELECT NULL, gen_random_uuid(), g, NULL, t, t
              FROM generate_series(1, :n) g,
                   LATERAL (SELECT CAST(:cutoff AS timestamptz)
                                   - (interval '90 days' * random()) - interval '1 second') s(t)
        """), {"n": PRUNABLE, "cutoff": CUTOFF})
        conn.execute(sa.text("""
            INSERT INTO favorites.favorites (user_id, anonymous_id, item_id, created_at, updated_at)
            SELECT 1 + g % 5000, NULL, g, t, t
              FROM generate_series(1, :n) g,
                   LATERAL (SELECT CAST(:cutoff AS timestamptz) - interval '900 days') s(t)
        """), {"n": ACCOUNTS, "cutoff": CUTOFF})
        conn.execute(sa.text("""
            INSERT INTO favorites.favorites (user_id, anonymous_id, item_id, created_at, updated_at)
            SELECT NULL, gen_random_uuid(), g, now(), now() FROM generate_series(1, :n) g
        """), {"n": FRESH_GUESTS})
        conn.execute(sa.text("ANALYZE favorites.favorites"))


def ids(engine, where=None) -> set[int]:
    stmt = sa.select(f.id)
    if where is not None:
        stmt = stmt.where(where)
    with engine.connect() as conn:
        return set(conn.execute(stmt).scalars())


@pytest.mark.soak
def test_soak_concurrent_user_writes_during_a_purge(db_url, engine):
    seed(engine)
    prunable = ids(engine, sa.and_(f.user_id.is_(None), f.updated_at < CUTOFF))
    kept = ids(engine) - prunable
    assert len(prunable) == PRUNABLE
    targets = sorted(prunable)[:: PRUNABLE // TARGETS][:TARGETS]

    # The purge is paced to last at least as long as the soak (a throttled production purge
    # sleeping between batches), so that every user write happens while it runs.
    batches_expected = PRUNABLE // BATCH
    pace_s = MIN_SOAK_S / batches_expected
    started = time.monotonic()

    def pace(batch):
        behind = started + batch.batch_no * pace_s - time.monotonic()
        if behind > 0:
            time.sleep(behind)

    with UserSessions(db_url, targets, writers=WRITERS, hold_s=0.005) as users:
        report = purge_rows(engine, CUTOFF, batch_size=BATCH,
                            max_run_duration=dt.timedelta(minutes=10), on_batch=pace,
                            lock_timeout=dt.timedelta(seconds=5))
        purge_s = time.monotonic() - started
        while time.monotonic() - started < MIN_SOAK_S:
            time.sleep(0.2)
        writes = users.stop()
    soak_s = time.monotonic() - started
    # Rows users held when it passed.
    skipped = measure_backlog(engine, GUEST_FAVORITES, CUTOFF).remaining
    final = purge_rows(engine, CUTOFF, batch_size=BATCH, max_run_duration=dt.timedelta(minutes=5))

    print(f"\nsoak: {soak_s:.1f} s of user writes; purge of {PRUNABLE:,} prunable rows took "
          f"{purge_s:.1f} s in {report.batches} batches of {BATCH} "
          f"(longest batch {report.batch_max_s * 1000:.1f} ms)")
    print(f"soak: rows deleted {report.deleted_total:,} by the purge + {final.deleted_total:,} "
          f"skipped while a user held them, taken by the next run")
    print(f"soak: user writes done {writes.count:,} ({len(writes.claimed):,} rows claimed, "
          f"{len(writes.touched):,} touched, {len(writes.inserted):,} inserted, "
          f"{len(writes.found_gone):,} found already deleted) + {writes.held:,} lock holds "
          f"by {WRITERS} sessions; errors {len(writes.errors)}")
    print(f"soak: user write latency p50 {writes.percentile_ms(50):.1f} ms, "
          f"p99 {writes.percentile_ms(99):.1f} ms, max {writes.percentile_ms(100):.1f} ms")

    assert writes.errors == []
    assert soak_s >= MIN_SOAK_S and purge_s >= MIN_SOAK_S * 0.9
    assert final.deleted_total == skipped
    # Row by row: what is left is exactly what must be left.
    remaining = ids(engine)
    survivors = kept | writes.inserted | set(writes.claimed) | set(writes.touched)
    assert remaining == survivors
    gone = prunable - remaining
    assert gone == prunable - set(writes.claimed) - set(writes.touched)
    assert writes.found_gone <= gone
    assert report.deleted_total + final.deleted_total == len(gone)
    written = sorted(set(writes.claimed) | set(writes.touched))
    with engine.connect() as conn:
        values = {r.id: r for r in conn.execute(
            sa.select(f.id, f.user_id, f.note, f.updated_at).where(f.id.in_(written)))}
    for row_id, user in writes.claimed.items():
        assert values[row_id].user_id == user
    for row_id, note in writes.touched.items():
        assert values[row_id].note == note and values[row_id].updated_at >= CUTOFF
