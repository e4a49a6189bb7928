"""The SLO asset checks, evaluated in real runs of the job."""

from __future__ import annotations

import datetime as dt
import socket

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance_tests.conftest import slow_batches
from favorites_maintenance_tests.helpers.jobs import (
    ASSET_KEY,
    JOB,
    failure_text,
    load_code_location,
    materialization,
)
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR

UTC = dt.timezone.utc
OVERDUE = "no_guest_row_older_than_retention_plus_one_day"
SPIKE = "deleted_total_spike"


@pytest.fixture
def run(db_url, monkeypatch):
    def run(instance, **settings):
        job = load_code_location(db_url, monkeypatch, **settings).resolve_job_def(JOB)
        yesterday = (dt.datetime.now(UTC) - dt.timedelta(days=1)).date().isoformat()
        result = job.execute_in_process(partition_key=yesterday, instance=instance)
        return {e.check_name: e for e in result.get_asset_check_evaluations()}

    return run


def long_ago(days: float) -> dt.datetime:
    return dt.datetime.now(UTC) - dt.timedelta(days=days)


def test_overdue_check_passes_when_the_run_drained_the_backlog(run, rows):
    rows.add_many(50, updated_at=long_ago(500))
    rows.add_many(10, updated_at=long_ago(900), user_id=4)  # account rows never count
    with dg.instance_for_test() as instance:
        checks = run(instance)
    assert checks[OVERDUE].passed
    assert checks[OVERDUE].metadata["overdueGuestRows"].value == 0


def test_overdue_check_fails_with_error_severity_when_guest_rows_are_left(run, rows):
    rows.add_many(50, updated_at=long_ago(500))
    rows.add_many(5, updated_at=long_ago(365.5))  # prunable, but within the day of slack
    # The shortest budget a policy may have (PT1S), and a first batch that outlasts it.
    with slow_batches(rows.engine, 1.5), dg.instance_for_test() as instance:
        # A run out of time after its first batch of 10 leaves 40 of the 50 old rows.
        checks = run(instance, batch_size=10, max_run_duration=dt.timedelta(seconds=1))
    check = checks[OVERDUE]
    assert not check.passed
    assert check.severity == dg.AssetCheckSeverity.ERROR
    assert check.metadata["overdueGuestRows"].value == 40
    assert check.description.startswith("40 guest rows are older than this run's cutoff")


def test_the_guest_favorites_policy_keeps_its_check_names_and_metadata_keys(db_url, rows,
                                                                          monkeypatch):
    """Its check history, dashboards and alerts read these names: every one of them, pinned."""
    rows.add_many(5, updated_at=long_ago(500))
    defs = load_code_location(db_url, monkeypatch)
    checks = {c.name for c in defs.resolve_asset_graph().asset_check_keys}
    assert checks == {OVERDUE, SPIKE, "no_rows_skipped"}
    yesterday = (dt.datetime.now(UTC) - dt.timedelta(days=1)).date().isoformat()
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(JOB).execute_in_process(partition_key=yesterday,
                                                              instance=instance)
    assert set(materialization(result)) == {
        "deletedTotal", "batches", "durationMs", "batchMaxMs", "cutoff", "retentionDays",
        "batchSize", "batchSizeMode", "stopReason", "skippedRows", "skippedCauses",
        "isolationBatches", "batchSizeFirst", "batchSizeMax", "pausedMs", "pacedMs",
        "scanMode", "scanReason", "throttledBy", "healthUnreadable", "backlogRemaining",
        "backlogOldestUpdatedAt", "msPerRow"}
    overdue = {e.check_name: e for e in result.get_asset_check_evaluations()}[OVERDUE]
    assert set(overdue.metadata) == {"overdueGuestRows", "oldestOverdueUpdatedAt", "cutoff",
                                     "limit"}
    assert overdue.metadata["overdueGuestRows"].value == 0
    assert overdue.description is None


