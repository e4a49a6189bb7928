"""Retention policies as data: a second policy, declared in YAML alone, on a table of another
shape (a uuid key, a text guard, other column names), runs beside guest favorites through
Dagster, with its own asset, job, schedule, sensors, checks and pool.

The policies are loaded the way the code location loads them (a defs folder of
``favorites_maintenance.RetentionPolicy`` components), from a sandbox folder holding the real
``guest_favorites/defs.yaml`` and a ``guest_carts/defs.yaml`` written here.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from dagster.components.testing import create_defs_folder_sandbox

import favorites_maintenance.defs
from favorites_maintenance.components.policy_tree import PolicyLoadError, load_policies
from favorites_maintenance.components.policy_tree import code_location
from favorites_maintenance.pipeline.failure_sensor import FAILURE_SENSOR
from favorites_maintenance.pipeline.partitions import daily_partitions
from favorites_maintenance.pipeline.resources import AlertSink
from favorites_maintenance.pipeline.stale_sensor import STALE_SENSOR
from favorites_maintenance.pipeline.tick_failure_sensor import TICK_FAILURE_SENSOR
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.clock import PARTITION
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    materialization,
    purge_retries,
    run_report,
)
from favorites_maintenance_tests.helpers.resource_keys import ALERTS_KEY
from favorites_maintenance_tests.helpers.sensors import react_to_failures

UTC = dt.timezone.utc
#: End of PARTITION: the anchor of both policies' cutoffs.
ANCHOR = dt.datetime(2026, 6, 16, tzinfo=UTC)
DEFS = Path(favorites_maintenance.defs.__file__).parent
GUEST_FAVORITES_YAML = DEFS / "guest_favorites" / "defs.yaml"
#: The resources every policy shares (``database``, ``alerts``, ``metrics``).

CARTS = {
    "name": "guest_carts",
    "table": "carts.guest_carts",
    "key_column": "cart_uuid",
    "age_column": "touched_at",
    "null_columns": ["customer_ref"],
    "retention_days": 30,
    "batch_size": 100,
    # Fixed batches, so the batch count is known.
    "target_batch_duration": "PT0S",
    "cron": "15 4 * * *",
    "stale_after": "PT24H",
    "partitions_start": "2026-01-01",
}


def write_policy(defs_folder: Path, attributes: dict, folder_name: str = "guest_carts") -> None:
    folder = defs_folder / folder_name
    folder.mkdir()
    (folder / "defs.yaml").write_text(yaml.safe_dump(
        {"type": "favorites_maintenance.RetentionPolicy", "attributes": attributes}))


@pytest.fixture
def sandbox():
    """A defs folder with the real guest_favorites policy; tests add more."""
    with create_defs_folder_sandbox() as sandbox:
        (sandbox.defs_folder_path / "guest_favorites").mkdir()
        shutil.copy(GUEST_FAVORITES_YAML, sandbox.defs_folder_path / "guest_favorites")
        yield sandbox


@pytest.fixture
def carts(engine):
    """``carts.guest_carts``: 250 guest carts idle 40 days before the partition's end (30-day
    retention: prunable), 50 customer carts as old, 30 guest carts idle 5 days."""
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE SCHEMA carts;
            CREATE TABLE carts.guest_carts (
                cart_uuid uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                customer_ref text NULL,
                touched_at timestamptz NOT NULL,
                items int NOT NULL DEFAULT 1);
            CREATE INDEX ON carts.guest_carts (touched_at, cart_uuid)
                WHERE customer_ref IS NULL;""")
        insert = sa.text("INSERT INTO carts.guest_carts (customer_ref, touched_at) "
                         "SELECT :ref, :at FROM generate_series(1, :n)")
        conn.execute(insert, {"ref": None, "at": ANCHOR - dt.timedelta(days=40), "n": 250})
        conn.execute(insert, {"ref": "cust-7", "at": ANCHOR - dt.timedelta(days=40), "n": 50})
        conn.execute(insert, {"ref": None, "at": ANCHOR - dt.timedelta(days=5), "n": 30})
    yield
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA carts CASCADE")


def carts_left(engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT coalesce(customer_ref, 'guest') || ':' || "
            "(CASE WHEN touched_at < :cutoff THEN 'old' ELSE 'recent' END), count(*) "
            "FROM carts.guest_carts GROUP BY 1"),
            {"cutoff": ANCHOR - dt.timedelta(days=30)}).all()
    return dict(rows)


