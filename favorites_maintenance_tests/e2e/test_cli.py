"""The command line, run as a user runs it: a separate process on a fresh folder."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path):
    """A folder holding the instance and workspace files, as a checkout does."""
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copyfile(ROOT / name, tmp_path / name)
    os.chmod(tmp_path, 0o755)
    return tmp_path


def cli(*args, cwd, env_extra=None, timeout=600, input=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "favorites_maintenance", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout, input=input)


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
    assert "held rows" not in out and "hold table" not in out  # no hold table configured
    accounts = re.search(r"account rows\s+([\d,]+) -> ([\d,]+)", out)
    assert accounts[1] == accounts[2]
    assert "(unchanged)" in out
    assert "  seeding: 20,000 / 20,000 rows" in out  # progress while seeding
    # The run was recorded in the persistent instance of the checkout.
    assert (checkout / ".favorites-maintenance" / "dagster_home" / "dagster.yaml").is_file()


def test_demo_runs_the_policy_of_the_second_database_on_that_database(checkout):
    proc = cli("demo", "--policy", "eu_guest_favorites", "--rows", "2000", cwd=checkout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "running eu_guest_favorites_cleanup_job" in out
    assert "recreating favorites.favorites in the embedded 'favorites_eu' database" in out
    assert "database=FAVORITES_EU_DATABASE_URL" in out  # the run's "run started" line
    matched = int(re.search(r"the rule matches ([\d,]+) rows", out)[1].replace(",", ""))
    assert matched > 0 and number("rows deleted", out) == matched
    assert "(unchanged)" in out


def test_demo_of_a_policy_whose_days_start_today_refuses_before_seeding(checkout):
    """No day of the policy has ended yet: the run could not record what it deleted, so the
    demo says so and neither seeds nor runs."""
    import datetime as dt

    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    proc = cli("demo", "--rows", "2000", cwd=checkout,
               env_extra={"FAVORITES_GUEST_RETENTION_PARTITIONS_START": today})
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert (f"policy guest_favorites has no day to run yet: its partitions start on {today} "
            "(FAVORITES_GUEST_RETENTION_PARTITIONS_START)") in proc.stderr, \
        proc.stderr[-3000:]
    assert "seeding" not in proc.stdout and "running" not in proc.stdout


def test_demo_of_the_guest_policy_with_holds_seeds_and_gives_it_its_hold_table(checkout):
    """A hold table does not change which table there is to seed, and the schema the demo
    recreates takes the hold table with it: the demo creates it again, so its run can read it."""
    proc = cli("demo", "--rows", "2000", cwd=checkout,
               env_extra={"FAVORITES_GUEST_RETENTION_HOLD_TABLE": "favorites.retention_holds"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "  seeding: 2,000 / 2,000 rows" in out
    matched = int(re.search(r"the rule matches ([\d,]+) rows", out)[1].replace(",", ""))
    assert matched > 0 and number("rows deleted", out) == matched
    assert "hold table favorites.retention_holds: recreated with the schema, no holds" in out
    assert number("held rows", out) == 0  # a fresh hold table holds nothing
    assert "(unchanged)" in out


def test_demo_of_a_policy_whose_hold_table_is_in_a_schema_of_its_own_creates_it(checkout):
    """A hold table outside the schema the demo recreates, in a schema the embedded database
    does not have yet (a production database's): the demo creates both, as it says, and runs
    on them, rather than stopping on a traceback."""
    proc = cli("demo", "--rows", "2000", "--pretend", cwd=checkout,
               env_extra={"FAVORITES_GUEST_RETENTION_HOLD_TABLE": "audit.retention_holds"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "hold table audit.retention_holds: kept as it is (created if missing)" in proc.stdout
    assert "pretend: nothing deleted" in proc.stdout
    assert "Traceback" not in proc.stderr


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


def test_version_and_help_say_what_each_command_does(checkout):
    version = cli("--version", cwd=checkout)
    assert version.returncode == 0
    assert re.fullmatch(r"favorites-maintenance, version \d+\.\d+\.\d+\n", version.stdout)
    top = cli("--help", cwd=checkout).stdout
    commands = top.split("Commands:")[1]
    for name in ("bench", "demo", "dev", "dry-run"):
        assert re.search(rf"^  {name} ", commands, re.M), top
    assert "..." not in commands  # no summary cut short
    demo = " ".join(cli("demo", "--help", cwd=checkout).stdout.split())
    assert "DROPS AND RECREATES the schema favorites (every table in it)" in demo
    assert ".favorites-maintenance/ of the checkout" in demo
    dev = " ".join(cli("dev", "--help", cwd=checkout).stdout.split())
    assert "--reseed Drop and recreate the dev table and seed it again" in dev


def test_dev_reseed_drops_what_the_table_held_and_seeds_it_again(engine, rows):
    import datetime as dt

    from favorites_maintenance.local.dev import prepare_dev_table
    from favorites_maintenance.local.guest_favorites import dev_favorites

    marked = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    kept = rows.add_many(7, updated_at=marked, step=dt.timedelta(0))
    said = []
    prepare_dev_table(engine, 3000, said.append)
    assert rows.ids() == set(kept)  # a table with rows is left as it is
    prepare_dev_table(engine, 3000, said.append, reseed=True)
    assert rows.count() == 3000
    assert rows.count(dev_favorites.c.updated_at == marked) == 0
    assert "dropping and recreating the schema favorites (--reseed)" in said
    assert "  seeding: 3,000 / 3,000 rows" in said


def test_dev_output_keeps_info_and_drops_colour_and_debug_lines_off_a_terminal():
    """What dagster dev writes, relayed to a redirected log: no ANSI codes, no DEBUG lines
    unless asked for, every other line (a multi-line error included) as it came."""
    import io
    import os as _os

    from favorites_maintenance.local.dev import relay_output

    lines = [
        b"\x1b[32m2026-11-30 22:03:08 +0000\x1b[0m - dagster.daemon - \x1b[34mINFO\x1b[0m"
        b" - daemon started\n",
        b"2026-11-30 22:03:09 +0000 - dagster - DEBUG - job - 1234 - purge - batch 2 deleted"
        b" 100 rows (200 so far)\n",
        b"2026-11-30 22:03:09 +0000 - dagster - INFO - job - 1234 - purge - batch 1 deleted"
        b" 100 rows (100 so far)\n",
        b"2026-11-30 22:03:10 +0000 - dagster - ERROR - job - 1234 - purge - run failed\n",
        b"Traceback (most recent call last):\n",
    ]
    # Idle sensor ticks: every 30 s each, in the UI's tick history, not on the terminal.
    lines += [
        (b"2026-11-30 22:03:11 +0000 - dagster.daemon.SensorDaemon - INFO - Checking for new "
         b"runs for sensor: favorites_maintenance_failure_sensor\n"),
        (b"2026-11-30 22:03:11 +0000 - dagster.daemon.SensorDaemon - INFO - Sensor "
         b"favorites_maintenance_failure_sensor skipped: Sensor function returned an empty "
         b"result\n"),
        (b"2026-11-30 22:03:12 +0000 - dagster.daemon.SensorDaemon - ERROR - ALERT: "
         b"guest_favorites cleanup failed: asset favorites/guest_favorites_cleanup\n"),
    ]
    for debug, expect in ((False, [0, 2, 3, 4, 7]), (True, [0, 1, 2, 3, 4, 5, 6, 7])):
        read, write = _os.pipe()
        with _os.fdopen(write, "wb") as w:
            w.writelines(lines)
        out = io.StringIO()
        with _os.fdopen(read, "rb") as r:
            relay_output(r, out, plain=True, debug=debug)
        text = out.getvalue()
        assert "\x1b" not in text
        assert text.splitlines() == [re.sub(r"\x1b\[[0-9;]*m", "", lines[i].decode()).rstrip("\n")
                                     for i in expect]


def test_a_demo_killed_while_seeding_leaves_a_server_the_next_demo_attaches_to_and_stops(
        checkout):
    """SIGKILL leaves the server up and the killed pid in its handles file; the next command
    says it attaches, drops the dead handle and stops the server when it ends."""
    import json
    import signal

    from favorites_maintenance.local.embedded import EmbeddedPostgres
    from favorites_maintenance.local.processes import alive, read_pid_file

    pgdata = checkout / ".favorites-maintenance" / "pgdata"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    killed = subprocess.Popen([sys.executable, "-m", "favorites_maintenance", "demo", "--rows",
                               "400000"], cwd=checkout, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        said = []
        for line in killed.stdout:
            said.append(line)
            if "seeding" in line:
                break
        assert any("seeding 400,000 rows" in line for line in said), "".join(said)
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        server_pid = read_pid_file(pgdata / "postmaster.pid")
        assert alive(server_pid)
        assert killed.pid in json.loads((pgdata / ".handle_pids.json").read_text())

        again = cli("demo", "--rows", "2000", "--pretend", cwd=checkout)
        assert again.returncode == 0, again.stderr[-3000:]
        assert (f"attaching to the embedded PostgreSQL server already running on {pgdata} "
                f"(pid {server_pid}; left running by pid {killed.pid}, which has ended: stopped "
                "when this command ends)") in again.stdout, again.stdout
        assert again.stdout.rstrip().endswith("stopped the embedded PostgreSQL server")
        assert not alive(server_pid)
        assert json.loads((pgdata / ".handle_pids.json").read_text()) == []
    finally:
        killed.kill()
        if (pgdata / "postmaster.pid").exists():
            EmbeddedPostgres(pgdata).start().stop()


def test_demo_and_dry_run_of_a_valid_policy_go_on_beside_a_broken_one(checkout, db_url, rows):
    """A misspelled field in a second policy of a project: demo and dry-run of guest_favorites
    (``-m`` naming the project's code location) say so in one line and run; dry-run of the
    broken one fails with that line; the code location itself still refuses to load (its own
    test: pipeline/test_definitions.py)."""
    import datetime as dt

    from favorites_maintenance_tests.helpers.policy_files import (
        MISSPELLED,
        misspelled_error,
        policy_project,
    )

    project = policy_project(checkout / "project", {"guest_carts": MISSPELLED},
                             module="broken_platform")
    location = ("-m", "broken_platform.definitions")
    error_line = misspelled_error("src/broken_platform/defs")
    warning = f"warning: {error_line} (not loaded; the code location does not load until"
    rows.add_many(4, updated_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=400))
    src = {"PYTHONPATH": str(project / "src")}
    url = {"FAVORITES_DATABASE_URL": db_url.render_as_string(hide_password=False), **src}
    demo = cli("demo", "--rows", "2000", *location, cwd=checkout, env_extra=src)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert demo.stderr.count(warning) == 1, demo.stderr[-3000:]
    assert re.search(r"run \S+ succeeded", demo.stdout), demo.stdout[-3000:]

    dry = cli("dry-run", "--policy", "guest_favorites", *location, cwd=checkout, env_extra=url)
    assert dry.returncode == 0, dry.stderr
    assert dry.stderr.count(warning) == 1 and "Traceback" not in dry.stderr
    assert "prunable   4 rows" in dry.stdout

    broken = cli("dry-run", "--policy", "guest_carts", *location, cwd=checkout, env_extra=url)
    assert broken.returncode == 2
    assert broken.stderr == f"error: {error_line}\n"


def test_dry_run_all_lists_a_broken_policy_with_its_error_and_fails(tmp_path, db_url, rows):
    """A script running ``dry-run --all --json`` in its project sees the broken policy in the
    document, with the one line every tool shows for it, and a non-zero exit; the valid policy
    is still counted, and ``dry-run --policy`` of it still succeeds."""
    import datetime as dt
    import json

    from favorites_maintenance_tests.helpers.policy_files import (
        MISSPELLED,
        misspelled_error,
        policy_project,
    )

    rows.add_many(4, updated_at=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=400))
    root = policy_project(tmp_path, {"guest_carts": MISSPELLED})
    url = {"FAVORITES_DATABASE_URL": db_url.render_as_string(hide_password=False),
           "PYTHONPATH": str(root / "src")}
    every = cli("dry-run", "--all", "--json", cwd=root, env_extra=url)
    text = cli("dry-run", "--all", cwd=root, env_extra=url)
    one = cli("dry-run", "--policy", "guest_favorites", "--json", cwd=root, env_extra=url)
    error_line = misspelled_error("src/my_platform/defs")

    assert every.returncode == 2, every.stderr
    document = json.loads(every.stdout)
    reports = {r["policy"]: r for r in document["policies"]}
    assert reports["guest_carts"] == {"policy": "guest_carts", "error": error_line}
    assert reports["guest_favorites"]["now"]["prunable"] == 4
    assert "error" not in reports["guest_favorites"] and document["deleted"] == 0
    assert f"error: {error_line} (not loaded;" in every.stderr
    assert "Traceback" not in every.stderr

    assert text.returncode == 2
    assert f"policy     guest_carts (not loaded)\nerror      {error_line}\n" in text.stdout
    assert "prunable   4 rows" in text.stdout

    assert one.returncode == 0, one.stderr
    [report] = json.loads(one.stdout)["policies"]
    assert (report["policy"], report["now"]["prunable"]) == ("guest_favorites", 4)
    # The keys README's dry-run paragraph lists (no hold table: no "held").
    assert set(report) == {"policy", "database", "database_variable", "table", "guard",
                           "age_column", "retention_days", "now", "next_run"}
    assert set(report["now"]) == {"at", "partition", "cutoff", "prunable", "oldest"}
    assert set(report["next_run"]) == {"at", "cron", "partition", "cutoff", "prunable"}


INSTANCE_AS_DAGSTER_DEV_LOADS_IT = """
import os, tempfile
import dagster as dg
from dagster._core.instance.ref import InstanceRef
with tempfile.TemporaryDirectory(dir=os.getcwd()) as home:  # as dagster dev (and dg dev) do
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(home, config_dir=os.getcwd())) as i:
        print("runs", len(i.get_runs()), "storage", type(i.run_storage).__name__)
"""


def test_dagster_dev_without_a_storage_url_uses_the_embedded_server_and_others_refuse(
        checkout):
    """dg dev loads dagster.yaml before any project code: without DAGSTER_POSTGRES_URL its
    instance starts the checkout's embedded server (seeding the dev table) and stops it on
    exit; a deployment's process without it refuses, naming it in one line."""
    from favorites_maintenance.local.processes import alive, read_pid_file

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    dev = subprocess.run([sys.executable, "-c", INSTANCE_AS_DAGSTER_DEV_LOADS_IT], cwd=checkout,
                         env={**env, "DAGSTER_IS_DEV_CLI": "1"}, capture_output=True, text=True,
                         timeout=300, check=False)
    assert dev.returncode == 0, dev.stderr[-3000:]
    pgdata = checkout / ".favorites-maintenance" / "pgdata"
    assert (f"DAGSTER_POSTGRES_URL is not set: Dagster's storage and the favorites database are "
            f"the embedded PostgreSQL server of this checkout ({pgdata})") in dev.stdout
    assert "seeded favorites.favorites" in dev.stdout
    assert "runs 0 storage PostgresRunStorage" in dev.stdout
    assert not (pgdata / "postmaster.pid").exists() or not alive(
        read_pid_file(pgdata / "postmaster.pid"))

    deployed = subprocess.run([sys.executable, "-c", INSTANCE_AS_DAGSTER_DEV_LOADS_IT],
                              cwd=checkout, env=env, capture_output=True, text=True, timeout=300,
                              check=False)
    assert deployed.returncode != 0
    assert ("DAGSTER_POSTGRES_URL: is not set: Dagster's storage needs the URL of its PostgreSQL "
            "database") in deployed.stderr


def test_demo_of_another_policy_shows_its_protected_rows_before_and_after(checkout):
    """demo --policy on a table of its own (created in the embedded database beforehand, as the
    README says), declared in a project's code location named with ``-m``: the rows its guard
    protects are counted before and after the run."""
    import sqlalchemy as sa

    from favorites_maintenance.local.embedded import (
        FAVORITES_DATABASE,
        EmbeddedPostgres,
    )
    from favorites_maintenance_tests.helpers.policy_files import policy_project

    carts = ("type: favorites_maintenance.RetentionPolicy\nattributes:\n  name: guest_carts\n"
             "  table: carts.guest_carts\n  key_column: cart_uuid\n  age_column: touched_at\n"
             "  null_columns: [customer_ref]\n  retention_days: 30\n")
    project = policy_project(checkout / "project", {"guest_carts": carts},
                             module="carts_platform")
    server = EmbeddedPostgres(checkout / ".favorites-maintenance" / "pgdata").start()
    try:
        engine = sa.create_engine(server.ensure_database(FAVORITES_DATABASE))
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE SCHEMA carts; CREATE TABLE carts.guest_carts (cart_uuid uuid PRIMARY KEY "
                "DEFAULT gen_random_uuid(), customer_ref text, touched_at timestamptz NOT NULL);"
                "INSERT INTO carts.guest_carts (customer_ref, touched_at) SELECT CASE WHEN i <= 7 "
                "THEN 'cust-' || i END, now() - interval '40 days' FROM generate_series(1, 20) i")
        engine.dispose()
    finally:
        server.stop()
    proc = cli("demo", "--policy", "guest_carts", "-m", "carts_platform.definitions",
               cwd=checkout, env_extra={"PYTHONPATH": str(project / "src")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "carts.guest_carts: 13 rows with customer_ref IS NULL, 7 protected by the guard" \
        in proc.stdout
    assert re.search(r"rows of the guard\s+13 -> 0  \(customer_ref IS NULL\)", proc.stdout)
    assert re.search(r"protected rows\s+7 -> 7  \(NOT \(customer_ref IS NULL\)\)  \(unchanged\)",
                     proc.stdout), proc.stdout
    # A name the project lacks: its own policies named with its folder, this package's second
    # database's apart.
    wrong = cli("demo", "--policy", "guest_cart", "-m", "carts_platform.definitions",
                cwd=checkout, env_extra={"PYTHONPATH": str(project / "src")})
    assert wrong.returncode != 0
    assert ("--policy 'guest_cart': no such policy; the policies are guest_carts, "
            "guest_favorites (") in wrong.stderr
    assert ("/<policy>/defs.yaml), and eu_guest_favorites (the second embedded database of "
            "this package)") in wrong.stderr, wrong.stderr


SHARED_LISTS = """\
type: favorites_maintenance.RetentionPolicy
attributes:
  name: shared_lists
  table: lists.shared_lists
  key_column: list_id
  age_column: touched_at
  null_columns: [owner_id, team_id]
  retention_days: 365
  drop_expired_partitions: true
"""


SHOP_CARTS = """\
type: favorites_maintenance.RetentionPolicy
attributes:
  name: shop_carts
  table: shop.carts
  key_column: cart_id
  age_column: touched_at
  null_columns: [customer_ref]
  hold_table: shop.cart_holds
  hold_column: session_ref
  archive_table: shop.carts_archive
"""


def test_grants_prints_the_roles_sql_for_the_policys_own_table_for_psql(tmp_path, engine):
    """grants renders the role for the policy's table and columns (not the guest-favorites
    table): its output, run as the owner, creates the role with SELECT on the key, guard, age
    and hold columns, the hold table and the archive (the table's columns read from the
    policy's database) and the row-level security policies, and nothing on favorites."""
    import sqlalchemy as sa

    from favorites_maintenance_tests.helpers.policy_files import policy_project

    role = f"{engine.url.database}_carts_cleanup"
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE SCHEMA shop; CREATE TABLE shop.carts (cart_id bigint PRIMARY KEY, "
            "customer_ref text, session_ref text, address text, touched_at timestamptz NOT NULL)")
    root = policy_project(tmp_path, {"shop_carts": SHOP_CARTS})
    env = {"PYTHONPATH": str(root / "src"),
           "FAVORITES_DATABASE_URL": engine.url.render_as_string(hide_password=False)}
    proc = cli("grants", "--policy", "shop_carts", "--role", role, "--row-level-security",
               cwd=root, env_extra=env)
    assert proc.returncode == 0, proc.stderr
    assert "favorites.favorites" not in proc.stdout and '"favorites"' not in proc.stdout
    try:
        with engine.begin() as conn:
            conn.connection.cursor().execute(proc.stdout)
        with engine.connect() as conn:
            granted = set(conn.execute(sa.text(
                "SELECT privilege_type, table_name || '.' || column_name "
                "FROM information_schema.column_privileges WHERE grantee = :r UNION "
                "SELECT privilege_type, table_name FROM information_schema.table_privileges "
                "WHERE grantee = :r"), {"r": role}))
            policies = conn.execute(sa.text(
                "SELECT policyname, cmd, qual FROM pg_policies WHERE tablename = 'carts' "
                "ORDER BY 1")).all()
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP OWNED BY "{role}"; DROP ROLE IF EXISTS "{role}"')
    on_carts = {(p, c) for p, c in granted if c.startswith("carts.") or c == "carts"}
    # The archive's grants add SELECT on every column and INSERT (for a restore).
    assert on_carts == {(p, f"carts.{c}") for p in ("SELECT", "INSERT") for c in (
        "cart_id", "customer_ref", "session_ref", "address", "touched_at")} | {
        ("UPDATE", "carts.touched_at"), ("DELETE", "carts"), ("SELECT", "carts"),
        ("INSERT", "carts")}
    assert {("SELECT", "cart_holds.held_value"), ("SELECT", "carts_archive"),
            ("DELETE", "carts_archive")} <= granted
    assert [(p, c) for p, c, _ in policies] == [
        ("carts_cleanup_delete", "DELETE"), ("carts_cleanup_lock", "UPDATE"),
        ("carts_cleanup_select", "SELECT")]
    assert all(q == "(customer_ref IS NULL)" for _, _, q in policies)


def test_commands_on_a_policys_database_fail_naming_its_variable_when_it_is_unset(tmp_path):
    """grants (for the archive's columns), hold list and dry-run read the policy's own
    database: with its variable unset each exits 2 naming the variable, and dry-run --all still
    writes its document, the policy's error in it."""
    import json

    from favorites_maintenance_tests.helpers.policy_files import policy_project

    root = policy_project(tmp_path, {"shop_carts": SHOP_CARTS})
    env = {"PYTHONPATH": str(root / "src")}
    unset = "FAVORITES_DATABASE_URL: is not set"
    grants = cli("grants", "--policy", "shop_carts", "--role", "carts_cleanup", cwd=root,
                 env_extra=env)
    held = cli("hold", "list", "--policy", "shop_carts", cwd=root, env_extra=env)
    one = cli("dry-run", "--policy", "shop_carts", cwd=root, env_extra=env)
    every = cli("dry-run", "--all", "--json", cwd=root, env_extra=env)
    assert grants.returncode == 2 and unset in grants.stderr
    assert "(the archive's DDL needs the columns of shop.carts)" in grants.stderr
    assert grants.stdout == ""
    assert held.returncode == 2 and unset in held.stderr
    assert one.returncode == 2 and unset in one.stderr
    assert every.returncode == 2
    [carts] = [p for p in json.loads(every.stdout)["policies"] if p["policy"] == "shop_carts"]
    assert unset in carts["error"]


def test_partition_functions_prints_the_sql_of_the_policys_table_for_psql(tmp_path, engine):
    """The command's output, run as the owner, installs the two functions named after the
    policy's table, SECURITY DEFINER, executable by --role only; a policy without
    drop_expired_partitions and an unknown policy are refused naming them."""
    import sqlalchemy as sa

    from favorites_maintenance_tests.helpers.policy_files import policy_project

    role = f"{engine.url.database}_lists_cleanup"
    root = policy_project(tmp_path, {"shared_lists": SHARED_LISTS})
    src = {"PYTHONPATH": str(root / "src")}
    proc = cli("partition-functions", "--policy", "shared_lists", "--role", role, cwd=root,
               env_extra=src)
    guest = cli("partition-functions", "--policy", "guest_favorites", "--role", role, cwd=root,
                env_extra=src)
    unknown = cli("partition-functions", "--policy", "shared_list", "--role", role, cwd=root,
                  env_extra=src)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert 'CREATE OR REPLACE FUNCTION "lists"."shared_lists_detach_partition"(' in proc.stdout
    assert "'\"owner_id\" IS NOT NULL OR \"team_id\" IS NOT NULL'" in proc.stdout
    assert guest.returncode == 2
    assert guest.stderr == ("error: --policy guest_favorites: drop_expired_partitions is not "
                            "true in its defs.yaml, so its job detaches no partition and calls "
                            "no function; set drop_expired_partitions: true first\n")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("error: --policy 'shared_list': no such policy")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE SCHEMA lists"))
        conn.execute(sa.text(
            "CREATE TABLE lists.shared_lists (list_id bigint, owner_id bigint, team_id bigint, "
            "touched_at timestamptz NOT NULL) PARTITION BY RANGE (touched_at)"))
        conn.exec_driver_sql(f'CREATE ROLE "{role}"')
    try:
        with engine.begin() as conn:
            conn.connection.cursor().execute(proc.stdout)
        with engine.connect() as conn:
            installed = conn.execute(sa.text(
                "SELECT p.proname, p.prosecdef, has_function_privilege(:r, p.oid, 'EXECUTE'), "
                "has_function_privilege('public', p.oid, 'EXECUTE') FROM pg_proc p "
                "WHERE p.pronamespace = 'lists'::regnamespace ORDER BY 1"), {"r": role}).all()
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
            conn.exec_driver_sql(f'DROP ROLE "{role}"')
    assert installed == [("shared_lists_detach_partition", True, True, False),
                         ("shared_lists_drop_detached", True, True, False)]
