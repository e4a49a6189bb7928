"""Running a policy's job in a test and reading back what Dagster recorded: one place for the
sequence every Dagster-level test needs. Every job comes from the code location itself
(:func:`~favorites_maintenance.components.policy_tree.code_location`, the real YAML of
``defs/``), its settings from the guest-favorites policy's variables, as in production.

- :func:`guest_settings_env` sets the guest-favorites policy's variables for some settings;
- :func:`load_code_location` loads the code location for them, against a database;
- :func:`run_job` runs one partition of the guest-favorites job that way;
- :func:`run_partition` runs one partition of a job of given definitions;
- :func:`materialization` and :func:`run_report` read the run's materialization metadata;
- :func:`step_failure`, :func:`error_text` and :func:`failure_text` read why a run failed.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

import favorites_maintenance.defs
from favorites_maintenance.components.policy_tree import code_location
from favorites_maintenance.pipeline.run_report import RunReport
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.clock import PARTITION

#: The guest-favorites policy's public names (a contract: dashboards and alerts use them).
POLICY = "guest_favorites"
JOB = "guest_favorites_cleanup_job"
ASSET_KEY = dg.AssetKey(["favorites", "guest_favorites_cleanup"])


def _guest_variables() -> dict[str, str]:
    """Setting -> the variable the real ``defs/guest_favorites/defs.yaml`` reads it from."""
    text = (Path(favorites_maintenance.defs.__file__).parent / "guest_favorites"
            / "defs.yaml").read_text()
    return dict(re.findall(r"^\s+([a-z_]+): \"\{\{ env\.([A-Z_]+) \}\}\"$", text, re.M))


GUEST_VARIABLES = _guest_variables()


def guest_variable(setting: str) -> str:
    """The variable ``defs/guest_favorites/defs.yaml`` reads ``setting`` from."""
    return GUEST_VARIABLES[setting]


def as_text(value) -> str:
    """A setting's Python value as its variable would hold it (durations in ISO 8601)."""
    if isinstance(value, dt.timedelta):
        return f"PT{value.total_seconds():g}S"
    return str(value)


#: The first partition of the guest-favorites policy in these tests, which run days of 2026.
TEST_PARTITIONS_START = dt.date(2026, 1, 1)


def guest_settings_env(monkeypatch: pytest.MonkeyPatch, **settings) -> None:
    """Set the guest-favorites policy's variable of each of ``settings`` (field name of
    :class:`~favorites_maintenance.config.policy_settings.PolicySettings` -> Python value),
    and unset the others, so the code location loads exactly these settings; its partitions
    start on :data:`TEST_PARTITIONS_START` unless ``settings`` say otherwise."""
    settings.setdefault("partitions_start", TEST_PARTITIONS_START)
    unknown = sorted(set(settings) - set(GUEST_VARIABLES))
    assert not unknown, f"settings the guest-favorites YAML does not read: {unknown}"
    for name in GUEST_VARIABLES:
        if name in settings and settings[name] is not None:
            monkeypatch.setenv(guest_variable(name), as_text(settings[name]))
        else:
            monkeypatch.delenv(guest_variable(name), raising=False)


def load_code_location(db_url=None, monkeypatch: pytest.MonkeyPatch | None = None,
                       tree: dg.ComponentTree | None = None, **settings) -> dg.Definitions:
    """The code location as production loads it, for the guest-favorites ``settings`` (see
    :func:`guest_settings_env`), on ``db_url`` (a URL or its text; ``None`` keeps the
    environment's) and from ``tree`` (default: the real ``defs/``)."""
    mp = monkeypatch or pytest.MonkeyPatch()
    if db_url is not None:
        mp.setenv(DATABASE_URL_VAR, sa.make_url(db_url).render_as_string(hide_password=False))
    guest_settings_env(mp, **settings)
    return code_location(tree)


def purge_retries(retries: int, *, asset_key: dg.AssetKey = ASSET_KEY) -> dict:
    """Run config giving the ops that reach the database (``compute_cutoff``, ``purge``)
    ``retries`` retries on transient errors, without delay."""
    config = {"config": {"max_retries": retries, "retry_delay_seconds": 0.0}}
    return {"ops": {"__".join(asset_key.path): {"ops": {"compute_cutoff": config,
                                                         "purge": config}}}}


def run_partition(defs: dg.Definitions, instance: dg.DagsterInstance, partition: str, *,
                  job: str = JOB, **kwargs) -> dg.ExecuteInProcessResult:
    """Run ``partition`` of ``job`` of ``defs`` in process on ``instance``; ``kwargs`` go to
    ``execute_in_process`` (``run_config``, ``raise_on_error``, ...)."""
    return defs.resolve_job_def(job).execute_in_process(partition_key=partition,
                                                        instance=instance, **kwargs)


def run_job(db_url, instance: dg.DagsterInstance, *, partition: str = PARTITION,
            monkeypatch=None,
            retries: int | None = 0, **settings) -> dg.ExecuteInProcessResult:
    """One real run of ``guest_favorites_cleanup_job`` for ``partition`` (default
    :data:`~favorites_maintenance_tests.helpers.clock.PARTITION`) against ``db_url`` (a URL or
    its text; a failure is returned, not raised), the code location loaded for ``settings``.

    ``retries`` sets the purge op's retries on transient errors (without delay); 0 by default,
    so that a transient failure fails the run here; ``None`` keeps the job's own defaults.
    Batches keep ``batch_size`` (no target time per batch) unless ``settings`` give a
    ``target_batch_duration``: these tests count batches and stop the job at one.
    """
    settings.setdefault("target_batch_duration", dt.timedelta(0))
    defs = load_code_location(db_url, monkeypatch, **settings)
    return run_partition(defs, instance, partition,
                         run_config=None if retries is None else purge_retries(retries),
                         raise_on_error=False)


def materialization(result: dg.ExecuteInProcessResult, *,
                    asset_key: dg.AssetKey = ASSET_KEY) -> dict | None:
    """The run's one materialization of ``asset_key`` as plain metadata values, or ``None``
    when the run recorded none."""
    mats = [m for m in result.get_asset_materialization_events() if m.asset_key == asset_key]
    if not mats:
        return None
    [mat] = mats
    return {k: v.value for k, v in mat.materialization.metadata.items()}


def run_report(result: dg.ExecuteInProcessResult, *,
               asset_key: dg.AssetKey = ASSET_KEY) -> RunReport:
    """The run's :class:`~favorites_maintenance.pipeline.run_report.RunReport`, read back from its
    materialization (which must exist)."""
    metadata = materialization(result, asset_key=asset_key)
    assert metadata is not None, "the run recorded no materialization"
    return RunReport.from_metadata(metadata)


def step_failure(result: dg.ExecuteInProcessResult):
    """The one STEP_FAILURE of a failed run: (step key, error info)."""
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return failure.step_key, failure.event_specific_data.error


def error_text(error_info) -> str:
    """Every message of a serialized error and of its causes and contexts, stacks included."""
    parts = []
    while error_info is not None:
        parts.append(error_info.message)
        parts.extend(error_info.stack)
        if error_info.context is not None:
            parts.append(error_text(error_info.context))
        error_info = error_info.cause
    return "\n".join(parts)


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    """The messages (no stack traces) of each failed step's error and of its causes."""
    messages = []
    for event in result.all_events:
        if event.event_type_value == "STEP_FAILURE":
            error = event.event_specific_data.error
            while error is not None:
                messages.append(error.message.strip())
                error = error.cause
    return "\n".join(messages)
