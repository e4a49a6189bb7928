"""A backfill of a week: one run per daily partition, each bounded by ``now - Days``.

A run of day ``D`` uses ``cutoff = min(now, end of D) - Days``, so whatever order the
partitions run in, each run deletes a subset of what a run of a later day would, and no run ever
deletes a row that today's run would keep.
"""

from __future__ import annotations

import datetime as dt
import random

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.pipeline.partitions import daily_partitions
from favorites_maintenance.retention.schema import dev_favorites as t
from favorites_maintenance_tests.helpers.jobs import JOB, load_code_location

UTC = dt.timezone.utc
DAYS = 365
MICRO = dt.timedelta(microseconds=1)


@pytest.fixture
def defs(db_url, monkeypatch):
    return load_code_location(db_url, monkeypatch, retention_days=DAYS, batch_size=3)


def last_week() -> list[str]:
    """The seven latest complete daily partitions, oldest first."""
    return daily_partitions.get_partition_keys()[-7:]


def window_cutoff(partition: str) -> dt.datetime:
    return daily_partitions.time_window_for_partition_key(partition).end - dt.timedelta(days=DAYS)


def seed_around_each_cutoff(rows, partitions) -> dict[str, dict[str, int]]:
    """Per partition: a guest row just older than its cutoff, one exactly at it, and an old
    account row; plus fresh guests that no run may delete."""
    placed = {}
    for p in partitions:
        cutoff = window_cutoff(p)
        placed[p] = {
            "older": rows.add(updated_at=cutoff - MICRO),
            "at": rows.add(updated_at=cutoff),
            "account": rows.add(updated_at=cutoff - dt.timedelta(days=30), user_id=7),
        }
    rows.add_many(5, updated_at=dt.datetime.now(UTC) - dt.timedelta(days=DAYS - 1))
    return placed


def run(defs, instance, partition) -> dict:
    """Run one partition of the job; return its materialization metadata."""
    job = defs.resolve_job_def(JOB)
    result = job.execute_in_process(partition_key=partition, instance=instance)
    assert result.success
    [mat] = result.get_asset_materialization_events()
    assert mat.partition == partition
    return {k: v.value for k, v in mat.materialization.metadata.items()}


def test_each_run_of_a_backfilled_week_deletes_a_subset_bounded_by_now(defs, rows):
    partitions = last_week()
    placed = seed_around_each_cutoff(rows, partitions)
    accounts = rows.accounts()
    todays_deletions = guests_older_than(rows, dt.datetime.now(UTC) - dt.timedelta(days=DAYS))

    # Days 2, 5, 6, 7, 4, 3, 1 of the week: older days before newer ones (as a backfill runs
    # them) and newer before older (a retry, a second backfill); the second pass below runs
    # them oldest first.
    sequence = random.Random(3).sample(partitions, len(partitions))
    assert sequence != sorted(sequence) and sequence != sorted(sequence, reverse=True)
    with dg.instance_for_test() as instance:
        for p in sequence:
            before = rows.ids()
            meta = run(defs, instance, p)
            after = rows.ids()
            deleted = before - after
            cutoff = dt.datetime.fromisoformat(meta["cutoff"])

            # Never later than now - Days, and exactly the end of the partition's day - Days.
            assert cutoff <= dt.datetime.now(UTC) - dt.timedelta(days=DAYS)
            assert cutoff == window_cutoff(p)
            # What it deleted is what its own rule matched: nothing at or after its cutoff...
            assert placed[p]["at"] not in deleted
            assert placed[p]["older"] not in after
            assert meta["deletedTotal"] == len(deleted)
            assert meta["backlogRemaining"] == 0
            # ... and a subset of what today's run would delete, with no account row in it.
            assert deleted <= todays_deletions
            assert rows.accounts() == accounts

        # After the whole week every guest row older than the newest cutoff is gone, the rest
        # stays, and a second pass over the same week finds nothing left to delete.
        assert guests_older_than(rows, window_cutoff(partitions[-1])) == set()
        assert placed[partitions[-1]]["at"] in rows.ids()
        settled = rows.ids()
        assert [run(defs, instance, p)["deletedTotal"] for p in partitions] == [0] * 7
        assert rows.ids() == settled


def guests_older_than(rows, instant) -> set[int]:
    """Ids of the guest rows with ``updated_at < instant``."""
    with rows.engine.connect() as conn:
        return set(conn.execute(sa.select(t.c.id).where(t.c.user_id.is_(None),
                                                        t.c.updated_at < instant)).scalars())