def test_a_second_policy_from_yaml_alone_gets_the_whole_surface_under_its_own_names(
        sandbox, carts, rows, engine, db_url, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)  # the guest-favorites policy at its defaults
    write_policy(sandbox.defs_folder_path, CARTS)
    old_guests = set(rows.add_many(40, updated_at=ANCHOR - dt.timedelta(days=400)))
    accounts = set(rows.add_many(10, updated_at=ANCHOR - dt.timedelta(days=400), user_id=3))

    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)

    carts_key = dg.AssetKey(["carts", "guest_carts_cleanup"])
    guest_key = dg.AssetKey(["favorites", "guest_favorites_cleanup"])
    graph = defs.resolve_asset_graph()
    assert graph.get_all_asset_keys() == {carts_key, guest_key}
    assert {c.name for c in graph.asset_check_keys if c.asset_key == carts_key} == {
        "no_row_older_than_retention_plus_one_day", "deleted_total_spike", "no_rows_skipped"}
    assert defs.resolve_job_def("guest_carts_cleanup_job")
    assert defs.resolve_schedule_def("guest_carts_cleanup_schedule").cron_schedule == "15 4 * * *"
    assert defs.resolve_schedule_def("guest_favorites_cleanup_schedule").cron_schedule == \
        "0 3 * * *"
    # One sensor of each kind serves both policies.
    assert {s.name for s in defs.get_repository_def().sensor_defs} == {
        STALE_SENSOR, FAILURE_SENSOR, TICK_FAILURE_SENSOR, "cleanup_dead_run_sensor"}
    carts_job = defs.resolve_job_def("guest_carts_cleanup_job")
    purge_op = carts_job.graph.node_named("carts__guest_carts_cleanup").definition \
        .node_named("purge").definition
    assert purge_op.pool == "guest_carts_cleanup"
    # The global asset job holds both graphs: their ops may not share a definition name.
    assert defs.resolve_implicit_global_asset_job_def()

    with dg.instance_for_test() as instance:
        result = carts_job.execute_in_process(partition_key=PARTITION, instance=instance)
        assert result.success
        run = run_report(result, asset_key=carts_key)
        assert (run.deleted_total, run.batches, run.backlog_remaining) == (250, 3, 0)
        assert (run.retention_days, run.batch_size) == (30, 100)
        assert run.cutoff == (ANCHOR - dt.timedelta(days=30)).isoformat()
        checks = result.get_asset_check_evaluations()
        assert {c.asset_key for c in checks} == {carts_key}
        assert len(checks) == 3 and all(c.passed for c in checks), checks
        # Only the guest carts past retention went; the customers' carts and the favorites
        # table were not touched.
        assert carts_left(engine) == {"cust-7:old": 50, "guest:recent": 30}
        assert rows.ids() == old_guests | accounts

        guest = defs.resolve_job_def("guest_favorites_cleanup_job").execute_in_process(
            partition_key=PARTITION, instance=instance)
        assert guest.success and run_report(guest).deleted_total == 40
        assert rows.ids() == accounts
        assert carts_left(engine) == {"cust-7:old": 50, "guest:recent": 30}

        # The staleness sensor watches each policy's asset on its own: after a run of today's
        # partition of carts (the 2026 day above is a backfill, which does not count), the
        # carts clock starts at that success; the favorites one has seen none.
        today = daily_partitions.get_last_partition_key()
        assert carts_job.execute_in_process(partition_key=today, instance=instance).success
        sent: list[str] = []

        class Sink(AlertSink):
            def send(self, text, *, log=None, level=40):
                sent.append(text)
                return True

        with dg.build_sensor_context(instance=instance, resources={ALERTS_KEY: Sink()},
                                     definitions=defs) as ctx:
            said = defs.resolve_sensor_def(STALE_SENSOR)(ctx).skip_message
            state = json.loads(ctx.cursor)["policies"]
        assert sent == []
        assert said == "fresh: guest_carts, guest_favorites"
        assert state["guest_carts"]["lastSuccess"] is not None
        assert state["guest_favorites"]["lastSuccess"] is None

        # A failed carts run alerts once, naming carts.
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE carts.guest_carts RENAME COLUMN touched_at TO t")
        failed = carts_job.execute_in_process(partition_key=PARTITION, instance=instance,
                                              raise_on_error=False)
        assert not failed.success
        assert "carts.guest_carts has no column 'touched_at'" in failure_text(failed)
        sent.clear()
        assert react_to_failures(defs, FAILURE_SENSOR, instance, Sink()) == [failed.run_id]
        [alert] = sent
        assert alert.startswith("guest_carts cleanup failed: asset carts/guest_carts_cleanup, "
                                "partition 2026-06-15, "), alert
        assert f"run {failed.run_id}: TableShapeError: " in alert


