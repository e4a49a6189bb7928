"""The SLO asset checks, evaluated in real runs of the job (SPEC 8)."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest

from favorites_maintenance.definitions import build_defs
from favorites_maintenance.settings import DATABASE_URL_VAR, Settings

UTC = dt.timezone.utc
OVERDUE = "no_guest_row_older_than_retention_plus_one_day"
SPIKE = "deleted_total_spike"


@pytest.fixture
def run(db_url, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))

    def run(instance, **settings):
        job = build_defs(Settings(**settings)).resolve_job_def("guest_favorites_cleanup_job")
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
    with dg.instance_for_test() as instance:
        # A run out of time after its first batch of 10 leaves 40 of the 50 old rows.
        checks = run(instance, batch_size=10, max_run_duration=dt.timedelta(microseconds=1))
    check = checks[OVERDUE]
    assert not check.passed
    assert check.severity == dg.AssetCheckSeverity.ERROR
    assert check.metadata["overdueGuestRows"].value == 40


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
