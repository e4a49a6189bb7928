"""What a run's config may change: the run limits, within their bounds; never the rule or the
database. Run through ``execute_in_process`` against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest

from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.clock import CUTOFF, PARTITION
from favorites_maintenance_tests.helpers.jobs import JOB, load_code_location, run_report
from favorites_maintenance_tests.helpers.resource_keys import (
    ALERTS_KEY,
    DATABASE_KEY,
    LIMITS_KEY,
    METRICS_KEY,
)

#: The guest-favorites policy's variables (``defs/guest_favorites/defs.yaml``).
RETENTION_DAYS_VAR = "FAVORITES_GUEST_RETENTION_DAYS"
BATCH_SIZE_VAR = "FAVORITES_GUEST_RETENTION_BATCH_SIZE"
MAX_RUN_DURATION_VAR = "FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION"

UTC = dt.timezone.utc


@pytest.fixture
def job(db_url, monkeypatch):
    # Fixed batches (no target time), so that a launch's batch size shows in the batch count.
    defs = load_code_location(db_url, monkeypatch, retention_days=365,
                              target_batch_duration=dt.timedelta(0))
    return defs.resolve_job_def(JOB)


@pytest.fixture
def table(rows):
    """100 guest rows idle 2 to 101 days before the partition's cutoff anchor (kept by a 365-day
    retention), 30 guest rows older than the cutoff and 20 old account rows."""
    anchor = CUTOFF + dt.timedelta(days=365)
    recent = set(rows.add_many(100, updated_at=anchor - dt.timedelta(days=101),
                               step=dt.timedelta(days=1)))
    old = set(rows.add_many(30, updated_at=CUTOFF - dt.timedelta(days=30)))
    accounts = set(rows.add_many(20, updated_at=CUTOFF - dt.timedelta(days=500), user_id=3))
    return recent, old, accounts


def launch(job, instance, resources: dict):
    return job.execute_in_process(partition_key=PARTITION, instance=instance,
                                  run_config={"resources": resources})


def test_a_shorter_retention_at_launch_is_refused_before_any_run(job, rows, table):
    recent, old, accounts = table
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError) as refused:
            launch(job, instance, {LIMITS_KEY: {"config": {
                "retention_days": 1, "batch_size": 1000, "max_run_duration_seconds": 600}}})
        assert instance.get_runs() == []
    message = str(refused.value)
    assert "retention_days=1 refused" in message
    assert f"It is {RETENTION_DAYS_VAR} (365 days in this deployment)" in message
    assert rows.ids() == recent | old | accounts


@pytest.mark.parametrize("config, expected", [
    ({"retention_days": 400}, "retention_days=400 refused"),
    # Not a number: refused as any other retention, not a crash of the check.
    ({"retention_days": [365]}, r"retention_days=\[365\] refused"),
    ({"table": "favorites.accounts"}, "'table' refused: a launch may set only batch_size"),
    ({"age_column": "created_at"}, "'age_column' refused"),
])
def test_no_other_part_of_the_rule_can_be_given_at_launch(job, rows, table, config, expected):
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError, match=expected) as refused:
            launch(job, instance, {LIMITS_KEY: {"config": config}})
        assert instance.get_runs() == []
    assert RETENTION_DAYS_VAR in str(refused.value)
    assert len(rows.ids()) == 150


def test_the_database_cannot_be_chosen_at_launch(job, rows, table):
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError) as refused:
            launch(job, instance, {DATABASE_KEY: {"config": {
                "url": "postgresql+psycopg://app:elsewhere-pw@127.0.0.1:9/other"}}})
        assert instance.get_runs() == []
    assert f"It is {DATABASE_URL_VAR}" in str(refused.value)
    assert "elsewhere-pw" not in str(refused.value)


@pytest.mark.parametrize("resource, config, variables", [
    # Whoever may launch a run could silence the failure alert, or collect the run's figures.
    (ALERTS_KEY, {"webhook_url": "https://hooks.elsewhere.example/T0/B0/leak"},
     "FAVORITES_ALERT_WEBHOOK_URL and FAVORITES_WEBSERVER_BASE_URL"),
    (ALERTS_KEY, {"webserver_base_url": "https://elsewhere.example", "attempts": 0},
     "FAVORITES_ALERT_WEBHOOK_URL and FAVORITES_WEBSERVER_BASE_URL"),
    (METRICS_KEY, {"gateway_url": "http://collector:elsewhere-pw@elsewhere.example:9091"},
     "FAVORITES_METRICS_PUSHGATEWAY_URL"),
], ids=["alerts-webhook", "alerts-other-keys", "metrics-gateway"])
def test_where_alerts_and_metrics_go_cannot_be_chosen_at_launch(job, rows, table, resource,
                                                                config, variables):
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError) as refused:
            launch(job, instance, {resource: {"config": config}})
        assert instance.get_runs() == []
    message = str(refused.value)
    assert message.startswith(f"{', '.join(sorted(config))} refused: "), message
    assert f"is not chosen at launch. It is {variables}, read from the environment of the " \
           "process serving the code location" in message, message
    assert "elsewhere" not in message
    assert len(rows.ids()) == 150


@pytest.mark.parametrize("limits, variable", [
    ({"batch_size": 0}, BATCH_SIZE_VAR),
    ({"batch_size": 100_001}, BATCH_SIZE_VAR),
    ({"max_run_duration_seconds": 0.5}, MAX_RUN_DURATION_VAR),
    # Past the 50-minute cap under the 1 h run ceiling of dagster.yaml.
    ({"max_run_duration_seconds": 3001}, MAX_RUN_DURATION_VAR),
])
def test_limits_at_launch_meet_the_bounds_of_their_variables(job, rows, table, limits, variable):
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError) as refused:
            launch(job, instance, {LIMITS_KEY: {"config": limits}})
        assert instance.get_runs() == []
    [key] = limits
    message = str(refused.value)
    assert message.startswith(f"{key}=") and "refused: it must be between" in message
    assert f"the bounds of {variable}" in message
    assert len(rows.ids()) == 150


def test_limits_within_the_bounds_apply_and_the_deployed_retention_may_be_restated(
        job, rows, table):
    recent, old, accounts = table
    with dg.instance_for_test() as instance:
        result = launch(job, instance, {LIMITS_KEY: {"config": {
            "retention_days": 365, "batch_size": 7, "max_run_duration_seconds": 120}}})
        assert result.success
    run = run_report(result)
    assert (run.retention_days, run.batch_size) == (365, 7)
    assert (run.deleted_total, run.batches) == (30, 5)
    assert rows.ids() == recent | accounts
