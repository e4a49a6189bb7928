"""The component in a project of a team's own: found by ``dg``, scaffolded, and complete on its
own under the project's stock ``definitions.py``."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from favorites_maintenance.components.load_errors import quiet_previews
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.host_project import (
    HOST_DEFINITIONS,
    add_policy,
    host_project,
    run_dg,
)

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = "favorites_maintenance.RetentionPolicy"


def test_dg_lists_the_component_in_a_project_that_does_not_name_the_package(tmp_path):
    root = host_project(tmp_path)
    listed = run_dg(root, "list", "components", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    keys = {item["key"] for item in json.loads(listed.stdout)["items"]}
    assert COMPONENT in keys
    assert "dagster.DefsFolderComponent" in keys


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A host project with an asset, resources named ``database``, ``alerts`` and
    ``retention`` and an executor of its own, and two policies on one database; importable."""
    module = f"host_{tmp_path.name.replace('-', '_').lower()}"[:40]
    root = host_project(tmp_path, module=module)
    (root / "src" / module / "defs" / "platform.py").write_text(HOST_DEFINITIONS)
    add_policy(root, "guest_favorites_a", module)
    add_policy(root, "guest_favorites_b", module)
    monkeypatch.syspath_prepend(str(root / "src"))
    return root / "src" / module


def test_the_stock_definitions_of_a_host_load_its_policies_complete_beside_its_own(
        host, db_url, rows, monkeypatch):
    checked = run_dg(host.parents[1], "check", "defs")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    with quiet_previews():
        defs = dg.load_from_defs_folder(path_within_project=host)
    # The host's own resources and executor are left as they are.
    assert defs.resources["database"].name == "warehouse"
    assert defs.resources["alerts"].name == "pager"
    assert defs.resolve_implicit_global_asset_job_def().executor_def.name == "host_executor"
    # One sensor of each kind serves both policies, under the package's names, and the code
    # location's dead-run sensor comes with them.
    assert sorted(s.name for s in defs.get_repository_def().sensor_defs) == [
        "cleanup_dead_run_sensor", "favorites_maintenance_failure_sensor",
        "favorites_maintenance_stale_sensor", "favorites_maintenance_tick_failure_sensor"]
    # The package's resources are under its own keys, one database resource for both; none
    # per policy (Dagster binds each of the location's resources to each asset).
    keys = sorted(k for k in defs.resources if k.startswith("favorites_maintenance"))
    assert keys == ["favorites_maintenance_alerts", "favorites_maintenance_favorites_database_url",
                    "favorites_maintenance_metrics"]
    # Each policy's run limits come with its asset, so its job (and the launchpad) has them.
    policies = ("guest_favorites_a", "guest_favorites_b")
    for policy, other in zip(policies, reversed(policies)):
        job_keys = set(defs.resolve_job_def(f"{policy}_cleanup_job").resource_defs)
        assert f"favorites_maintenance_{policy}_run_limits" in job_keys
        assert f"favorites_maintenance_{other}_run_limits" not in job_keys
    now = dt.datetime.now(dt.timezone.utc)
    old = rows.add_many(3, updated_at=now - dt.timedelta(days=90))
    account = rows.add(updated_at=now - dt.timedelta(days=90), user_id=7)
    recent = rows.add(updated_at=now - dt.timedelta(days=2))
    yesterday = (now.date() - dt.timedelta(days=1)).isoformat()
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("guest_favorites_a_cleanup_job").execute_in_process(
            partition_key=yesterday, instance=instance)
        assert result.success
        # The policy's own job runs its steps in the run's process.
        assert result.dagster_run.tags.get("favorites_maintenance/database") == DATABASE_URL_VAR
        assert defs.resolve_job_def("guest_favorites_a_cleanup_job").executor_def.name \
            == "in_process"
    assert rows.ids() == {account, recent}
    assert not set(old) & rows.ids()
    # The host's asset still runs, on its own resource.
    with dg.instance_for_test() as instance:
        assert dg.materialize([defs.resolve_assets_def("daily_report")],
                              instance=instance).output_for_node("daily_report") == "warehouse"


#: Loads the instance of the working folder as ``dg dev`` does: before any project code.
_INSTANCE_AS_DG_DEV_LOADS_IT = """
import os, tempfile
import dagster as dg
with tempfile.TemporaryDirectory(dir=os.getcwd()) as home:
    with dg.DagsterInstance.from_config(os.getcwd()) as instance:
        print("loaded", type(instance.run_storage).__name__)
"""


