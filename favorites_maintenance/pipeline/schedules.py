"""The daily schedule on the configured cron, in UTC.

Dagster's ``build_schedule_from_partitioned_job`` refuses a custom cron for time partitions, so
the schedule is written out: each tick requests the latest *complete* partition as of the tick.
"""

import datetime as dt

import dagster as dg
from croniter import croniter

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.op_functions import op_function
from favorites_maintenance.pipeline.partitions import (
    partition_cutoff,
    policy_partitions,
)


def build_schedule(policy: Policy) -> dg.ScheduleDefinition:
    """The cleanup schedule of ``policy`` on its ``cron`` (validated by
    :func:`favorites_maintenance.config.parsers.validate_cron`), evaluated in UTC, running by
    default; it runs the policy's job, ``<name>_cleanup_job``.

    A tick at instant T requests the last daily partition that ended at or before T, e.g. the
    ``0 3 * * *`` tick of 2026-05-10 runs ``2026-05-09``.
    """
    partitions = policy_partitions(policy)

    @dg.schedule(
        name=policy.schedule_name,
        cron_schedule=policy.settings.cron,
        execution_timezone="UTC",
        job_name=policy.job_name,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Runs the {policy.name} cleanup for the latest complete UTC day.",
    )
    @op_function
    def cleanup_schedule(context: dg.ScheduleEvaluationContext):
        with dg.partition_loading_context(effective_dt=context.scheduled_execution_time):
            key = partitions.get_last_partition_key()
        if key is None:
            return dg.SkipReason("no complete daily partition yet")
        return dg.RunRequest(run_key=key, partition_key=key)

    return cleanup_schedule


def next_scheduled_run(policy: Policy, after: dt.datetime
                       ) -> tuple[dt.datetime, str | None, dt.datetime | None]:
    """When the schedule of ``policy`` next fires after ``after`` (a UTC datetime), the
    partition that tick requests, and the cutoff that run will use: ``(at, partition,
    cutoff)``, both ``None`` when the policy has no complete day at that tick yet.

    The run of partition ``D`` starts after ``D`` ended, so its cutoff is the end of ``D``
    minus the retention days (see
    :func:`~favorites_maintenance.pipeline.partitions.partition_cutoff`).
    """
    at = croniter(policy.settings.cron, after.astimezone(dt.timezone.utc)).get_next(dt.datetime)
    with dg.partition_loading_context(effective_dt=at):
        key = policy_partitions(policy).get_last_partition_key()
    if key is None:
        return at, None, None
    return at, key, partition_cutoff(key, policy.settings.retention_days, now=at)
