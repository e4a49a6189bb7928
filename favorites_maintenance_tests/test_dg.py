"""Dagster's project command line, ``dg``, on this repository: the policies' YAML validates
against the component's schema and ``dg list defs`` loads the code location."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
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


def test_dg_check_yaml_validates_every_policy(tmp_path):
    result = dg(tmp_path, "check", "yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All component YAML validated successfully" in result.stdout + result.stderr


def test_dg_list_defs_shows_the_guest_favorites_policy_under_its_names(tmp_path):
    result = dg(tmp_path, "list", "defs", "--json")
    assert result.returncode == 0, result.stderr
    listed = json.loads(result.stdout)
    assert [a["asset_key"] for a in listed["assets"]] == ["favorites/guest_favorites_cleanup"]
    assert [j["name"] for j in listed["jobs"]] == ["guest_favorites_cleanup_job"]
    assert {s["name"] for s in listed["sensors"]} == {
        "guest_favorites_cleanup_stale_sensor", "guest_favorites_cleanup_failure_sensor",
        "guest_favorites_cleanup_tick_failure_sensor"}
    assert [(s["name"], s["cron_schedule"]) for s in listed["schedules"]] == [
        ("guest_favorites_cleanup_schedule", "0 3 * * *")]
