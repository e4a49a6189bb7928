"""The restore job of a policy with an archive: ``restore_<name>_job``.

It moves archived rows back into the policy's table (:mod:`~favorites_maintenance.retention.
restore`): the rows one run archived (``run_id``), or those archived between two instants
(``since``, ``until``). It is launched from the UI's launchpad with run config::

    ops:
      restore_guest_carts:
        config:
          run_id: 8e273611-8135-4f68-8f1e-9bbfc38c3f0f
          pretend: true            # count only (default false)
          allow_prunable: false    # restore rows the rule would delete again (default false)
          batch_size: 1000

or by ``favorites-maintenance restore``, which runs the same job; either way its run stays in
the instance's history, with its figures as the op's output metadata (``selectedRows``,
``restoredRows``, ``leftInArchive``, ``keyExistsRows``, ``prunableRows``, ``failedRows``):
counts only, never a value of an archived row.

The job runs on the policy's database only (its ``database_url_env`` resource) and holds the
policy's concurrency pool, ``<name>_cleanup``: queued, it waits for a running purge of the
policy and a purge waits for it. A run that does not go through the queue (``execute_in_process``,
the command line) refuses to start while another run holding that pool is in progress.
"""


import datetime as dt

import dagster as dg
from pydantic import Field

from favorites_maintenance.config.policy import DATABASE_TAG, Policy
from favorites_maintenance.config.policy_settings import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE
from favorites_maintenance.pipeline.dagster_internals import (
    POOL_TAG_PREFIX,
    capture_interrupts,
)
from favorites_maintenance.pipeline.jobs import CLEANUP_EXECUTOR
from favorites_maintenance.pipeline.resources import PolicyDatabase, name_database
from favorites_maintenance.pipeline.run_log import core_logs_in_run_log
from favorites_maintenance.pipeline.stop_requests import StopRequests
from favorites_maintenance.retention.errors import InvalidArgumentError, RestoreError
from favorites_maintenance.retention.restore import RestoreReport, Selection, restore

#: Run statuses of a run that holds its pools.
_IN_PROGRESS = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
                dg.DagsterRunStatus.CANCELING]


class RestoreConfig(dg.Config):
    """Run config of a restore op (``ops.restore_<name>.config``).

    Attributes:
        run_id: restore the rows this run archived (a Dagster run id of the policy's job).
        since, until: instead of ``run_id``, restore the rows archived in ``[since, until)``:
            ISO 8601 instants with their offset (``2026-06-15T00:00:00Z``); either may be left
            out (from the first archived row, until now).
        pretend: count what would be restored; move nothing.
        allow_prunable: restore rows the deployed rule would delete again at the next run.
        batch_size: rows per batch transaction.
    """

    run_id: str | None = Field(default=None, description="Restore the rows this run archived.")
    since: str | None = Field(default=None, description="Or the rows archived from this "
                              "ISO 8601 instant (with its offset, e.g. 2026-06-15T00:00:00Z).")
    until: str | None = Field(default=None, description="... until this ISO 8601 instant "
                              "(exclusive; default now).")
    pretend: bool = Field(default=False, description="Count only; move nothing.")
    allow_prunable: bool = Field(default=False, description="Restore rows the deployed rule "
                                 "would delete again at the next run.")
    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, ge=1, le=MAX_BATCH_SIZE,
                            description="Rows per batch transaction.")


def parse_instant(text: str | None, name: str) -> dt.datetime | None:
    """``text``, an ISO 8601 instant with its offset, as an aware datetime (``None`` stays
    ``None``).

    Raises:
        ValueError: not such an instant; the message names ``name``.
    """
    if text is None:
        return None
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{name} {text!r} is not an ISO 8601 instant "
                         "(e.g. 2026-06-15T00:00:00Z)") from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} {text!r} has no offset: write the instant with one "
                         "(2026-06-15T00:00:00Z, or +02:00)")
    return value


def selection_of(config: RestoreConfig) -> Selection:
    """The rows ``config`` selects.

    Raises:
        ValueError: both or neither of ``run_id`` and ``since``/``until``, an instant that is
            not one, ``until`` not after ``since``; the message names the fields.
    """
    if config.run_id is not None and (config.since or config.until):
        raise ValueError("give run_id, or since/until, not both")
    if config.run_id is None and not (config.since or config.until):
        raise ValueError("give run_id (the run whose archived rows to restore), or since "
                         "and/or until (the instants they were archived between)")
    run_id = config.run_id.strip() if config.run_id is not None else None
    if run_id == "":
        raise ValueError("run_id is empty")
    try:
        return Selection(run_id=run_id, since=parse_instant(config.since, "since"),
                         until=parse_instant(config.until, "until"))
    except InvalidArgumentError as exc:
        raise ValueError(str(exc)) from None


