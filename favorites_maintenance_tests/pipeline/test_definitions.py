"""The code location loads, as Dagster loads it, and refuses bad settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from favorites_maintenance.definitions import build_defs
from favorites_maintenance.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DAGSTER = str(Path(sys.executable).parent / "dagster")


def validate(env_extra: dict, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env.update(env_extra, DAGSTER_HOME=str(home))  # an empty home: a throwaway local instance
    return subprocess.run([DAGSTER, "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_every_definition_resolves():
    defs = build_defs(Settings(cron="15 2 * * *"))
    dg.Definitions.validate_loadable(defs)
    assert defs.resolve_job_def("guest_favorites_cleanup_job")
    schedule = defs.resolve_schedule_def("guest_favorites_cleanup_schedule")
    assert schedule.cron_schedule == "15 2 * * *"
    assert schedule.execution_timezone == "UTC"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    for name in ("guest_favorites_cleanup_stale_sensor", "guest_favorites_cleanup_failure_sensor",
                 "guest_favorites_cleanup_tick_failure_sensor"):
        assert defs.resolve_sensor_def(name).default_status == dg.DefaultSensorStatus.RUNNING
    asset = defs.resolve_assets_def(["favorites", "guest_favorites_cleanup"])
    assert {k.name for k in defs.resolve_asset_graph().asset_check_keys} == {
        "no_guest_row_older_than_retention_plus_one_day", "deleted_total_spike",
        "no_rows_skipped"}
    [spec] = asset.specs
    assert spec.freshness_policy is not None


def test_dagster_loads_the_workspace(tmp_path):
    proc = validate({"FAVORITES_DATABASE_URL": "postgresql+psycopg://app@127.0.0.1:1/favorites"},
                    tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_dagster_refuses_the_workspace_on_a_bad_setting(tmp_path):
    proc = validate({"FAVORITES_GUEST_RETENTION_CRON": "0 3 * * * *"}, tmp_path)
    assert proc.returncode != 0
    assert "FAVORITES_GUEST_RETENTION_CRON: '0 3 * * * *' has 6 fields" in proc.stdout + proc.stderr
