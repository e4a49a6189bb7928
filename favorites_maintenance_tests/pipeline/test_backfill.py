"""A week of days: run one daily partition per run, each bounded by ``now - Days``, or
backfilled as one run over the range.

A run of day ``D`` uses ``cutoff = min(now, end of D) - Days``, so whatever order the
partitions run in, each run deletes a subset of what a run of a later day would, and no run ever
deletes a row that today's run would keep. A backfill is one run over its range
(``BackfillPolicy.single_run()``): it purges once, to the cutoff of the range's last day, and
materializes every day of the range, with its checks, counting its figures once.
"""

from __future__ import annotations

import datetime as dt
import os
import random

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import dev_favorites as t
from favorites_maintenance.pipeline.partitions import daily_partitions
from favorites_maintenance_tests.helpers.jobs import ASSET_KEY, JOB, load_code_location

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


BACKFILL = """
mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }
"""
#: Run config of Dagster's default executor: still a process per step, forked from a server
#: that has imported the code location once rather than a fresh Python start per step.
FORKSERVER = {"execution": {"config": {"multiprocess": {"start_method": {"forkserver": {}}}}}}
CHECKS = ("no_guest_row_older_than_retention_plus_one_day", "deleted_total_spike",
          "no_rows_skipped")


def test_a_backfill_is_one_run_that_materializes_every_day_with_its_checks_once(
        defs, rows, dagster_storage_url):
    """A backfill of five days (the last two of them current) launched as the UI launches it
    (its run config picks the start method of the code location's executor), submitted by the
    backfill daemon and launched by the run queue in a run worker: one run, which purges to
    the last day's cutoff, materializes each day once with one result per check, and puts its
    figures on the last day only. A run of one of those days stays possible afterwards."""
    from dagster_graphql.test.utils import execute_dagster_graphql

    from favorites_maintenance_tests.helpers.daemon import (
        backfill_pass,
        code_location,
        dequeue_pass,
        pg_instance,
        step_processes,
        wait_until_finished,
    )

    days = daily_partitions.get_partition_keys()[-5:]
    first, last = days[0], days[-1]
    placed = seed_around_each_cutoff(rows, days)
    accounts, before = rows.accounts(), rows.ids()
    # Everything older than the last day's cutoff: each day's "older" row, and the row "at"
    # each earlier day's cutoff.
    expected = guests_older_than(rows, window_cutoff(last))
    assert len(expected) == 2 * len(days) - 1
    with pg_instance(dagster_storage_url) as instance, code_location(instance) as workspace:
        launched = execute_dagster_graphql(workspace.create_request_context(), BACKFILL, {
            "params": {"assetSelection": [{"path": list(ASSET_KEY.path)}],
                       "partitionNames": days, "runConfigData": FORKSERVER}})
        backfill_id = launched.data["launchPartitionBackfill"]["backfillId"]
        backfill_pass(workspace)  # submits the backfill's run to the queue
        [run] = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        dequeue_pass(workspace)
        run = wait_until_finished(instance, run.run_id)
        for _ in range(5):
            backfill_pass(workspace)
            if instance.get_backfill(backfill_id).status.value != "REQUESTED":
                break
        assert instance.get_backfill(backfill_id).status.value == "COMPLETED_SUCCESS"
        assert len(instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))) == 1
        # On the code location's executor (the policy's own job keeps in-process; a backfill
        # of the asset runs Dagster's asset job): in processes of the run's, never the test's,
        # one per step.
        workers = step_processes(instance, run.run_id)
        mats = {day: instance.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=ASSET_KEY, asset_partitions=[day]),
                    limit=10).records for day in days}
        history = {name: instance.event_log_storage.get_asset_check_execution_history(
                       dg.AssetCheckKey(ASSET_KEY, name), limit=100) for name in CHECKS}

        # A run of one day of the range, as the schedule or the UI launches one.
        again = defs.resolve_job_def(JOB).execute_in_process(partition_key=days[2],
                                                             instance=instance)
        [single] = again.get_asset_materialization_events()

    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert (run.tags["dagster/asset_partition_range_start"],
            run.tags["dagster/asset_partition_range_end"]) == (first, last)
    assert "dagster/partition" not in run.tags
    # compute_cutoff, purge, measure_backlog and the checks' one step
    assert len(workers) == 4 and os.getpid() not in workers

    # One purge, to the last day's cutoff: exactly the rows its rule matched are gone.
    deleted = before - rows.ids()
    assert deleted == expected
    assert placed[last]["at"] in rows.ids()
    assert rows.accounts() == accounts

    # Every day materialized once by the run; the figures on the last day, summed once.
    meta = {}
    for day, records in mats.items():
        [record] = [r for r in records if r.run_id == run.run_id]
        meta[day] = {k: v.value for k, v in record.asset_materialization.metadata.items()}
    assert meta[last]["deletedTotal"] == len(expected)
    assert meta[last]["batches"] >= 1 and "attributedTo" not in meta[last]
    assert sum(m["deletedTotal"] for m in meta.values()) == len(deleted)
    assert sum(m["batches"] for m in meta.values()) == meta[last]["batches"]
    for day in days:
        assert meta[day]["cutoff"] == window_cutoff(last).isoformat()  # the run's one cutoff
        assert meta[day]["partitionRange"] == f"{first}...{last}"
        assert meta[day]["backlogRemaining"] == 0
    for day in days[:-1]:
        assert meta[day]["attributedTo"] == last
        assert (meta[day]["deletedTotal"], meta[day]["batches"], meta[day]["durationMs"]) \
            == (0, 0, 0)

    # Each check: one result per day, for that day, tied to that day's materialization.
    for name, records in history.items():
        mine = {r.partition: r for r in records if r.run_id == run.run_id}
        assert sorted(mine) == days, name
        assert {r.status.value for r in mine.values()} == {"SUCCEEDED"}, name
        for day, record in mine.items():
            evaluation = record.event.dagster_event.asset_check_evaluation_data
            target = evaluation.target_materialization_data
            [mat] = [r for r in mats[day] if r.run_id == run.run_id]
            assert (target.run_id, target.storage_id) == (run.run_id, mat.storage_id), name
    overdue = {r.partition: r.event.dagster_event.asset_check_evaluation_data.metadata
               for r in history[CHECKS[0]] if r.run_id == run.run_id}
    for day in days:  # each day judged against its own cutoff
        assert overdue[day]["cutoff"].value == window_cutoff(day).isoformat()
        assert overdue[day]["overdueGuestRows"].value == 0
    spike = {r.partition: r.event.dagster_event.asset_check_evaluation_data.metadata
             for r in history["deleted_total_spike"] if r.run_id == run.run_id}
    assert spike[last]["deletedTotal"].value == len(expected)
    assert all(spike[day]["attributedTo"].value == last for day in days[:-1])

    # The later run of one day: its own cutoff, nothing left to delete, no reference.
    single_meta = {k: v.value for k, v in single.materialization.metadata.items()}
    assert single.partition == days[2]
    assert single_meta["cutoff"] == window_cutoff(days[2]).isoformat()
    assert single_meta["deletedTotal"] == 0
    assert "attributedTo" not in single_meta and "partitionRange" not in single_meta