def test_a_guarded_policy_gets_the_generic_check_name_and_keys_after_its_age_column(
        sandbox, carts, engine, db_url, monkeypatch):
    """The names of the guest-favorites policy (``guest row``, ``updated_at``) are its own: a
    guarded policy that names no row noun gets ``row``, and keys after its age column,
    ``touched_at``."""
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    write_policy(sandbox.defs_folder_path, CARTS)
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    carts_key = dg.AssetKey(["carts", "guest_carts_cleanup"])
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("guest_carts_cleanup_job").execute_in_process(
            partition_key=PARTITION, instance=instance,
            run_config=purge_retries(0, asset_key=carts_key), raise_on_error=False)
    assert result.success
    # The run's own record: the oldest left, under the age column's name.
    metadata = materialization(result, asset_key=carts_key)
    assert metadata["backlogOldestTouchedAt"] == "none"
    assert not [k for k in metadata if "UpdatedAt" in k or "Guest" in k], metadata
    [overdue] = [e for e in result.get_asset_check_evaluations()
                 if e.check_name == "no_row_older_than_retention_plus_one_day"]
    assert set(overdue.metadata) == {"overdueRows", "oldestOverdueTouchedAt", "cutoff",
                                     "limit"}
    assert overdue.passed and overdue.metadata["overdueRows"].value == 0


def test_a_policy_s_row_noun_names_its_check_and_keys(sandbox, carts, engine, db_url,
                                                       monkeypatch):
    """``row_noun: guest cart``: the check, its count and the messages say guest carts."""
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    write_policy(sandbox.defs_folder_path, {**CARTS, "row_noun": "guest cart"})
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    carts_key = dg.AssetKey(["carts", "guest_carts_cleanup"])
    assert {c.name for c in defs.resolve_asset_graph().asset_check_keys
            if c.asset_key == carts_key} == {
        "no_guest_cart_older_than_retention_plus_one_day", "deleted_total_spike",
        "no_rows_skipped"}
    # A session holds every guest cart: the run skips them all, and they stay overdue.
    locker = engine.connect()
    locker.begin()
    locker.execute(sa.text("SELECT 1 FROM carts.guest_carts WHERE customer_ref IS NULL "
                           "FOR UPDATE"))
    try:
        with dg.instance_for_test() as instance:
            result = defs.resolve_job_def("guest_carts_cleanup_job").execute_in_process(
                partition_key=PARTITION, instance=instance,
                run_config=purge_retries(0, asset_key=carts_key))
            logs = [e.user_message or "" for e in instance.all_logs(result.run_id)]
    finally:
        locker.close()
    [overdue] = [e for e in result.get_asset_check_evaluations()
                 if e.check_name == "no_guest_cart_older_than_retention_plus_one_day"]
    assert overdue.metadata["overdueGuestCarts"].value == 250
    assert overdue.description.startswith("250 guest carts are older than this run's cutoff")
    cutoff = (ANCHOR - dt.timedelta(days=30)).isoformat()
    assert any(f"nothing to delete: no guest cart older than {cutoff}" in t for t in logs)


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