def test_spike_check_warns_on_a_run_far_above_the_recent_median(run, rows):
    with dg.instance_for_test() as instance:
        for _ in range(3):
            rows.add_many(100, updated_at=long_ago(400))
            assert run(instance)[SPIKE].passed  # too little history, or no spike
        rows.add_many(3000, updated_at=long_ago(400))
        normal_growth = run(instance)[SPIKE]
        rows.add_many(20_000, updated_at=long_ago(400))
        spike = run(instance)[SPIKE]
    assert normal_growth.passed  # 3,000 is 30x the median but under median + 10,000 rows
    assert not spike.passed
    assert spike.severity == dg.AssetCheckSeverity.WARN
    assert spike.metadata["deletedTotal"].value == 20_000
    assert spike.metadata["median"].value == 100


def test_spike_check_needs_history_before_it_can_fail(run, rows):
    rows.add_many(30_000, updated_at=long_ago(400))
    with dg.instance_for_test() as instance:
        check = run(instance)[SPIKE]
    assert check.passed
    assert "earlier current-day runs" in check.description


def test_a_range_run_counts_once_in_the_spike_baseline(db_url, rows, monkeypatch):
    """A single-run backfill of the last two days (both current) after two normal days: its
    figures enter the baseline once, on its last day, and its earlier day, a reference, not at
    all (as a 0 it would be a fourth run; copied onto both days, the range's figures would be
    counted twice)."""
    from favorites_maintenance.pipeline.partitions import daily_partitions

    job = load_code_location(db_url, monkeypatch).resolve_job_def(JOB)
    before_yesterday, yesterday = daily_partitions.get_partition_keys()[-2:]
    with dg.instance_for_test() as instance:
        for _ in range(2):
            expired_guests(rows, 20_000)
            assert job.execute_in_process(partition_key=yesterday, instance=instance).success
        expired_guests(rows, 20_000)
        ranged = job.execute_in_process(instance=instance, tags={
            "dagster/asset_partition_range_start": before_yesterday,
            "dagster/asset_partition_range_end": yesterday})
        expired_guests(rows, 20_000)
        normal = job.execute_in_process(partition_key=yesterday, instance=instance)
    by_day = {e.partition: e for e in ranged.get_asset_check_evaluations()
              if e.check_name == SPIKE}
    assert set(by_day) == {before_yesterday, yesterday}
    assert by_day[before_yesterday].passed
    assert by_day[before_yesterday].metadata["attributedTo"].value == yesterday
    assert by_day[yesterday].metadata["deletedTotal"].value == 20_000
    assert by_day[yesterday].metadata["history"].value == 2
    [spike] = [e for e in normal.get_asset_check_evaluations() if e.check_name == SPIKE]
    assert spike.metadata["history"].value == 3
    assert spike.metadata["median"].value == 20_000
    assert spike.passed


BACKFILL = """
mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }
"""


