"""The code location loads, as Dagster loads it, and refuses bad settings; no module of the
package builds definitions when it is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml
from favorites_maintenance_tests.helpers.dagster_internals import repository_def_from_target_def
from favorites_maintenance_tests.helpers.dagster_internals import loadable_targets_from_python_module
from favorites_maintenance_tests.helpers.dagster_internals import LazyDefinitions

from favorites_maintenance.pipeline.jobs import CLEANUP_EXECUTOR
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.jobs import (
    ASSET_KEY,
    JOB,
    guest_settings_env,
    load_code_location,
)

ROOT = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).parent / "dagster")
SENSORS = ("favorites_maintenance_stale_sensor", "favorites_maintenance_failure_sensor",
           "favorites_maintenance_tick_failure_sensor",
           "cleanup_dead_run_sensor")  # one of each for the code location
CHECKS = {"no_guest_row_older_than_retention_plus_one_day", "deleted_total_spike",
          "no_rows_skipped"}


def validate(env_extra: dict, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env.update(env_extra, DAGSTER_HOME=str(home))  # an empty home: a throwaway local instance
    return subprocess.run([DAGSTER, "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_every_definition_resolves(monkeypatch):
    defs = load_code_location(monkeypatch=monkeypatch, cron="15 2 * * *")
    dg.Definitions.validate_loadable(defs)
    assert defs.resolve_job_def(JOB)
    schedule = defs.resolve_schedule_def("guest_favorites_cleanup_schedule")
    assert schedule.cron_schedule == "15 2 * * *"
    assert schedule.execution_timezone == "UTC"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    for name in SENSORS:
        assert defs.resolve_sensor_def(name).default_status == dg.DefaultSensorStatus.RUNNING
    asset = defs.resolve_assets_def(ASSET_KEY)
    assert {k.name for k in defs.resolve_asset_graph().asset_check_keys} == CHECKS
    [spec] = asset.specs
    assert spec.freshness_policy is not None


def test_dagster_finds_the_one_code_location_and_it_holds_every_guest_favorites_definition(
        monkeypatch):
    """``favorites_maintenance.definitions`` as Dagster's module loader reads it
    (``workspace.yaml``'s ``python_module``): one loadable target, the ``@dg.definitions``
    function ``defs``, whose repository holds the whole guest-favorites surface and the four
    resources (the database, the alert sink, the metrics push and the run limits)."""
    monkeypatch.setenv(DATABASE_URL_VAR, "postgresql+psycopg://app@127.0.0.1:1/favorites")
    guest_settings_env(monkeypatch)
    [target] = loadable_targets_from_python_module("favorites_maintenance.definitions",
                                                   working_directory=str(ROOT))
    assert target.attribute == "defs"
    assert isinstance(target.target_definition, LazyDefinitions)
    repo = repository_def_from_target_def(target.target_definition)

    assert JOB in {job.name for job in repo.get_all_jobs()}
    [schedule] = repo.schedule_defs
    assert (schedule.name, schedule.cron_schedule, schedule.job_name) == (
        "guest_favorites_cleanup_schedule", "0 3 * * *", JOB)
    assert {s.name for s in repo.sensor_defs} == set(SENSORS)
    assert set(repo.assets_defs_by_key) == {ASSET_KEY}
    assert {k.name for k in repo.asset_graph.asset_check_keys if k.asset_key == ASSET_KEY} \
        == CHECKS
    assert set(repo.get_top_level_resources()) == {
        "favorites_maintenance_favorites_database_url", "favorites_maintenance_alerts",
        "favorites_maintenance_metrics"}
    # The policy's run limits are its asset's own, so its job carries them.
    assert "favorites_maintenance_guest_favorites_run_limits" in repo.get_job(JOB).resource_defs
    # The purge runs in the policy's own concurrency pool.
    purge = repo.get_job(JOB).graph.node_named("favorites__guest_favorites_cleanup") \
        .definition.node_named("purge").definition
    assert purge.pool == "guest_favorites_cleanup"


def test_every_run_of_the_policy_executes_in_its_run_worker_and_a_backfill_is_one_run(
        monkeypatch):
    """The policy's job runs every step in the run worker's process; Dagster's implicit asset
    job (the UI's "Materialize", asset backfills) keeps the location's default executor; no
    node carries a declarative retry policy, which the in-process executor would turn a
    termination into a retry of; a backfill of the asset is one run over its range."""
    defs = load_code_location(monkeypatch=monkeypatch)
    assert defs.resolve_job_def(JOB).executor_def is CLEANUP_EXECUTOR
    assert defs.resolve_implicit_global_asset_job_def().executor_def is not CLEANUP_EXECUTOR
    for job in (defs.resolve_job_def(JOB), defs.resolve_implicit_global_asset_job_def()):
        assert [node.name for node in job.graph.iterate_node_defs()
                if isinstance(node, dg.OpDefinition) and node.retry_policy] == [], job.name
        assert job.op_retry_policy is None, job.name
    assert defs.resolve_assets_def(ASSET_KEY).backfill_policy == dg.BackfillPolicy.single_run()


#: Imports every module of the package (``__main__`` runs the command line: not imported) and
#: prints, as JSON, each module attribute that is a Dagster definition.
_IMPORT_EVERY_MODULE = """
import importlib, json, pkgutil
import dagster as dg
import favorites_maintenance as package

UnresolvedAssetJobDefinition = type(dg.define_asset_job("probe"))  # what define_asset_job makes

KINDS = (dg.AssetsDefinition, dg.AssetChecksDefinition, dg.JobDefinition,
         UnresolvedAssetJobDefinition, dg.GraphDefinition, dg.OpDefinition,
         dg.SensorDefinition, dg.ScheduleDefinition, dg.Definitions, dg.RepositoryDefinition)
modules = [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
           if m.name.rsplit(".", 1)[-1] != "__main__"]
found = []
for name in modules:
    module = importlib.import_module(name)
    found += [f"{name}.{attr}: {type(value).__name__}" for attr, value in vars(module).items()
              if isinstance(value, KINDS)]
print(json.dumps({"modules": modules, "definitions": found}))
"""


def test_no_module_of_the_package_builds_definitions_at_import():
    """Definitions exist only once the code location loads: importing every module, in a fresh
    interpreter and with an invalid policy setting (which any policy built at import would
    refuse), builds none and fails on none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env["FAVORITES_GUEST_RETENTION_CRON"] = "0 3 * * * *"
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EVERY_MODULE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"favorites_maintenance.definitions", "favorites_maintenance.pipeline.resources",
            "favorites_maintenance.pipeline.assets", "favorites_maintenance.pipeline.sensors",
            "favorites_maintenance.pipeline.schedules", "favorites_maintenance.pipeline.jobs",
            "favorites_maintenance.pipeline.checks"} <= set(imported["modules"])
    assert imported["definitions"] == []


def test_dagster_loads_the_workspace(tmp_path):
    proc = validate({"FAVORITES_DATABASE_URL": "postgresql+psycopg://app@127.0.0.1:1/favorites"},
                    tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_dagster_refuses_the_workspace_on_a_bad_setting(tmp_path):
    proc = validate({"FAVORITES_GUEST_RETENTION_CRON": "0 3 * * * *"}, tmp_path)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "FAVORITES_GUEST_RETENTION_CRON: '0 3 * * * *' has 6 fields" in out
    # One line naming the setting, no stack trace (the load error of the configuration).
    assert "Stack Trace" not in out and "Traceback" not in out, out


@pytest.mark.parametrize("broken", ["misspelled", "placeholders"])
def test_a_broken_policy_is_the_location_s_load_error_in_one_line_without_a_stack(
        monkeypatch, tmp_path, broken):
    """What the UI shows on the code location's page: the webserver's workspace loads the
    location in a code server, as ``dagster dev`` and a deployment do; its load error is the
    policy's one line, with no stack trace and no cause behind it, whether the file does not
    fit the component's schema or the policy's own checks refuse it."""
    from favorites_maintenance_tests.helpers.dagster_internals import WorkspaceProcessContext
    from favorites_maintenance_tests.helpers.dagster_internals import WorkspaceFileTarget

    from favorites_maintenance.components.retention_policy import policy_template
    from favorites_maintenance_tests.helpers.policy_files import (
        MISSPELLED,
        misspelled_error,
        policy_project,
    )

    for name in list(os.environ):
        if name.startswith("FAVORITES_"):
            monkeypatch.delenv(name)
    if broken == "misspelled":
        text, message = MISSPELLED, misspelled_error("src/my_platform/defs")
    else:
        text = policy_template("guest_carts")
        [line] = [n for n, written in enumerate(text.splitlines(), 1)
                  if written.startswith("  table:")]
        message = (f"src/my_platform/defs/guest_carts/defs.yaml:{line}: policy "
                   "guest_carts, table, key_column, age_column, null_columns: still the "
                   "placeholders the scaffold wrote; name the table to prune and its columns")
    root = policy_project(tmp_path, {"guest_carts": text})
    (root / "workspace.yaml").write_text(yaml.safe_dump({"load_from": [{"python_module": {
        "module_name": "my_platform.definitions", "working_directory": str(root / "src"),
        "location_name": "favorites_maintenance"}}]}))
    monkeypatch.chdir(root)
    target = WorkspaceFileTarget([str(root / "workspace.yaml")])
    with dg.instance_for_test() as instance, \
            WorkspaceProcessContext(instance, target) as workspace:
        [entry] = workspace.create_request_context().get_code_location_entries().values()
    error = entry.load_error
    assert error is not None
    assert error.message == f"PolicyLoadError: {message}\n"
    assert (error.stack, error.cause, error.context) == ([], None, None)


def test_one_load_of_the_code_location_reads_each_policy_file_once(monkeypatch):
    """Dagster's loader reads (opens and parses) each ``defs.yaml`` once per load, however
    many policies and settings the location holds. The component reads a file once more only
    when its policy writes a setting as a literal, to take it as written rather than by YAML
    1.1's rules (``030`` is not 24) and to refuse a key written twice, once for all its
    settings."""
    import builtins
    from collections import Counter

    from favorites_maintenance_tests.helpers.policies import favorites_policy, policy_sandbox

    guest_settings_env(monkeypatch)
    reads: Counter[str] = Counter()
    real_open, real_read_text = builtins.open, Path.read_text

    def counting_open(file, *args, **kwargs):
        if str(file).endswith("defs.yaml"):
            reads[Path(str(file)).parent.name] += 1
        return real_open(file, *args, **kwargs)

    def counting_read_text(path, *args, **kwargs):
        if path.name == "defs.yaml":
            reads[path.parent.name] += 1
        return real_read_text(path, *args, **kwargs)

    # Five settings written as literals; the rule alone, every setting at its default.
    carts = favorites_policy("guest_carts", retention_days=30, batch_size=500, cron="0 4 * * *")
    rule = {key: value for key, value in favorites_policy("guest_orders").items()
            if key in ("name", "table", "key_column", "age_column", "null_columns")}
    with policy_sandbox(carts, rule) as sandbox, sandbox.tree() as tree:
        monkeypatch.setattr(builtins, "open", counting_open)
        monkeypatch.setattr(Path, "read_text", counting_read_text)
        defs = dg.load_from_defs_folder(path_within_project=tree.defs_module_path)
        monkeypatch.undo()
    assert reads == {"guest_orders": 1, "guest_carts": 2,
                     "guest_favorites": 2}  # its group is a literal
    assert {job.name for job in defs.resolve_all_job_defs()} >= {
        "guest_carts_cleanup_job", "guest_orders_cleanup_job", JOB}


def test_a_policy_file_is_parsed_once_for_all_the_settings_it_writes(monkeypatch):
    """Reading settings as written parses the policy's file once, however many settings it
    writes as literals (each parse a cost per policy in a location's build)."""
    from collections import Counter

    import yaml

    from favorites_maintenance_tests.helpers.policies import favorites_policy, policy_sandbox

    guest_settings_env(monkeypatch)
    parses: Counter[str] = Counter()
    text_loaders = {yaml.BaseLoader, getattr(yaml, "CBaseLoader", yaml.BaseLoader)}

    def counting(parse):
        def parse_counted(stream, Loader=None):
            if Loader in text_loaders and "name: many_settings" in str(stream):
                parses["many_settings"] += 1
            return parse(stream, Loader=Loader)
        return parse_counted

    # Six settings written as literals, values no other test writes (nothing parsed before).
    policy = favorites_policy("many_settings", retention_days=41, batch_size=613,
                              cron="7 5 * * *", max_pause="PT7M")
    with policy_sandbox(policy) as sandbox, sandbox.tree() as tree:
        for name in ("compose_all", "load_all", "compose", "load"):
            monkeypatch.setattr(yaml, name, counting(getattr(yaml, name)))
        defs = dg.load_from_defs_folder(path_within_project=tree.defs_module_path)
        monkeypatch.undo()
    assert parses == {"many_settings": 1}
    assert "many_settings_cleanup_job" in {job.name for job in defs.resolve_all_job_defs()}
