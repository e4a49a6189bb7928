"""Running a policy's job in a test and reading back what Dagster recorded: one place for the
sequence every Dagster-level test needs.

- :func:`run_job` builds the definitions for some settings and runs one partition;
- :func:`run_partition` runs one partition of a job of given definitions;
- :func:`materialization` and :func:`run_report` read the run's materialization metadata;
- :func:`step_failure`, :func:`error_text` and :func:`failure_text` read why a run failed.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.definitions import build_defs
from favorites_maintenance.policy import GUEST_POLICY
from favorites_maintenance.run_report import RunReport
from favorites_maintenance.settings import DATABASE_URL_VAR, Settings

#: The guest-favorites job and its asset.
JOB = GUEST_POLICY.job_name
ASSET_KEY = dg.AssetKey(list(GUEST_POLICY.asset_key_path))


def purge_retries(retries: int, *, asset_key: dg.AssetKey = ASSET_KEY) -> dict:
    """Run config giving the purge op ``retries`` retries on transient errors, without delay."""
    return {"ops": {"__".join(asset_key.path): {"ops": {"purge": {
        "config": {"max_retries": retries, "retry_delay_seconds": 0.0}}}}}}


def run_partition(defs: dg.Definitions, instance: dg.DagsterInstance, partition: str, *,
                  job: str = JOB, **kwargs) -> dg.ExecuteInProcessResult:
    """Run ``partition`` of ``job`` of ``defs`` in process on ``instance``; ``kwargs`` go to
    ``execute_in_process`` (``run_config``, ``raise_on_error``, ...)."""
    return defs.resolve_job_def(job).execute_in_process(partition_key=partition,
                                                        instance=instance, **kwargs)


def run_job(db_url, instance: dg.DagsterInstance, *, partition: str, monkeypatch=None,
            retries: int | None = 0, **settings) -> dg.ExecuteInProcessResult:
    """One real run of ``guest_favorites_cleanup_job`` against ``db_url`` (a URL or its text;
    a failure is returned, not raised).

    ``retries`` sets the purge op's retries on transient errors (without delay); 0 by default,
    so that a transient failure fails the run here; ``None`` keeps the job's own defaults.
    Batches keep ``batch_size`` (no target time per batch) unless ``settings`` give a
    ``target_batch_duration``: these tests count batches and stop the job at one.
    """
    settings.setdefault("target_batch_duration", dt.timedelta(0))
    mp = monkeypatch or pytest.MonkeyPatch()
    mp.setenv(DATABASE_URL_VAR, sa.make_url(db_url).render_as_string(hide_password=False))
    return run_partition(build_defs(Settings(**settings)), instance, partition,
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
    """The run's :class:`~favorites_maintenance.run_report.RunReport`, read back from its
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
