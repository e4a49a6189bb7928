"""The ``hold`` commands and the dry run of a policy with holds, against a real PostgreSQL, on a
fresh folder: through click's test runner in this process, and once as a separate process
where a script reads what the command prints (the id alone on stdout, a warning alone on
stderr)."""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from favorites_maintenance.cli import main
from favorites_maintenance_tests.e2e.test_cli import checkout, cli  # noqa: F401 (fixture)
from favorites_maintenance_tests.helpers.jobs import guest_variable

UTC = dt.timezone.utc
OLD = dt.datetime.now(UTC) - dt.timedelta(days=800)


def env_of(db_url, **settings) -> dict:
    env = {"FAVORITES_DATABASE_URL": db_url.render_as_string(hide_password=False)}
    env.update({guest_variable(name): value for name, value in settings.items()})
    return env


@pytest.fixture
def run(checkout, monkeypatch):  # noqa: F811
    """``run(*args, env=..., input=None)``: the command in this process, in the checkout, with
    only ``env``'s FAVORITES_ and DAGSTER_ variables set (as :func:`cli` starts a process);
    its exit code, stdout and stderr apart."""
    monkeypatch.chdir(checkout)
    unset = {k: None for k in os.environ if k.startswith(("FAVORITES_", "DAGSTER_"))}

    def invoke(*args: str, env: dict, input: str | None = None) -> Result:
        return CliRunner().invoke(main, list(args), env={**unset, **env}, input=input,
                                  catch_exceptions=False)

    return invoke


def test_hold_init_place_list_release_and_the_dry_run_counting_held_rows_apart(
        run, db_url, engine, rows):
    env = env_of(db_url, hold_table="favorites.retention_holds")
    held_id = rows.add(updated_at=OLD)
    rows.add(updated_at=OLD)

    init = run("hold", "init", "--policy", "guest_favorites", env=env)
    assert init.exit_code == 0, init.stderr
    assert init.stdout == "hold table favorites.retention_holds ready\n"
    again = run("hold", "init", "--policy", "guest_favorites", env=env)
    assert again.exit_code == 0, again.stderr

    placed = run("hold", "place", "--policy", "guest_favorites", "--key", str(held_id),
                 "--reason", "dispute #12", "--by", "support", env=env)
    assert placed.exit_code == 0, placed.stderr
    hold_id = int(placed.stdout)  # the id, and nothing else

    listed = run("hold", "list", "--policy", "guest_favorites", "--json", env=env)
    assert listed.exit_code == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert document["hold_table"] == "favorites.retention_holds"
    [only] = document["holds"]
    assert (only["id"], only["placed_by"], only["reason"], only["released_at"]) == (
        hold_id, "support", "dispute #12", None)
    assert "key" not in only and str(held_id) not in listed.stdout.replace(str(hold_id), "")
    shown = run("hold", "list", "--policy", "guest_favorites", "--show-keys", "--json",
                env=env)
    assert json.loads(shown.stdout)["holds"][0]["key"] == str(held_id)

    dry = run("dry-run", "--json", env=env)
    assert dry.exit_code == 0, dry.stderr
    now = json.loads(dry.stdout)["policies"][0]["now"]
    assert (now["prunable"], now["held"]) == (1, 1)
    text = run("dry-run", env=env)
    assert "held       1 row past the cutoff kept by an active hold" in text.stdout

    released = run("hold", "release", "--policy", "guest_favorites", "--id", str(hold_id),
                   "--by", "support", env=env)
    assert released.exit_code == 0, released.stderr
    assert released.stdout == f"hold {hold_id} released\n"
    twice = run("hold", "release", "--policy", "guest_favorites", "--id", str(hold_id),
                env=env)
    assert twice.exit_code == 2
    assert f"--id {hold_id}: no active hold of policy guest_favorites" in twice.stderr
    assert run("hold", "list", "--policy", "guest_favorites", env=env).stdout == (
        "no active holds of policy guest_favorites\n")
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT released_by FROM favorites.retention_holds")).scalar_one() == "support"
    assert json.loads(run("dry-run", "--json", env=env).stdout)[
        "policies"][0]["now"]["held"] == 0


def test_hold_commands_refuse_a_policy_without_hold_table_and_a_missing_table(run, db_url):
    bare = run("hold", "list", "--policy", "guest_favorites", env=env_of(db_url))
    assert bare.exit_code == 2
    # The guest policy reads hold_table from its variable: the fix is to set it.
    assert bare.stderr.startswith("error: --policy guest_favorites: the policy names no hold "
                                  "table; set FAVORITES_GUEST_RETENTION_HOLD_TABLE to "
                                  "schema.table, then run hold init")
    env = env_of(db_url, hold_table="favorites.retention_holds")
    missing = run("hold", "place", "--policy", "guest_favorites", "--key", "1", "--reason",
                  "r", env=env)
    assert missing.exit_code == 2
    assert "hold table favorites.retention_holds:" in missing.stderr
    assert "create it with favorites-maintenance hold init --policy guest_favorites" \
        in missing.stderr
    empty = run("hold", "place", "--policy", "guest_favorites", "--key", "1", "--reason", " ",
                env=env)
    assert empty.exit_code == 2 and "--reason must not be empty" in empty.stderr


