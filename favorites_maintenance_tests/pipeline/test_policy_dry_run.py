"""The command line's ``dry-run`` over the policies: one policy by name, the counts at the
cutoff of now and of the next scheduled run, and ``--all`` over a project whose policies are
valid, broken or on a table that does not exist. Nothing is deleted.
"""

from __future__ import annotations

import datetime as dt
import json

from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.carts_policy import ANCHOR, UTC
from favorites_maintenance_tests.helpers.jobs import guest_settings_env


def test_the_command_line_dry_run_takes_the_policy_by_name(rows, db_url):
    from click.testing import CliRunner

    from favorites_maintenance.cli import main

    env = {DATABASE_URL_VAR: db_url.render_as_string(hide_password=False)}
    rows.add_many(3, updated_at=ANCHOR - dt.timedelta(days=400))
    ok = CliRunner().invoke(main, ["dry-run", "--policy", "guest_favorites"], env=env)
    assert ok.exit_code == 0, ok.output
    assert "policy     guest_favorites (favorites.favorites, user_id IS NULL)" in ok.output
    assert "prunable   3 rows" in ok.output
    unknown = CliRunner().invoke(main, ["dry-run", "--policy", "no_such_policy"], env=env)
    assert unknown.exit_code == 2
    # The list names every policy of defs/: guest_favorites, and any a checkout adds.
    assert "--policy 'no_such_policy': no such policy; the policies are " in unknown.output
    assert "guest_favorites" in unknown.output.split("the policies are ", 1)[1]


def test_dry_run_counts_with_the_cutoff_of_now_and_of_the_next_scheduled_run(
        rows, db_url, monkeypatch):
    """Both counts, rows on both sides of each cutoff: just older counts, at the cutoff does
    not. The next scheduled run (cron 0 3 * * *) runs the day before its tick's date, so its
    cutoff is that tick's midnight minus the retention (365 days)."""
    import croniter
    from click.testing import CliRunner

    from favorites_maintenance.cli import main

    guest_settings_env(monkeypatch)  # cron 0 3 * * *, 365 days
    now = dt.datetime.now(UTC)
    tick = croniter.croniter("0 3 * * *", now).get_next(dt.datetime)
    next_cutoff = dt.datetime.combine(tick.date(), dt.time(), UTC) - dt.timedelta(days=365)
    now_cutoff = now - dt.timedelta(days=365)
    second = dt.timedelta(seconds=1)
    placed = [(next_cutoff - second, 2), (next_cutoff, 3), (now_cutoff - second, 4),
              (now_cutoff + 60 * second, 5)]
    for at, n in placed:
        rows.add_many(n, updated_at=at, step=dt.timedelta(0))
    rows.add_many(6, updated_at=now_cutoff - dt.timedelta(days=9), user_id=7)  # account rows

    def older_than(cutoff):
        return sum(n for at, n in placed if at < cutoff)

    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    result = CliRunner().invoke(main, ["dry-run", "--json"])
    assert result.exit_code == 0, result.output
    [report] = json.loads(result.stdout)["policies"]
    assert report["next_run"] == {
        "at": tick.isoformat(), "cron": "0 3 * * *",
        "partition": (tick.date() - dt.timedelta(days=1)).isoformat(),
        "cutoff": next_cutoff.isoformat(), "prunable": older_than(next_cutoff)}
    assert report["now"]["prunable"] == older_than(now_cutoff)
    assert report["now"]["prunable"] != report["next_run"]["prunable"]
    assert dt.datetime.fromisoformat(report["now"]["cutoff"]) - now_cutoff < 10 * second
    text = CliRunner().invoke(main, ["dry-run"]).stdout
    assert (f"next run   {tick.isoformat()} (0 3 * * *), partition "
            f"{report['next_run']['partition']}: cutoff {next_cutoff.isoformat()}, "
            f"{older_than(next_cutoff):,} rows prunable") in text
    assert rows.count() == 20


def test_dry_run_all_counts_every_valid_policy_and_names_the_broken_and_unreadable(
        rows, db_url, monkeypatch, tmp_path):
    from click.testing import CliRunner

    from favorites_maintenance.cli import main
    from favorites_maintenance_tests.helpers.policy_files import (
        MISSPELLED,
        misspelled_error,
        policy_project,
    )

    guest_settings_env(monkeypatch)
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    rows.add_many(3, updated_at=dt.datetime.now(UTC) - dt.timedelta(days=400))
    orders = MISSPELLED.replace("guest_carts", "guest_orders").replace("carts.", "shop.") \
        .replace("retention_dayz", "retention_days")
    module = f"dry_run_{tmp_path.name}"  # imported in this process: a name of its own
    root = policy_project(tmp_path, {"guest_carts": MISSPELLED, "guest_orders": orders},
                          module=module)
    monkeypatch.syspath_prepend(str(root / "src"))
    result = CliRunner().invoke(main, ["dry-run", "--all", "--json", "-m",
                                       f"{module}.definitions"])
    error_line = misspelled_error(f"src/{module}/defs")
    assert result.exit_code == 2, result.output  # shop.guest_orders does not exist
    assert f"error: {error_line} (not loaded;" in result.stderr
    assert "error: policy guest_orders: " in result.stderr
    reports = {r["policy"]: r for r in json.loads(result.stdout)["policies"]}
    assert set(reports) == {"guest_carts", "guest_favorites", "guest_orders"}
    assert reports["guest_favorites"]["now"]["prunable"] == 3
    assert reports["guest_carts"]["error"] == error_line
    assert "shop.guest_orders" in reports["guest_orders"]["error"]
    assert json.loads(result.stdout)["deleted"] == 0


def test_dry_run_json_of_one_policy_that_cannot_be_counted_is_still_a_document(db_url):
    """A script reading ``dry-run --json`` gets the policy's ``error`` in the document, as
    with ``--all``, and the exit code 2; the database's password is in neither stream."""
    from click.testing import CliRunner

    from favorites_maintenance.cli import main

    missing = db_url.set(database="no_such_database", password="s3cret-pw")
    env = {DATABASE_URL_VAR: missing.render_as_string(hide_password=False)}
    result = CliRunner().invoke(main, ["dry-run", "--json"], env=env)
    assert result.exit_code == 2
    [report] = json.loads(result.stdout)["policies"]
    assert report["policy"] == "guest_favorites" and "now" not in report
    assert "could not read favorites.favorites" in report["error"]
    assert "s3cret-pw" not in result.stdout + result.stderr


def test_dry_run_refuses_all_with_a_policy_rather_than_dropping_the_policy(db_url):
    """``--all --policy NAME`` is one of two requests: the command says so instead of counting
    every policy as if the name (mistyped or not) had not been given."""
    from click.testing import CliRunner

    from favorites_maintenance.cli import main

    env = {DATABASE_URL_VAR: db_url.render_as_string(hide_password=False)}
    result = CliRunner().invoke(main, ["dry-run", "--all", "--policy", "no_such_policy"],
                                env=env)
    assert result.exit_code == 2
    assert "--all and --policy exclude each other" in result.stderr, result.output
    assert "prunable" not in result.stdout