@pytest.mark.parametrize("change, field, message", [
    # An empty guard is a rule of its own (test_rules_of_every_shape.py); a null one is no
    # guard written on purpose.
    ({"null_columns": None}, "null_columns", "policy 'guest_carts': null_columns is missing"),
    ({"table": 'carts."guest_carts"; DROP TABLE x'}, "table",
     "is not a lower-case SQL identifier"),
    ({"key_column": "Cart_UUID"}, "key_column",
     "key_column 'Cart_UUID' is not a lower-case SQL identifier"),
    ({"table": "guest_carts"}, "table", "table 'guest_carts' must be written schema.table"),
    ({"table": "db.carts.guest_carts"}, "table",
     "table 'db.carts.guest_carts' must be written schema.table"),
    ({"retention_days": 0}, "retention_days",
     "policy guest_carts, retention_days: '0' must be greater than 0"),
    ({"max_run_duration": "ten minutes"}, "max_run_duration",
     "policy guest_carts, max_run_duration: 'ten minutes' is not a duration"),
    ({"name": "Guest-Carts"}, "name", "policy 'Guest-Carts': name must be snake_case"),
    # Dagster's schema, through the component: the field, and the one it may have meant.
    ({"retention_dayz": 30}, "retention_dayz",
     ("policy guest_carts, retention_dayz: not a field of a retention policy (did you mean "
      "retention_days?)")),
    ({"batch_size": [100]}, "batch_size",
     "policy guest_carts, batch_size: [100] is not accepted (input should be a valid integer)"),
    ({"row_noun": "Guest-Cart"}, "row_noun",
     "policy guest_carts, row_noun: 'Guest-Cart' is not a row noun: lower-case words"),
    ({"name": "guest_favorites"}, None,
     "policy names must be unique, got ['guest_favorites', 'guest_favorites']"),
])
def test_a_malformed_policy_stops_the_load_in_one_line_naming_the_file_line_policy_and_field(
        sandbox, change, field, message):
    write_policy(sandbox.defs_folder_path, {**CARTS, **change})
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError) as refused:
        load_policies(tree)
    text = str(refused.value)
    assert message in text and "\n" not in text
    if field is not None:
        path = sandbox.defs_folder_path / "guest_carts" / "defs.yaml"
        [line] = [n for n, written in enumerate(path.read_text().splitlines(), 1)
                  if written.lstrip().startswith(f"{field}:")]
        where = path.relative_to(sandbox.project_root)
        assert text.startswith(f"{where}:{line}: "), text


def test_a_policy_file_missing_its_rule_says_which_fields_in_one_line(sandbox):
    folder = sandbox.defs_folder_path / "guest_orders"
    folder.mkdir()
    (folder / "defs.yaml").write_text("type: favorites_maintenance.RetentionPolicy\n"
                                      "attributes: {}\n")
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError) as refused:
        load_policies(tree)
    assert str(refused.value) == (
        f"{(folder / 'defs.yaml').relative_to(sandbox.project_root)}:2: policy guest_orders, "
        "required fields missing: name, table, key_column, age_column")


@pytest.mark.parametrize("written, days", [
    # As written, by the rules a variable's text is read with, not by YAML 1.1's (which reads
    # 030 as 24, 1:30 as 90, yes as 1 and 0x1e as 30).
    ("030", 30), ("30", 30), ("yes", None), ("1:30", None), ("0x1e", None), ("30.0", None),
])
def test_a_setting_means_what_its_yaml_text_says(sandbox, written, days):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    text = yaml.safe_dump({"type": "favorites_maintenance.RetentionPolicy",
                           "attributes": {**CARTS, "retention_days": 1}})
    (folder / "defs.yaml").write_text(text.replace("retention_days: 1",
                                                   f"retention_days: {written}"))
    with sandbox.build_component_tree() as tree:
        if days is None:
            with pytest.raises(PolicyLoadError, match=f"policy guest_carts, retention_days: "
                                                      f"'{written}' is not a whole number"):
                load_policies(tree)
        else:
            carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
            assert carts.settings.retention_days == days


def carts_yaml(attributes_text: str) -> str:
    """A guest-carts policy file whose ``attributes`` are written as ``attributes_text``."""
    return f"type: favorites_maintenance.RetentionPolicy\nattributes:{attributes_text}\n"


_RULE = ("\n  name: guest_carts\n  table: carts.guest_carts\n  key_column: cart_uuid"
         "\n  age_column: touched_at\n  null_columns: [customer_ref]")
_FLOW = ("{name: guest_carts, table: carts.guest_carts, key_column: cart_uuid, "
         "age_column: touched_at, null_columns: [customer_ref]")


