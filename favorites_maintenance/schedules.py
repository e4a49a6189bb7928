"""The daily schedule on the configured cron, in UTC.

Dagster's ``build_schedule_from_partitioned_job`` refuses a custom cron for time partitions, so
the schedule is written out: each tick requests the latest *complete* partition as of the tick.
"""

from __future__ import annotations

import dagster as dg

from favorites_maintenance.jobs import guest_favorites_cleanup_job
from favorites_maintenance.partitions import daily_partitions

SCHEDULE_NAME = "guest_favorites_cleanup_schedule"


def build_schedule(cron: str) -> dg.ScheduleDefinition:
    """The cleanup schedule on ``cron`` (validated by
    :func:`favorites_maintenance.settings.validate_cron`), evaluated in UTC, running by default.

    A tick at instant T requests the last daily partition that ended at or before T, e.g. the
    ``0 3 * * *`` tick of 2026-05-10 runs ``2026-05-09``.
    """

    @dg.schedule(
        name=SCHEDULE_NAME,
        cron_schedule=cron,
        execution_timezone="UTC",
        job=guest_favorites_cleanup_job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Runs the guest favorites cleanup for the latest complete UTC day.",
    )
    def guest_favorites_cleanup_schedule(context: dg.ScheduleEvaluationContext):
        with dg.partition_loading_context(effective_dt=context.scheduled_execution_time):
            key = daily_partitions.get_last_partition_key()
        if key is None:
            return dg.SkipReason("no complete daily partition yet")
        return dg.RunRequest(run_key=key, partition_key=key)

    return guest_favorites_cleanup_schedule