def test_a_backfill_of_past_days_is_never_red_and_does_not_skew_the_spike_baseline(
        dagster_storage_url, db_url, rows, monkeypatch):
    """The README's flow, on three days rather than a week: a backfill of past days launched as
    the UI launches it, run by the backfill daemon on a PostgreSQL-backed instance as one run
    over the three days, after three normal days. Each check records one result per day, for
    that day, and none fails; the next normal day is no spike although the backfill deleted 0
    rows (its three days counted in, they would bring the median of the six down to
    10,000)."""
    from dagster_graphql.test.utils import execute_dagster_graphql

    from favorites_maintenance.pipeline.partitions import daily_partitions
    from favorites_maintenance_tests.helpers.daemon import backfill_pass, code_location, pg_instance

    # The code server started below inherits this environment: the same settings.
    job = load_code_location(db_url, monkeypatch).resolve_job_def(JOB)
    yesterday = daily_partitions.get_last_partition_key()
    days = daily_partitions.get_partition_keys()[-5:-2]  # three past days, none current
    with pg_instance(dagster_storage_url, run_in_process=True) as instance:
        for _ in range(3):  # three normal days, 20,000 expired rows each
            expired_guests(rows, 20_000)
            assert job.execute_in_process(partition_key=yesterday, instance=instance).success
        # Idle for 365.5 days: overdue for today's cutoff, not for any backfilled day's.
        rows.add_many(20, updated_at=long_ago(366.5))
        with code_location(instance) as workspace:
            # Its steps in the run's process (run config of Dagster's default executor): what
            # the checks record is under test here, not the executor, whose process per step
            # would add seconds per step (test_backfill.py runs a backfill's steps apart).
            launched = execute_dagster_graphql(workspace.create_request_context(), BACKFILL, {
                "params": {"assetSelection": [{"path": list(ASSET_KEY.path)}],
                           "partitionNames": days,
                           "runConfigData": {"execution": {"config": {"in_process": {}}}}}})
            backfill_id = launched.data["launchPartitionBackfill"]["backfillId"]
            for _ in range(10):
                backfill_pass(workspace)
                if instance.get_backfill(backfill_id).status.value != "REQUESTED":
                    break
            assert instance.get_backfill(backfill_id).status.value == "COMPLETED_SUCCESS"
        [backfill_run] = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        assert (backfill_run.tags["dagster/asset_partition_range_start"],
                backfill_run.tags["dagster/asset_partition_range_end"]) == (days[0], days[-1])
        assert backfill_run.status == dg.DagsterRunStatus.SUCCESS
        assert rows.count() == 20  # the backfilled days deleted nothing (their cutoffs are older)

        expired_guests(rows, 20_000)
        normal = job.execute_in_process(partition_key=yesterday, instance=instance)
        history = {name: instance.event_log_storage.get_asset_check_execution_history(
                       dg.AssetCheckKey(ASSET_KEY, name), limit=100)
                   for name in (OVERDUE, SPIKE, "no_rows_skipped")}

    for name, records in history.items():
        # One record per day of each run and check, for that day, none left planned or skipped.
        assert len(records) == 3 + 3 + 1, name
        assert {r.status.value for r in records} == {"SUCCEEDED"}, name
        assert sorted(r.partition for r in records if r.run_id == backfill_run.run_id) == days
        assert [r.partition for r in records if r.run_id == normal.run_id] == [yesterday]
    spike = history[SPIKE][0].event.dagster_event.asset_check_evaluation_data
    assert spike.metadata["deletedTotal"].value == 20_020
    assert spike.metadata["median"].value == 20_000  # the three normal days only


def expired_guests(rows, n: int) -> None:
    """Insert ``n`` guest rows idle for 400 days, in one statement."""
    with rows.engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO favorites.favorites (anonymous_id, item_id, created_at, updated_at) "
            "SELECT gen_random_uuid(), i, now() - interval '400 days', now() - interval '400 days' "
            "FROM generate_series(1, :n) AS i"), {"n": n})


def test_a_check_that_cannot_be_evaluated_fails_the_step_after_the_others_record(
        db_url, rows, monkeypatch):
    """The policy's checks share one step: the overdue count on a database that cannot be
    reached fails it, but only once the checks that do not read the database have recorded
    their results, and the run's log names the check."""
    rows.add_many(5, updated_at=long_ago(500))
    yesterday = (dt.datetime.now(UTC) - dt.timedelta(days=1)).date().isoformat()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    unreachable = sa.make_url(db_url).set(host="127.0.0.1", port=closed_port)
    keys = {dg.AssetCheckKey(ASSET_KEY, name) for name in (OVERDUE, SPIKE, "no_rows_skipped")}
    with dg.instance_for_test() as instance:
        assert load_code_location(db_url, monkeypatch).resolve_job_def(JOB).execute_in_process(
            partition_key=yesterday, instance=instance).success
        # The checks alone, as the asset's Checks tab runs them.
        checks_only = load_code_location(unreachable, monkeypatch).resolve_job_def(
            JOB).get_subset(asset_selection=set(), asset_check_selection=keys)
        result = checks_only.execute_in_process(partition_key=yesterday, instance=instance,
                                                raise_on_error=False)
        logs = "\n".join(entry.user_message for entry in instance.all_logs(result.run_id))
    assert not result.success
    recorded = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(recorded) == {SPIKE, "no_rows_skipped"}
    assert all(e.passed for e in recorded.values())
    assert f"check {OVERDUE} could not be evaluated" in logs
    assert DATABASE_URL_VAR in failure_text(result)
