"""The ``hold`` commands and the dry run of a policy with holds, run as a user runs them: a
separate process on a fresh folder, against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json

import sqlalchemy as sa

from favorites_maintenance_tests.e2e.test_cli import checkout, cli  # noqa: F401 (fixture)
from favorites_maintenance_tests.helpers.jobs import guest_variable

UTC = dt.timezone.utc
OLD = dt.datetime.now(UTC) - dt.timedelta(days=800)


def env_of(db_url, **settings) -> dict:
    env = {"FAVORITES_DATABASE_URL": db_url.render_as_string(hide_password=False)}
    env.update({guest_variable(name): value for name, value in settings.items()})
    return env


def test_hold_init_place_list_release_and_the_dry_run_counting_held_rows_apart(
        checkout, db_url, engine, rows):  # noqa: F811
    env = env_of(db_url, hold_table="favorites.retention_holds")
    held_id = rows.add(updated_at=OLD)
    rows.add(updated_at=OLD)

    init = cli("hold", "init", "--policy", "guest_favorites", cwd=checkout, env_extra=env)
    assert init.returncode == 0, init.stderr
    assert init.stdout == "hold table favorites.retention_holds ready\n"
    again = cli("hold", "init", "--policy", "guest_favorites", cwd=checkout, env_extra=env)
    assert again.returncode == 0, again.stderr

    placed = cli("hold", "place", "--policy", "guest_favorites", "--key", str(held_id),
                 "--reason", "dispute #12", "--by", "support", cwd=checkout, env_extra=env)
    assert placed.returncode == 0, placed.stderr
    hold_id = int(placed.stdout)  # the id, and nothing else

    listed = cli("hold", "list", "--policy", "guest_favorites", "--json", cwd=checkout,
                 env_extra=env)
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert document["hold_table"] == "favorites.retention_holds"
    [only] = document["holds"]
    assert (only["id"], only["placed_by"], only["reason"], only["released_at"]) == (
        hold_id, "support", "dispute #12", None)
    assert "key" not in only and str(held_id) not in listed.stdout.replace(str(hold_id), "")
    shown = cli("hold", "list", "--policy", "guest_favorites", "--show-keys", "--json",
                cwd=checkout, env_extra=env)
    assert json.loads(shown.stdout)["holds"][0]["key"] == str(held_id)

    dry = cli("dry-run", "--json", cwd=checkout, env_extra=env)
    assert dry.returncode == 0, dry.stderr
    now = json.loads(dry.stdout)["policies"][0]["now"]
    assert (now["prunable"], now["held"]) == (1, 1)
    text = cli("dry-run", cwd=checkout, env_extra=env)
    assert "held       1 row past the cutoff kept by an active hold" in text.stdout

    released = cli("hold", "release", "--policy", "guest_favorites", "--id", str(hold_id),
                   "--by", "support", cwd=checkout, env_extra=env)
    assert released.returncode == 0, released.stderr
    assert released.stdout == f"hold {hold_id} released\n"
    twice = cli("hold", "release", "--policy", "guest_favorites", "--id", str(hold_id),
                cwd=checkout, env_extra=env)
    assert twice.returncode == 2
    assert f"--id {hold_id}: no active hold of policy guest_favorites" in twice.stderr
    assert cli("hold", "list", "--policy", "guest_favorites", cwd=checkout,
               env_extra=env).stdout == "no active holds of policy guest_favorites\n"
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT released_by FROM favorites.retention_holds")).scalar_one() == "support"
    assert json.loads(cli("dry-run", "--json", cwd=checkout, env_extra=env).stdout)[
        "policies"][0]["now"]["held"] == 0


def test_hold_commands_refuse_a_policy_without_hold_table_and_a_missing_table(
        checkout, db_url):  # noqa: F811
    bare = cli("hold", "list", "--policy", "guest_favorites", cwd=checkout,
               env_extra=env_of(db_url))
    assert bare.returncode == 2
    # The guest policy reads hold_table from its variable: the fix is to set it.
    assert bare.stderr.startswith("error: --policy guest_favorites: the policy names no hold "
                                  "table; set FAVORITES_GUEST_RETENTION_HOLD_TABLE to "
                                  "schema.table, then run hold init")
    env = env_of(db_url, hold_table="favorites.retention_holds")
    missing = cli("hold", "place", "--policy", "guest_favorites", "--key", "1", "--reason",
                  "r", cwd=checkout, env_extra=env)
    assert missing.returncode == 2
    assert "hold table favorites.retention_holds:" in missing.stderr
    assert "create it with favorites-maintenance hold init --policy guest_favorites" \
        in missing.stderr
    empty = cli("hold", "place", "--policy", "guest_favorites", "--key", "1", "--reason", " ",
                cwd=checkout, env_extra=env)
    assert empty.returncode == 2 and "--reason must not be empty" in empty.stderr



def test_hold_place_reads_the_key_from_standard_input(checkout, db_url, engine, rows):  # noqa: F811
    """``--key -`` keeps the key out of the process list (``ps`` shows a command's
    arguments, and a key can name a person)."""
    env = env_of(db_url, hold_table="favorites.retention_holds")
    held_id = rows.add(updated_at=OLD)
    assert cli("hold", "init", "--policy", "guest_favorites", cwd=checkout,
               env_extra=env).returncode == 0
    place = ("hold", "place", "--policy", "guest_favorites", "--key", "-", "--reason", "case")
    placed = cli(*place, cwd=checkout, env_extra=env, input=f"{held_id}\n")
    assert placed.returncode == 0, placed.stderr
    shown = cli("hold", "list", "--policy", "guest_favorites", "--show-keys", "--json",
                cwd=checkout, env_extra=env)
    [only] = json.loads(shown.stdout)["holds"]
    assert (only["id"], only["key"]) == (int(placed.stdout), str(held_id))
    empty = cli(*place, cwd=checkout, env_extra=env, input="")
    assert empty.returncode == 2 and "--key must not be empty" in empty.stderr


def test_hold_place_warns_when_no_row_has_the_key_and_places_the_hold_all_the_same(
        checkout, db_url, engine, rows):  # noqa: F811
    """A key no row has yet is held (the row may be inserted later), with a warning on
    stderr that does not repeat it; a key a row has is placed without one."""
    env = env_of(db_url, hold_table="favorites.retention_holds")
    held_id = rows.add(updated_at=OLD)
    assert cli("hold", "init", "--policy", "guest_favorites", cwd=checkout,
               env_extra=env).returncode == 0
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
    shown = cli("hold", "list", "--policy", "guest_favorites", "--show-keys", "--json",
                cwd=checkout, env_extra=env)
    assert [h["key"] for h in json.loads(shown.stdout)["holds"]] == [str(held_id), str(absent)]
