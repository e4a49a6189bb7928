"""The command line, run as a user runs it: a separate process on a fresh folder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def checkout(tmp_path):
    """A folder holding the instance and workspace files, as a checkout does."""
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copyfile(ROOT / name, tmp_path / name)
    os.chmod(tmp_path, 0o755)
    return tmp_path


def cli(*args, cwd, env_extra=None, timeout=600):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "favorites_maintenance", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def number(label: str, text: str) -> int:
    match = re.search(rf"{label}\s+([\d,]+)", text)
    assert match, f"{label!r} not in output:\n{text}"
    return int(match[1].replace(",", ""))


def test_demo_deletes_the_prunable_rows_and_leaves_account_rows(checkout):
    proc = cli("demo", "--rows", "20000", cwd=checkout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    matched = int(re.search(r"the rule matches ([\d,]+) rows", out)[1].replace(",", ""))
    assert matched > 0
    assert number("rows deleted", out) == matched
    assert number("backlog remaining", out) == 0
    accounts = re.search(r"account rows\s+([\d,]+) -> ([\d,]+)", out)
    assert accounts[1] == accounts[2]
    assert "(unchanged)" in out
    # The run was recorded in the persistent instance of the checkout.
    assert (checkout / ".favorites-maintenance" / "dagster_home" / "dagster.yaml").is_file()


def test_demo_pretend_deletes_nothing(checkout):
    proc = cli("demo", "--rows", "5000", "--pretend", cwd=checkout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pretend: nothing deleted" in proc.stdout
    assert "rows deleted" not in proc.stdout


def test_dry_run_counts_without_deleting(checkout, db_url, rows):
    import datetime as dt

    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=400)
    rows.add_many(30, updated_at=old)
    rows.add_many(5, updated_at=old, user_id=1)
    url = db_url.render_as_string(hide_password=False)
    proc = cli("dry-run", cwd=checkout, env_extra={"FAVORITES_DATABASE_URL": url})
    assert proc.returncode == 0, proc.stderr
    assert "prunable   30 rows" in proc.stdout
    assert rows.count() == 35


def test_a_bad_setting_stops_the_command_naming_it(checkout):
    proc = cli("dry-run", cwd=checkout,
               env_extra={"FAVORITES_DATABASE_URL": "postgresql://u:topsecret@h/db",
                          "FAVORITES_GUEST_RETENTION_DAYS": "zero"})
    assert proc.returncode == 2
    assert "FAVORITES_GUEST_RETENTION_DAYS: 'zero' is not a whole number" in proc.stderr
    assert "topsecret" not in proc.stderr + proc.stdout


def test_demo_never_touches_an_exported_database(checkout, db_url, rows):
    import datetime as dt

    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=400)
    kept = rows.add_many(20, updated_at=old) + rows.add_many(5, updated_at=old, user_id=1)
    url = db_url.render_as_string(hide_password=False)
    proc = cli("demo", "--rows", "2000", cwd=checkout,
               env_extra={"FAVORITES_DATABASE_URL": url})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FAVORITES_DATABASE_URL is ignored by demo" in proc.stderr
    assert rows.ids() == set(kept)


def test_dry_run_on_an_unreachable_database_says_so_without_a_traceback(checkout):
    proc = cli("dry-run", cwd=checkout, env_extra={
        "FAVORITES_DATABASE_URL": "postgresql://bob:topsecret@127.0.0.1:1/app"})
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: could not read favorites.favorites: connection_lost")
    assert "check FAVORITES_DATABASE_URL" in proc.stderr
    assert "Traceback" not in proc.stderr and "topsecret" not in proc.stderr