def report_metadata(report: RestoreReport) -> dict:
    """A restore's figures as op output metadata (counts and flags only)."""
    return {"selectedRows": report.selected_rows, "restoredRows": report.restored_rows,
            "restorableRows": report.restorable_rows, "leftInArchive": report.left_in_archive,
            "keyExistsRows": report.key_exists_rows, "prunableRows": report.prunable_rows,
            "failedRows": report.failed_rows,
            "failedCauses": "; ".join(report.failed_causes) or "none",
            "batches": report.batches, "durationMs": round(report.duration_s * 1000),
            "pretend": report.pretend}


def _pool_holders(context: dg.OpExecutionContext, pool: str) -> list[dg.DagsterRun]:
    """Runs other than this one in progress that hold ``pool``."""
    records = context.instance.get_run_records(dg.RunsFilter(
        tags={f"{POOL_TAG_PREFIX}{pool}": "true"}, statuses=_IN_PROGRESS))
    return [r.dagster_run for r in records if r.dagster_run.run_id != context.run_id]


def run_restore_op(context: dg.OpExecutionContext, config: RestoreConfig,
                   database: PolicyDatabase, policy: Policy) -> RestoreReport:
    """The body of a policy's restore op (see the module docstring); records its figures as
    the op's output metadata and returns them.

    Raises:
        dagster.Failure: a refusal (the config, a run of the policy in progress, an unknown run
            id, prunable rows without ``allow_prunable``, an archive that does not match) or a
            failed batch, with the figures so far as metadata.
        DagsterExecutionInterruptedError: after a stop request (the run ends CANCELED).
    """
    try:
        selection = selection_of(config)
    except ValueError as exc:
        raise dg.Failure(f"restore refused: {exc} (config of op restore_{policy.name})") \
            from None
    holders = _pool_holders(context, policy.pool)
    if holders:
        run = holders[0]
        raise dg.Failure(
            f"restore refused: run {run.run_id} of {run.job_name} is in progress and holds the "
            f"pool {policy.pool}: a restore never runs beside a purge of policy {policy.name}. "
            "Launch it from the UI (it then waits in the queue) or run it again once that run "
            "ended")
    with capture_interrupts(), core_logs_in_run_log(context), \
            StopRequests(context) as stop_requests:
        try:
            report = restore(database.engine, policy.rule, policy.archive_table, policy.name,
                             selection, retention_days=policy.settings.retention_days,
                             batch_size=config.batch_size, pretend=config.pretend,
                             allow_prunable=config.allow_prunable,
                             should_stop=stop_requests.requested)
        except RestoreError as exc:
            name_database(exc, policy)
            known = ("" if selection.run_id is None
                     or context.instance.get_run_by_id(selection.run_id) is not None
                     else f" (this instance has no run {selection.run_id} either)")
            raise dg.Failure(f"restore refused or failed: {exc}{known}", metadata=(
                report_metadata(exc.report) if exc.report is not None else None)) from None
        except Exception as exc:
            name_database(exc, policy)
            raise
        context.add_output_metadata(report_metadata(report))
        if report.stopped:
            raise dg.DagsterExecutionInterruptedError(
                f"restore stopped on request: {report.restored_rows} rows restored and "
                f"committed, {report.left_in_archive} left in the archive")
    return report


def build_restore_job(policy: Policy) -> dg.JobDefinition:
    """``restore_<name>_job`` of ``policy`` (which has an ``archive_table``): one op,
    ``restore_<name>``, holding the policy's pool, on the policy's database; tagged with its
    database variable like the cleanup job."""
    database_key = policy.database_key

    @dg.op(name=f"restore_{policy.name}", pool=policy.pool, out=dg.Out(dg.Nothing),
           required_resource_keys={database_key},
           description=f"Move archived rows of policy {policy.name} from "
                       f"{policy.archive_table} back into {policy.rule.qualified_name}, on the "
                       f"database of {policy.database_url_env}.")
    def restore_op(context: dg.OpExecutionContext, config: RestoreConfig) -> None:
        run_restore_op(context, config, getattr(context.resources, database_key), policy)

    @dg.job(name=policy.restore_job_name, tags={DATABASE_TAG: policy.database_url_env},
            executor_def=CLEANUP_EXECUTOR,
            description=f"Restore rows of policy {policy.name} from its archive "
                        f"{policy.archive_table}: those one run archived (run_id), or those "
                        "archived between two instants (since, until). pretend: count only.")
    def restore_job():
        restore_op()

    return restore_job