@pytest.mark.parametrize("shape, attributes, days", [
    # Every way YAML can write a value is read as written, never by YAML 1.1's number rules.
    ("flow style", f" {_FLOW}, retention_days: 030}}", 30),
    ("value on the next line", _RULE + "\n  retention_days:\n    030", 30),
    ("an alias", _RULE + "\n  batch_size: &days 030\n  retention_days: *days", 30),
    ("a quoted key", _RULE + '\n  "retention_days": 030', 30),
    ("a comment", _RULE + "\n  retention_days: 030  # thirty", 30),
    ("a plain value folded over two lines", _RULE + "\n  retention_days: 3\n    65", None),
    ("flow style, hexadecimal", f" {_FLOW}, retention_days: 0x1e}}", None),
])
def test_a_setting_is_read_as_written_whatever_the_yaml_shape(sandbox, shape, attributes, days):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(attributes))
    with sandbox.build_component_tree() as tree:
        if days is None:
            with pytest.raises(PolicyLoadError, match="policy guest_carts, retention_days: "
                                                      "'.*' is not a whole number"):
                load_policies(tree)
        else:
            carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
            assert carts.settings.retention_days == days, shape


def test_a_setting_written_twice_is_refused_not_the_last_one_taken(sandbox):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(
        _RULE + "\n  retention_days: 30\n  retention_days: 3"))
    with sandbox.build_component_tree() as tree:
        with pytest.raises(PolicyLoadError, match="policy guest_carts, retention_days: is "
                                                  "written 2 times in the policy's defs.yaml"):
            load_policies(tree)


def test_an_unquoted_hh_mm_ss_duration_is_the_duration_it_says(sandbox):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(
        _RULE + "\n  stale_after: 48:00:00\n  max_run_duration: 00:10:00"))
    with sandbox.build_component_tree() as tree:
        carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
    assert carts.settings.stale_after == dt.timedelta(hours=48)
    assert carts.settings.max_run_duration == dt.timedelta(minutes=10)


@pytest.mark.parametrize("text, line, message", [
    (carts_yaml(_RULE + "\n  retention_days:\t030"), 8,
     "policy guest_carts: not valid YAML: found character '\\t' that cannot start any token"),
    (carts_yaml(_RULE + "\n  retention_days: *nowhere"), 8,
     "policy guest_carts: not valid YAML: found undefined alias 'nowhere'"),
    ("type: favorites_maintenance.RetentionPolicy\nowner: me\nattributes:" + _RULE, 2,
     "policy guest_carts, owner: not a key of a component file"),
    ("type: favorites_maintenance.RetentionPolicies\nattributes:" + _RULE, 1,
     ("policy guest_carts, type: Module `favorites_maintenance` has no attribute "
      "`RetentionPolicies`. (a retention policy is type: favorites_maintenance.RetentionPolicy)")),
])
def test_a_file_that_is_not_a_policy_is_one_load_error_naming_the_file(sandbox, text, line,
                                                                        message):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(text)
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError) as refused:
        load_policies(tree)
    where = (folder / "defs.yaml").relative_to(sandbox.project_root)
    assert str(refused.value) == f"{where}:{line}: {message}"


def test_a_short_stale_after_still_loads_with_the_shortest_freshness_dagster_takes(sandbox):
    write_policy(sandbox.defs_folder_path, {**CARTS, "stale_after": "PT59S"})
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    spec = defs.resolve_assets_def(dg.AssetKey(["carts", "guest_carts_cleanup"])).specs
    [freshness] = [s.freshness_policy for s in spec]
    assert freshness.fail_window.to_timedelta() == dt.timedelta(minutes=1)
    assert freshness.warn_window is None


def test_a_policy_setting_read_from_the_environment_is_reported_under_its_variable(
        sandbox, monkeypatch):
    write_policy(sandbox.defs_folder_path,
                 {**CARTS, "retention_days": "{{ env.CARTS_RETENTION_DAYS }}"})
    monkeypatch.setenv("CARTS_RETENTION_DAYS", "0")
    with sandbox.build_component_tree() as tree:
        with pytest.raises(PolicyLoadError, match="CARTS_RETENTION_DAYS: '0' must be greater"):
            load_policies(tree)
    monkeypatch.delenv("CARTS_RETENTION_DAYS")
    with sandbox.build_component_tree() as tree:
        carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
    assert carts.settings.retention_days == 365  # unset: the default