def test_a_hold_command_that_cannot_reach_the_database_names_its_variable(run, db_url):
    from favorites_maintenance.local.processes import free_port

    nowhere = db_url.set(host="127.0.0.1", port=free_port(), query={"connect_timeout": "3"})
    listed = run("hold", "list", "--policy", "guest_favorites",
                 env=env_of(nowhere, hold_table="favorites.retention_holds"))
    assert listed.exit_code == 2
    assert listed.stderr.startswith("error: hold table favorites.retention_holds: ")
    assert listed.stderr.rstrip().endswith(
        "; check FAVORITES_DATABASE_URL and that the server runs"), listed.stderr
    assert db_url.password is None or db_url.password not in listed.stderr


def test_hold_place_reads_the_key_from_standard_input(run, db_url, engine, rows):
    """``--key -`` keeps the key out of the process list (``ps`` shows a command's
    arguments, and a key can name a person)."""
    env = env_of(db_url, hold_table="favorites.retention_holds")
    held_id = rows.add(updated_at=OLD)
    assert run("hold", "init", "--policy", "guest_favorites", env=env).exit_code == 0
    place = ("hold", "place", "--policy", "guest_favorites", "--key", "-", "--reason", "case")
    placed = run(*place, env=env, input=f"{held_id}\n")
    assert placed.exit_code == 0, placed.stderr
    shown = run("hold", "list", "--policy", "guest_favorites", "--show-keys", "--json",
                env=env)
    [only] = json.loads(shown.stdout)["holds"]
    assert (only["id"], only["key"]) == (int(placed.stdout), str(held_id))
    empty = run(*place, env=env, input="")
    assert empty.exit_code == 2 and "--key must not be empty" in empty.stderr


def test_hold_place_warns_when_no_row_has_the_key_and_places_the_hold_all_the_same(
        checkout, run, db_url, engine, rows):  # noqa: F811
    """A key no row has yet is held (the row may be inserted later), with a warning on
    stderr that does not repeat it; a key a row has is placed without one. Both places run
    as separate processes, as a script runs them: stdout holds the id alone, stderr the
    warning alone (nothing else the process prints)."""
    env = env_of(db_url, hold_table="favorites.retention_holds")
    held_id = rows.add(updated_at=OLD)
    assert run("hold", "init", "--policy", "guest_favorites", env=env).exit_code == 0
    place = ("hold", "place", "--policy", "guest_favorites", "--reason", "case", "--key")
    placed = cli(*place, str(held_id), cwd=checkout, env_extra=env)
    assert placed.returncode == 0, placed.stderr
    assert placed.stderr == ""
    absent = held_id + 987654
    unmatched = cli(*place, f"0{absent}", cwd=checkout, env_extra=env)
    assert unmatched.returncode == 0, unmatched.stderr
    assert int(unmatched.stdout) > int(placed.stdout)  # the id alone, as for any hold
    assert unmatched.stderr == (
        "warning: no row of favorites.favorites has this id now: the hold is placed and keeps "
        "such a row once it exists; check the key if it should be there\n")
    assert str(absent) not in unmatched.stderr
    shown = run("hold", "list", "--policy", "guest_favorites", "--show-keys", "--json",
                env=env)
    assert [h["key"] for h in json.loads(shown.stdout)["holds"]] == [str(held_id), str(absent)]


def test_the_dry_run_counts_a_hold_an_application_wrote_otherwise_as_a_run_keeps_it(
        run, db_url, engine, rows):
    """``0042`` is the bigint 42: a run reads the hold as the key's type and keeps the row, so
    the dry run counts that row as held, not as prunable."""
    env = env_of(db_url, hold_table="favorites.retention_holds")
    held_id = rows.add(updated_at=OLD)
    rows.add(updated_at=OLD)
    assert run("hold", "init", "--policy", "guest_favorites", env=env).exit_code == 0
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO favorites.retention_holds (policy, held_value, "
                             "placed_by, reason) VALUES ('guest_favorites', :v, 'app', 'case')"),
                     {"v": f"00{held_id}"})
    dry = run("dry-run", "--json", env=env)
    assert dry.exit_code == 0, dry.stderr
    now = json.loads(dry.stdout)["policies"][0]["now"]
    assert (now["prunable"], now["held"]) == (1, 1)