def test_a_host_s_dg_dev_never_starts_the_embedded_server(tmp_path):
    """A host project that took the package's ``dagster.yaml`` and serves a workspace of its
    own: without ``DAGSTER_POSTGRES_URL`` its development server refuses, naming the variable,
    and no PostgreSQL server is started nor any file written for one."""
    root = host_project(tmp_path)
    shutil.copyfile(ROOT / "dagster.yaml", root / "dagster.yaml")
    (root / "workspace.yaml").write_text(
        "load_from:\n  - python_module:\n      module_name: my_platform.definitions\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    loaded = subprocess.run([sys.executable, "-c", _INSTANCE_AS_DG_DEV_LOADS_IT], cwd=root,
                            env={**env, "DAGSTER_IS_DEV_CLI": "1"}, capture_output=True,
                            text=True, timeout=300, check=False)
    assert loaded.returncode != 0
    assert "DAGSTER_POSTGRES_URL: is not set" in loaded.stderr
    assert "embedded PostgreSQL server" not in loaded.stdout
    assert not (root / ".favorites-maintenance").exists()


def _cli(*args: str, cwd: Path, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "favorites_maintenance", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_command_line_counts_a_host_s_policy_from_its_project_or_its_module(
        host, db_url, rows, tmp_path):
    now = dt.datetime.now(dt.timezone.utc)
    rows.add_many(4, updated_at=now - dt.timedelta(days=90))
    rows.add(updated_at=now - dt.timedelta(days=90), user_id=7)
    env = {DATABASE_URL_VAR: db_url.render_as_string(hide_password=False),
           "PYTHONPATH": str(host.parent)}
    module = f"{host.name}.definitions"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args, cwd in ((("dry-run", "--policy", "guest_favorites_b", "--json"), host.parents[1]),
                      (("dry-run", "-m", module, "--policy", "guest_favorites_b", "--json"),
                       elsewhere)):
        counted = _cli(*args, cwd=cwd, env_extra=env)
        assert counted.returncode == 0, counted.stderr[-2000:]
        [report] = json.loads(counted.stdout)["policies"]
        assert (report["policy"], report["now"]["prunable"]) == ("guest_favorites_b", 4)
    # The package's own policy is no host's.
    refused = _cli("dry-run", "--policy", "guest_favorites", cwd=host.parents[1], env_extra=env)
    assert refused.returncode != 0
    assert "no such policy; the policies are guest_favorites_a, guest_favorites_b" \
        in refused.stderr
    # Without --policy: a project's only policy, or the command asks which one.
    asked = _cli("dry-run", cwd=host.parents[1], env_extra=env)
    assert asked.returncode != 0
    assert ("--policy is required: the code location has 2 policies, guest_favorites_a, "
            "guest_favorites_b") in asked.stderr
    shutil.rmtree(host / "defs" / "guest_favorites_a")
    only = _cli("dry-run", "--json", cwd=host.parents[1], env_extra=env)
    assert only.returncode == 0, only.stderr[-2000:]
    assert [r["policy"] for r in json.loads(only.stdout)["policies"]] == ["guest_favorites_b"]
    assert rows.count() == 5


def test_the_hold_commands_work_on_a_host_s_policy_from_its_project_or_its_module(
        host, db_url, rows, tmp_path):
    policy = host / "defs" / "guest_favorites_b" / "defs.yaml"
    policy.write_text(policy.read_text() + "  hold_table: favorites.retention_holds\n")
    now = dt.datetime.now(dt.timezone.utc)
    held = rows.add(updated_at=now - dt.timedelta(days=90))
    env = {DATABASE_URL_VAR: db_url.render_as_string(hide_password=False),
           "PYTHONPATH": str(host.parent)}
    module = ("-m", f"{host.name}.definitions")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    policy_b = ("--policy", "guest_favorites_b")
    for args, cwd in ((("hold", "init", *policy_b), host.parents[1]),
                      (("hold", "init", *module, *policy_b), elsewhere)):
        made = _cli(*args, cwd=cwd, env_extra=env)
        assert made.returncode == 0, made.stderr[-2000:]
    placed = _cli("hold", "place", *module, *policy_b, "--key", str(held), "--reason", "case",
                  cwd=elsewhere, env_extra=env)
    assert placed.returncode == 0, placed.stderr[-2000:]
    listed = _cli("hold", "list", *module, *policy_b, "--json", cwd=elsewhere, env_extra=env)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [h["id"] for h in json.loads(listed.stdout)["holds"]] == [int(placed.stdout)]
    released = _cli("hold", "release", *policy_b, "--id", placed.stdout.strip(),
                    cwd=host.parents[1], env_extra=env)
    assert released.returncode == 0, released.stderr[-2000:]
    assert released.stdout == f"hold {int(placed.stdout)} released\n"


def test_a_host_s_location_runs_the_dead_run_sensor_once_for_its_two_policies(host):
    """The sensor that ends a run whose steps stopped beating comes with the component: the
    host's stock loader gets it from each policy, and the code location holds it once."""
    from favorites_maintenance.pipeline.heartbeat import DEAD_RUN_SENSOR

    with quiet_previews():
        repo = dg.load_from_defs_folder(path_within_project=host).get_repository_def()
    names = sorted(s.name for s in repo.sensor_defs)
    assert names.count(DEAD_RUN_SENSOR) == 1, names
    assert repo.get_sensor_def(DEAD_RUN_SENSOR).default_status == dg.DefaultSensorStatus.RUNNING


def test_a_host_s_unfilled_policy_is_its_location_s_load_error_in_one_line_without_a_stack(
        host):
    """A scaffolded policy left with its placeholders, in a host project: what the UI's code
    location page shows (the location loaded in a code server, as ``dg dev`` and a deployment
    load it) is the policy's one line, no stack trace, no cause behind it."""
    from favorites_maintenance_tests.helpers.dagster_internals import WorkspaceProcessContext
    from favorites_maintenance_tests.helpers.dagster_internals import ModuleTarget

    from favorites_maintenance.components.retention_policy import policy_template

    folder = host / "defs" / "guest_orders"
    folder.mkdir()
    (folder / "defs.yaml").write_text(policy_template("guest_orders"))
    [line] = [n for n, text in enumerate((folder / "defs.yaml").read_text().splitlines(), 1)
              if text.startswith("  table:")]
    target = ModuleTarget(module_name=f"{host.name}.definitions", attribute=None,
                          working_directory=str(host.parent), location_name="platform")
    with dg.instance_for_test() as instance, \
            WorkspaceProcessContext(instance, target) as workspace:
        [entry] = workspace.create_request_context().get_code_location_entries().values()
    error = entry.load_error
    assert error is not None
    assert error.message == (
        f"PolicyLoadError: src/{host.name}/defs/guest_orders/defs.yaml:{line}: policy "
        "guest_orders, table, key_column, age_column, null_columns: still the placeholders the "
        "scaffold wrote; name the table to prune and its columns\n")
    assert (error.stack, error.cause, error.context) == ([], None, None)


def test_without_policy_a_host_with_no_loadable_policy_is_told_what_to_do(host):
    """``dry-run`` without ``--policy``: the command reads the code location's only policy, so
    with none it says how to write one, with one broken file it shows that file's error, and
    with a broken file beside a valid one it asks which: the broken one may be the one meant."""
    from click.testing import CliRunner

    from favorites_maintenance.cli import main

    def dry_run():
        result = CliRunner().invoke(main, ["dry-run", "-m", f"{host.name}.definitions"])
        assert result.exit_code != 0
        return result.stderr

    for folder in ("guest_favorites_a", "guest_favorites_b"):
        shutil.rmtree(host / "defs" / folder)
    none = dry_run()
    assert "the code location has no policy" in none, none
    assert "dg scaffold defs favorites_maintenance.RetentionPolicy NAME" in none
    assert "guest_favorites" not in none  # a name the user never gave

    (host / "defs" / "draft").mkdir()
    (host / "defs" / "draft" / "defs.yaml").write_text(
        "type: favorites_maintenance.RetentionPolicy\n\nattributes:\n  name: draft\n"
        "  table: favorites.favorites\n")
    broken = dry_run()
    assert "policy draft, required fields missing" in broken, broken
    assert "no such policy" not in broken

    add_policy(host.parents[1], "guest_favorites_a", host.name)
    both = dry_run()
    assert ("--policy is required: the code location has 2 policies, guest_favorites_a, "
            "draft (does not load)") in both, both