def test_an_age_column_that_is_not_timestamptz_fails_the_first_run_naming_it(
        sandbox, carts, engine, db_url, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)  # the guest-favorites policy at its defaults
    write_policy(sandbox.defs_folder_path, {**CARTS, "age_column": "items"})
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("guest_carts_cleanup_job").execute_in_process(
            partition_key=PARTITION, instance=instance, raise_on_error=False)
    assert not result.success
    assert "carts.guest_carts.items is INTEGER" in failure_text(result)
    assert carts_left(engine)["guest:old"] == 250


def test_each_policy_s_partitions_start_on_its_own_day_and_a_recent_default(sandbox,
                                                                            monkeypatch):
    from favorites_maintenance.config.policy_settings import default_partitions_start

    monkeypatch.delenv("FAVORITES_GUEST_RETENTION_PARTITIONS_START", raising=False)
    write_policy(sandbox.defs_folder_path, {**CARTS, "partitions_start": "2026-06-01"})
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
    graph = defs.resolve_asset_graph()
    firsts = {key.path[1]: graph.get(key).partitions_def.get_first_partition_key()
              for key in graph.get_all_asset_keys()}
    assert firsts == {"guest_carts_cleanup": "2026-06-01",
                      "guest_favorites_cleanup": default_partitions_start().isoformat()}
    for check in graph.asset_check_keys:
        assert graph.get(check).partitions_def == graph.get(
            check.asset_key).partitions_def
    # A date the calendar does not have is refused naming the field.
    (sandbox.defs_folder_path / "guest_carts" / "defs.yaml").write_text(yaml.safe_dump(
        {"type": "favorites_maintenance.RetentionPolicy",
         "attributes": {**CARTS, "partitions_start": "2026-02-30"}}))
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError) as refused:
        load_policies(tree)
    assert "policy guest_carts, partitions_start: '2026-02-30' is not a date of the calendar" \
        in str(refused.value)


@pytest.mark.parametrize("written, drop, kept_for", [
    ("", False, dt.timedelta(days=7)),
    ("\n  drop_expired_partitions: true", True, dt.timedelta(days=7)),
    ("\n  drop_expired_partitions: true\n  detached_retention: P30D", True,
     dt.timedelta(days=30)),
    # null is a value of its own here: kept for good, never dropped.
    ("\n  drop_expired_partitions: true\n  detached_retention: null", True, None),
    ("\n  drop_expired_partitions: true\n  detached_retention: ~", True, None),
    ("\n  drop_expired_partitions: true\n  detached_retention: PT0S", True, dt.timedelta(0)),
])
def test_drop_expired_partitions_and_detached_retention_load_without_the_database(
        sandbox, written, drop, kept_for):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(_RULE + written))
    with sandbox.build_component_tree() as tree:
        carts = {p.name: p for p in load_policies(tree)}["guest_carts"]
    assert carts.settings.drop_expired_partitions is drop
    assert carts.settings.detached_retention == kept_for


@pytest.mark.parametrize("written, said", [
    ("\n  drop_expired_partitions: yes", "drop_expired_partitions: 'yes' is not true or false"),
    ("\n  detached_retention: -P1D", "detached_retention: '-P1D' must not be negative"),
    ("\n  drop_expired_partitions: true\n  detached_retention: -P1D",
     (r"detached_retention: '-P1D' must not be negative \(PT0S drops a detached table on the "
      r"next run, null keeps it for good\)")),
    ("\n  drop_expired_partitions: true\n  detached_retention: P3651D",
     "detached_retention: 'P3651D' must be at most P3650D"),
    ("\n  detached_retention: P30D",
     ("policy guest_carts, detached_retention is set, but policy guest_carts, "
      "drop_expired_partitions is not true")),
    ("\n  drop_expired_partitions: false\n  detached_retention: null",
     "detached_retention is set, but .*drop_expired_partitions is not true"),
    ("\n  drop_expired_partitions: true\n  archive_table: carts.archive",
     "archive_table and policy guest_carts, drop_expired_partitions cannot be set together"),
])
def test_a_bad_partition_setting_is_refused_at_load_naming_it(sandbox, written, said):
    folder = sandbox.defs_folder_path / "guest_carts"
    folder.mkdir()
    (folder / "defs.yaml").write_text(carts_yaml(_RULE + written))
    with sandbox.build_component_tree() as tree, pytest.raises(PolicyLoadError, match=said):
        load_policies(tree)
