"""``favorites-maintenance plan``: a team's project under git, its policies edited in the working
tree, compared with a commit (or a folder) and counted on the policies' own databases."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import (
    create_dev_schema,
    create_partitioned_dev_schema,
    drop_dev_schema,
    month_starts,
)
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.host_project import HOST_POLICY, host_project

pytestmark = pytest.mark.e2e

NOW = dt.datetime.now(dt.timezone.utc)
SECOND_URL_VAR = "BILLING_DATABASE_URL"


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com",
                    *args], check=True, capture_output=True)


def _policy(root: Path, name: str, **changes: str) -> Path:
    """``defs/<name>/defs.yaml``: :data:`HOST_POLICY` (30 days), ``changes`` replacing lines by
    their field (a value ``None`` drops the line)."""
    lines = []
    for line in HOST_POLICY.format(name=name).splitlines():
        key = line.strip().split(":", 1)[0]
        if key in changes:
            if changes[key] is not None:
                lines.append(f"  {key}: {changes[key]}")
        else:
            lines.append(line)
    lines += [f"  {k}: {v}" for k, v in changes.items()
              if v is not None and f"  {k}:" not in HOST_POLICY]
    path = root / "src" / "my_platform" / "defs" / name / "defs.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def project(tmp_path, db_url, pg_server):
    """A host project under git whose last commit holds three policies on the dev table
    (``kept``, ``narrowed``, ``removed``, 30 days each) and one on a second database
    (``billing``); the environment naming both databases."""
    root = host_project(tmp_path / "platform")
    for name in ("kept", "narrowed", "removed"):
        _policy(root, name)
    _policy(root, "billing", database_url_env=SECOND_URL_VAR)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "policies")
    second = pg_server.ensure_database(f"plan{os.getpid()}_billing")
    create_dev_schema(create_engine(second))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env.update({DATABASE_URL_VAR: db_url.render_as_string(hide_password=False),
                SECOND_URL_VAR: second.render_as_string(hide_password=False),
                "PYTHONPATH": str(root / "src")})
    yield root, env, create_engine(second)
    pg_server.drop_database(f"plan{os.getpid()}_billing")


def plan(root: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "favorites_maintenance", "plan", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def by_name(done: subprocess.CompletedProcess) -> dict:
    return {p["name"]: p for p in json.loads(done.stdout)["policies"]}


def test_a_lowered_retention_a_new_policy_and_a_removed_guard_are_counted_and_refused(
        project, rows):
    root, env, billing = project
    rows.add_many(5, updated_at=NOW - dt.timedelta(days=40))   # prunable before and after
    rows.add_many(3, updated_at=NOW - dt.timedelta(days=20))   # newly prunable at 10 days
    rows.add_many(2, updated_at=NOW - dt.timedelta(days=5))    # prunable by neither
    rows.add_many(4, updated_at=NOW - dt.timedelta(days=40), user_id=9)  # accounts
    Rows(billing).add_many(6, updated_at=NOW - dt.timedelta(days=40))
    _policy(root, "narrowed", retention_days="10")
    shutil.rmtree(root / "src" / "my_platform" / "defs" / "removed")
    _policy(root, "unguarded", null_columns="[]")
    _policy(root, "billing", database_url_env=SECOND_URL_VAR, retention_days="60")
    before = rows.count()

    done = plan(root, env, "--base", "main", "--json")
    assert done.returncode == 1, done.stderr
    lines = by_name(done)
    assert {n: lines[n]["change"] for n in lines} == {
        "billing": "changed", "kept": "unchanged", "narrowed": "changed",
        "removed": "removed", "unguarded": "added"}
    assert (lines["narrowed"]["newly_prunable"], lines["narrowed"]["no_longer_prunable"]) == (3, 0)
    assert lines["narrowed"]["settings_changed"] == {"retention_days": {"from": "30", "to": "10"}}
    # A new policy's whole first backlog, the accounts included (it has no guard).
    assert lines["unguarded"]["newly_prunable"] == 9
    assert lines["removed"]["no_longer_prunable"] == 5
    # Counted on its own database: 6 rows there, none of them past 60 days.
    assert (lines["billing"]["newly_prunable"], lines["billing"]["no_longer_prunable"]) == (0, 6)
    assert "narrowed, unguarded: would newly delete more than --max-newly-prunable 0" \
        in done.stderr
    assert rows.count() == before  # read only

    assert plan(root, env, "--base", "main", "--allow-widening").returncode == 0
    assert plan(root, env, "--base", "main", "--max-newly-prunable", "9").returncode == 0
    assert plan(root, env, "--base", "main", "--max-newly-prunable", "8").returncode == 1


def test_a_removed_guard_column_makes_the_accounts_newly_prunable(project, rows):
    root, env, _ = project
    rows.add_many(2, updated_at=NOW - dt.timedelta(days=40))
    rows.add_many(7, updated_at=NOW - dt.timedelta(days=40), user_id=3)
    _policy(root, "kept", null_columns="[]")

    done = plan(root, env, "--base", "main")
    assert done.returncode == 1
    assert "changed    kept" in done.stdout
    assert "null_columns: [user_id] -> []" in done.stdout
    assert "newly prunable 7 rows, no longer prunable 0 rows" in done.stdout


def test_an_unchanged_tree_plans_nothing_and_passes(project, rows):
    root, env, _ = project
    rows.add_many(3, updated_at=NOW - dt.timedelta(days=40))
    done = plan(root, env, "--base", "HEAD", "--json")
    assert done.returncode == 0, done.stderr
    assert {p["change"] for p in by_name(done).values()} == {"unchanged"}


def test_a_folder_is_a_base_too_and_a_bad_ref_is_named(project, rows, tmp_path):
    root, env, _ = project
    rows.add_many(3, updated_at=NOW - dt.timedelta(days=20))
    base = tmp_path / "base"
    shutil.copytree(root / "src" / "my_platform" / "defs", base)
    _policy(root, "kept", retention_days="7")
    done = plan(root, env, "--base", str(base), "--json")
    assert done.returncode == 1
    assert by_name(done)["kept"]["newly_prunable"] == 3

    bad = plan(root, env, "--base", "no-such-branch")
    assert bad.returncode == 2
    assert "--base no-such-branch: neither a folder nor a git ref of" in bad.stderr


def test_a_database_that_cannot_be_read_is_named_and_the_others_still_counted(project, rows):
    root, env, _ = project
    rows.add_many(3, updated_at=NOW - dt.timedelta(days=20))
    _policy(root, "kept", retention_days="7")
    _policy(root, "billing", database_url_env=SECOND_URL_VAR, retention_days="7")
    done = plan(root, {**env, SECOND_URL_VAR: "postgresql+psycopg://nobody:secret@127.0.0.1:1/x"},
                "--base", "main", "--json")
    assert done.returncode == 2
    lines = by_name(done)
    assert lines["kept"]["newly_prunable"] == 3
    assert lines["billing"]["newly_prunable"] is None
    assert "could not count policy billing's rows" in lines["billing"]["error"]
    assert "secret" not in done.stdout + done.stderr



def test_partitions_newly_past_the_cutoff_and_archived_rows_past_a_shorter_retention(
        project, engine):
    root, env, _ = project
    drop_dev_schema(engine)
    now = dt.datetime.now(dt.timezone.utc)
    starts = month_starts(now - dt.timedelta(days=400), 15)
    names = create_partitioned_dev_schema(engine, starts)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE favorites.kept_archive (LIKE favorites.favorites, "
            "_retention_run_id text NOT NULL, _retention_policy text NOT NULL, "
            "_retention_archived_at timestamptz NOT NULL)"))
        for days, policy in ((5, "kept"), (20, "kept"), (25, "kept"), (40, "kept"),
                             (20, "other")):
            conn.execute(sa.text(
                "INSERT INTO favorites.kept_archive (id, item_id, created_at, updated_at, "
                "_retention_run_id, _retention_policy, _retention_archived_at) VALUES "
                "(1, 1, now(), now(), 'r', :p, now() - make_interval(days => :d))"),
                {"p": policy, "d": days})
    _policy(root, "narrowed", drop_expired_partitions="true", retention_days="200")
    _policy(root, "kept", archive_table="favorites.kept_archive", archive_retention_days="30")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "a partitioned policy and an archive")
    _policy(root, "narrowed", drop_expired_partitions="true", retention_days="30")
    _policy(root, "kept", archive_table="favorites.kept_archive", archive_retention_days="15")

    done = plan(root, env, "--base", "main", "--json")
    assert done.returncode == 1, done.stderr
    lines = by_name(done)
    # Each monthly partition [starts[i], starts[i + 1]) whose end moved behind the cutoff.
    old_cutoff, new_cutoff = now - dt.timedelta(days=200), now - dt.timedelta(days=30)
    expected = [f"favorites.{name}" for name, end in zip(names, starts[1:])
                if old_cutoff < end <= new_cutoff]
    assert len(expected) >= 4
    assert lines["narrowed"]["partitions_newly_expired"] == expected
    # Archived 20 and 25 days ago: past 15 days, not past 30; the other policy's row is not its.
    assert lines["kept"]["archive_newly_prunable"] == 2


def test_a_folder_holding_no_policy_file_is_refused_and_a_written_out_default_is_no_change(
        project, tmp_path):
    root, env, _ = project
    one_policy = root / "src" / "my_platform" / "defs" / "kept"
    refused = plan(root, env, "--base", str(one_policy))
    assert refused.returncode == 2
    assert f"--base {one_policy}: no policy file" in refused.stderr
    # 48 hours is stale_after's default: written out, it changes nothing the policy does.
    _policy(root, "kept", stale_after="PT48H")
    done = plan(root, env, "--base", "main", "--json")
    assert done.returncode == 0, done.stderr
    assert by_name(done)["kept"]["change"] == "unchanged"


def test_what_is_not_there_yet_is_the_policy_s_error_and_the_other_side_is_still_counted(
        project, rows):
    root, env, _ = project
    rows.add_many(4, updated_at=NOW - dt.timedelta(days=40))
    # The partitioning migration has not run; the new table of a moved policy is there.
    _policy(root, "kept", drop_expired_partitions="true")
    _policy(root, "narrowed", table="favorites.missing_table")
    done = plan(root, env, "--base", "main", "--json")
    assert done.returncode == 2, done.stderr
    lines = by_name(done)
    assert lines["kept"]["newly_prunable"] is None
    assert "is not a partitioned table" in lines["kept"]["error"]
    # The old table is still read: its 4 rows are no longer deleted there.
    assert (lines["narrowed"]["no_longer_prunable"], lines["narrowed"]["newly_prunable"]) == (
        4, None)
    assert "favorites.missing_table" in lines["narrowed"]["error"]
    assert "Traceback" not in done.stderr


def test_an_archive_not_there_yet_is_not_counted_and_tags_read_as_written(project, rows):
    root, env, _ = project
    _policy(root, "kept", archive_table="favorites.kept_archive", tags="{team: billing}")
    done = plan(root, env, "--base", "main", "--json")
    assert done.returncode == 2, done.stderr
    kept = by_name(done)["kept"]
    assert kept["archive_newly_prunable"] is None
    assert "archive favorites.kept_archive does not exist yet" in kept["error"]
    assert kept["newly_prunable"] == 0  # the table's count is still made
    assert kept["settings_changed"]["tags"] == {"from": None, "to": "{team: billing}"}
