"""Prometheus metrics: each run's gauges pushed to a real Pushgateway through Dagster, read back
from what the gateway serves; the shipped alerting rules, unit-tested by ``promtool``."""

from __future__ import annotations

import datetime as dt
import importlib.resources
import re
import subprocess
import time
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml

from favorites_maintenance.components.policy_tree import load_policies
from favorites_maintenance.config.parsers import METRICS_PUSHGATEWAY_URL_VAR
from favorites_maintenance.config.policy import Policy, PolicyError
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.local.processes import free_port
from favorites_maintenance.pipeline.metrics import GAUGES
from favorites_maintenance_tests.helpers.clock import CUTOFF, PARTITION
from favorites_maintenance_tests.helpers.jobs import run_job
from favorites_maintenance_tests.helpers.pushgateway import Pushgateway, require_pushgateway
from favorites_maintenance_tests.helpers.system_packages import require_program

UTC = dt.timezone.utc
OLD = CUTOFF - dt.timedelta(days=40)
JOB = "guest_favorites_cleanup"
PREFIX = "favorites_guest_cleanup"
PASSWORD = "pushgateway-s3cr3t"
RULES_TEST = Path(__file__).parent / "prometheus" / "rules_test.yml"


@pytest.fixture
def gateway():
    with Pushgateway(require_pushgateway()) as gw:
        yield gw


def run_pushing(db_url, monkeypatch, instance, gateway_url: str) -> dg.ExecuteInProcessResult:
    """One run of the guest-favorites job pushing to ``gateway_url`` (a failure is returned)."""
    monkeypatch.setenv(METRICS_PUSHGATEWAY_URL_VAR, gateway_url)
    return run_job(db_url, instance, partition=PARTITION, monkeypatch=monkeypatch,
                   batch_size=1000)


def run_log(instance, result) -> str:
    return "\n".join(str(e.user_message) for e in instance.all_logs(result.run_id))


def values(gateway: Pushgateway) -> dict[str, float]:
    """The guest-favorites gauges the gateway serves, by name without the prefix; each with
    the labels ``job`` and ``policy``."""
    series = gateway.series(JOB)
    found = {}
    for name, (labels, value) in series.items():
        if name.startswith(PREFIX + "_"):
            assert (labels["job"], labels["policy"]) == (JOB, "guest_favorites"), labels
            found[name.removeprefix(PREFIX + "_")] = value
    return found


def with_credentials(url: str) -> str:
    return url.replace("http://", f"http://pusher:{PASSWORD}@")


def test_each_run_pushes_its_gauges_and_the_next_run_replaces_them(db_url, rows, monkeypatch,
                                                                    gateway):
    rows.add_many(1500, updated_at=OLD)
    fresh = rows.add(updated_at=CUTOFF + dt.timedelta(days=1))
    with dg.instance_for_test() as instance:
        before = time.time()
        first = run_pushing(db_url, monkeypatch, instance, with_credentials(gateway.url))
        assert first.success
        after_first = values(gateway)
        rows.add_many(300, updated_at=OLD)
        second = run_pushing(db_url, monkeypatch, instance, with_credentials(gateway.url))
        assert second.success
        after_second = values(gateway)
        logs = run_log(instance, first) + run_log(instance, second)

    assert rows.ids() == {fresh}
    assert set(after_first) == set(GAUGES)
    assert {k: after_first[k] for k in ("deleted_rows", "batches", "backlog_rows",
                                        "skipped_rows", "last_run_success")} == {
        "deleted_rows": 1500, "batches": 2, "backlog_rows": 0, "skipped_rows": 0,
        "last_run_success": 1}
    assert after_first["run_duration_seconds"] >= 0
    assert before <= after_first["last_run_timestamp_seconds"] <= time.time()
    assert after_first["last_success_timestamp_seconds"] == \
        after_first["last_run_timestamp_seconds"]

    assert (after_second["deleted_rows"], after_second["batches"]) == (300, 1)
    assert after_second["last_run_success"] == 1
    assert after_second["last_success_timestamp_seconds"] == \
        after_second["last_run_timestamp_seconds"] >= after_first["last_run_timestamp_seconds"]
    assert PASSWORD not in logs


def test_a_failed_run_pushes_success_0_and_keeps_the_last_success(db_url, rows, engine,
                                                                   monkeypatch, gateway):
    rows.add_many(20, updated_at=OLD)
    with dg.instance_for_test() as instance:
        assert run_pushing(db_url, monkeypatch, instance, gateway.url).success
        succeeded = values(gateway)
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE favorites.favorites"))
        failed_run = run_pushing(db_url, monkeypatch, instance, gateway.url)
        assert not failed_run.success
        failed = values(gateway)

    assert failed["last_run_success"] == 0
    assert failed["last_run_timestamp_seconds"] >= succeeded["last_run_timestamp_seconds"]
    assert failed["last_success_timestamp_seconds"] == \
        succeeded["last_success_timestamp_seconds"]
    assert (failed["deleted_rows"], failed["batches"]) == (0, 0)
    # Not measured by the failed run: the last measured backlog stays.
    assert failed["backlog_rows"] == succeeded["backlog_rows"] == 0


def test_an_unreachable_gateway_is_logged_without_credentials_and_the_run_succeeds(
        db_url, rows, monkeypatch):
    rows.add_many(20, updated_at=OLD)
    nobody = f"http://127.0.0.1:{free_port()}"
    with dg.instance_for_test() as instance:
        result = run_pushing(db_url, monkeypatch, instance, with_credentials(nobody) + "/push")
        logs = run_log(instance, result)

    assert result.success
    assert rows.count() == 0
    assert f"metrics push to {nobody}/push failed (the run is not affected)" in logs
    assert PASSWORD not in logs and "pusher" not in logs


def test_the_shipped_rules_pass_their_promtool_unit_tests():
    promtool = require_program("promtool", "apt-get install -y prometheus")
    rules = importlib.resources.files("favorites_maintenance") / "prometheus" / "rules.yml"
    assert rules.is_file()
    proc = subprocess.run([promtool, "test", "rules", str(RULES_TEST)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_rules_read_only_gauges_the_runs_push():
    rules = importlib.resources.files("favorites_maintenance") / "prometheus" / "rules.yml"
    exprs = [rule["expr"] for group in yaml.safe_load(rules.read_text())["groups"]
             for rule in group["rules"]]
    names = {name for expr in exprs for name in re.findall(rf"\b{PREFIX}_\w+", expr)}
    assert names and names <= {f"{PREFIX}_{suffix}" for suffix in GAUGES}


def test_the_metrics_prefix_is_the_policys_own():
    [guest] = [p for p in load_policies() if p.name == "guest_favorites"]
    assert guest.metrics_prefix == PREFIX
    assert Policy("guest_carts", GUEST_FAVORITES).metrics_prefix == "guest_carts_cleanup"
    with pytest.raises(PolicyError, match="metrics_prefix 'Guest-Cleanup'"):
        Policy("guest_carts", GUEST_FAVORITES, metrics_prefix="Guest-Cleanup")
