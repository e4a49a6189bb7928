"""Dagster's project command line, ``dg``, on this repository: the policies' YAML validates
against the component's schema, the definitions load, and ``dg list defs`` shows each policy
under its names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from favorites_maintenance.components.policy_tree import load_policies
from favorites_maintenance.pipeline.failure_sensor import FAILURE_SENSOR
from favorites_maintenance.pipeline.stale_sensor import STALE_SENSOR
from favorites_maintenance.pipeline.tick_failure_sensor import TICK_FAILURE_SENSOR

ROOT = Path(__file__).parents[2]
DG = Path(sys.executable).parent / "dg"


def dg(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    if not DG.exists():
        pytest.fail(f"dg not found next to {sys.executable}: install the test extras "
                    "(pip install -e '.[test]')")
    # An instance of its own: the repository's dagster.yaml wants Dagster's PostgreSQL storage.
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAVORITES_")}
    env["DAGSTER_HOME"] = str(home)
    return subprocess.run([str(DG), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_dg_check_yaml_and_defs_validate_every_policy(tmp_path):
    for check in ("yaml", "defs"):
        result = dg(tmp_path, "check", check)
        assert result.returncode == 0, result.stdout + result.stderr
    assert "All definitions loaded successfully" in result.stdout + result.stderr


def test_dg_list_defs_shows_each_policy_under_its_names(tmp_path):
    result = dg(tmp_path, "list", "defs", "--json")
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    policies = load_policies()
    assert "guest_favorites" in {p.name for p in policies}
    assert {a["asset_key"] for a in listed["assets"]} == {
        "/".join(p.asset_key_path) for p in policies}
    assert {j["name"] for j in listed["jobs"]} == {p.job_name for p in policies}
    assert {s["name"] for s in listed["sensors"]} == {  # one of each for the code location
        STALE_SENSOR, FAILURE_SENSOR, TICK_FAILURE_SENSOR, "cleanup_dead_run_sensor"}
    assert {(s["name"], s["cron_schedule"]) for s in listed["schedules"]} == {
        (p.schedule_name, p.settings.cron) for p in policies}
    # The location's resources, under the package's keys (a policy's run limits are its
    # asset's own, not the location's).
    assert sorted(r["name"] for r in listed["resources"]) == [
        "favorites_maintenance_alerts", "favorites_maintenance_favorites_database_url",
        "favorites_maintenance_metrics"]
    # The guest-favorites names are a contract.
    assert ("guest_favorites_cleanup_schedule", "0 3 * * *") in {
        (s["name"], s["cron_schedule"]) for s in listed["schedules"]}
    assert "favorites/guest_favorites_cleanup" in {a["asset_key"] for a in listed["assets"]}


def test_dg_scaffold_writes_every_field_and_dg_check_defs_names_what_to_fill_in_one_line(
        tmp_path, monkeypatch):
    """A newcomer's path: scaffold a policy, check it; the check fails with one line naming the
    file, the line and the fields still to fill in, never a stack trace."""
    import yaml

    from favorites_maintenance.components.policy_tree import project_tree
    from favorites_maintenance.config.policy_settings import SETTINGS
    from favorites_maintenance_tests.helpers.host_project import run_dg
    from favorites_maintenance_tests.helpers.policy_files import policy_project

    module = f"scaffolded_{tmp_path.name}"  # loaded in this process at the end: its own name
    root = policy_project(tmp_path / "platform", module=module)
    folder = root / "src" / module / "defs" / "guest_orders"
    made = run_dg(root, "scaffold", "defs", "favorites_maintenance.RetentionPolicy",
                  "guest_orders")
    assert made.returncode == 0, made.stdout + made.stderr
    text = (folder / "defs.yaml").read_text()
    written = yaml.safe_load(text)["attributes"]
    assert written["name"] == "guest_orders"
    assert {"table", "key_column", "age_column", "null_columns"} <= set(written)
    for setting in SETTINGS:  # every optional setting is there, set or commented out
        assert f"{setting}:" in text, setting

    checked = run_dg(root, "check", "defs")
    out = checked.stdout + checked.stderr
    assert checked.returncode != 0, out
    [line] = [n for n, t in enumerate(text.splitlines(), 1) if t.startswith("  table:")]
    assert (f"PolicyLoadError: src/{module}/defs/guest_orders/defs.yaml:{line}: "
            "policy guest_orders, table, key_column, age_column, null_columns: still the "
            "placeholders the scaffold wrote") in out, out
    assert "Traceback" not in out and "Stack Trace" not in out, out
    assert "Field required" not in out

    # Filled in, the policy loads beside guest_favorites.
    (folder / "defs.yaml").write_text(text.replace('"<schema>.<table>"', "shop.guest_orders")
                                      .replace('"<key column>"', "id")
                                      .replace('"<timestamptz column>"', "touched_at")
                                      .replace('["<guard column>"]', "[customer_id]"))
    monkeypatch.syspath_prepend(str(root / "src"))
    assert {p.name for p in load_policies(project_tree(f"{module}.definitions"))} == {
        "guest_orders", "guest_favorites"}
