"""Alerts: no successful cleanup for too long (SPEC 6), and a failed cleanup run.

Both send through the ``alerts`` resource (:class:`~favorites_maintenance.resources.AlertSink`):
the log always, a Slack-compatible webhook when ``FAVORITES_ALERT_WEBHOOK_URL`` is set.

What counts as a success for the staleness sensor is a materialization of the cleanup asset
(the purge and the backlog measure both finished) of a *current* partition: one whose day ended
at most :data:`CURRENT_PARTITION_LAG` before the materialization. A backfill of an old day cleans
nothing today's run would not, so it does not reset the clock; a CANCELED or FAILED run records
no materialization, and the run of the chosen materialization must have ended SUCCESS.
"""


import datetime as dt
import json
import time
from collections.abc import Callable

import dagster as dg

from favorites_maintenance.assets import ASSET_KEY
from favorites_maintenance.partitions import daily_partitions
from favorites_maintenance.resources import AlertSink

STALE_SENSOR_NAME = "guest_favorites_cleanup_stale_sensor"
FAILURE_SENSOR_NAME = "guest_favorites_cleanup_failure_sensor"

#: The schedule runs the latest complete day, which ended at most 24 h before the tick; one more
#: day of slack for a late or retried run.
CURRENT_PARTITION_LAG = dt.timedelta(days=2)

#: Materializations read per tick at most (only those of the last few partitions, in the window).
_RECORD_LIMIT = 50


def _hours(value: dt.timedelta) -> str:
    return f"{value.total_seconds() / 3600:g} h"


def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def _recent_partition_keys(now: float, window: dt.timedelta) -> list[str]:
    """Keys of the daily partitions whose day ends no earlier than ``now - window``."""
    newest = dt.datetime.fromtimestamp(now, dt.timezone.utc).date()
    oldest = (dt.datetime.fromtimestamp(now, dt.timezone.utc) - window).date() - dt.timedelta(1)
    return [(oldest + dt.timedelta(days=i)).isoformat() for i in range((newest - oldest).days + 1)]


def last_current_success(instance: dg.DagsterInstance, now: float,
                         stale_after: dt.timedelta) -> float | None:
    """Timestamp (epoch seconds) of the newest current-partition success within
    ``stale_after`` before ``now``, or ``None``.

    One indexed query on the asset's materializations, narrowed to the last few partitions and to
    the window, plus one run lookup for the candidate.
    """
    keys = _recent_partition_keys(now, stale_after + CURRENT_PARTITION_LAG)
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=ASSET_KEY, asset_partitions=keys,
                              after_timestamp=now - stale_after.total_seconds()),
        limit=_RECORD_LIMIT,
    ).records
    for record in records:  # newest first
        if record.timestamp > now or record.partition_key is None:
            continue
        window_end = daily_partitions.time_window_for_partition_key(record.partition_key).end
        if window_end.timestamp() < record.timestamp - CURRENT_PARTITION_LAG.total_seconds():
            continue  # a backfill of an old day
        run = instance.get_run_record_by_id(record.run_id)
        if run is not None and run.dagster_run.status == dg.DagsterRunStatus.SUCCESS:
            return record.timestamp
    return None


def build_stale_sensor(stale_after: dt.timedelta,
                       clock: Callable[[], float] = time.time) -> dg.SensorDefinition:
    """The staleness sensor for a threshold of ``stale_after``.

    Alerts once per episode when no current success happened for ``stale_after``, and sends a
    resolution message when one returns. On a fresh deployment (no cursor yet) the clock starts
    at the sensor's first tick, so it alerts only after ``stale_after`` has passed since then.

    Args:
        stale_after: threshold (``FAVORITES_GUEST_RETENTION_STALE_AFTER``, default 48 h).
        clock: epoch seconds now; tests pass a fixed clock.

    The cursor is JSON ``{"firstSeen": epoch_s, "alertedAt": epoch_s | null}``.
    """

    @dg.sensor(
        name=STALE_SENSOR_NAME,
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(f"Alerts when guest_favorites_cleanup has had no successful current run "
                     f"for {_hours(stale_after)}."),
    )
    def guest_favorites_cleanup_stale_sensor(context: dg.SensorEvaluationContext,
                                             alerts: AlertSink):
        now = clock()
        state = json.loads(context.cursor) if context.cursor else {}
        first_seen = state.get("firstSeen", now)
        alerted_at = state.get("alertedAt")
        last = last_current_success(context.instance, now, stale_after)
        stale = last is None and now - first_seen > stale_after.total_seconds()
        if stale and alerted_at is None:
            alerts.send(f"guest_favorites_cleanup: no successful run for more than "
                        f"{_hours(stale_after)} (checked at {_utc(now)}; watching since "
                        f"{_utc(first_seen)}). See the runbook in README.md.", log=context.log)
            alerted_at = now
            outcome = "alerted"
        elif not stale and alerted_at is not None:
            # No success but no longer stale: the threshold was raised since the alert.
            why = (f"a run succeeded at {_utc(last)}" if last is not None
                   else f"within the threshold of {_hours(stale_after)} again")
            alerts.send(f"guest_favorites_cleanup: resolved, {why}.", log=context.log,
                        level=20)
            alerted_at = None
            outcome = "resolved"
        else:
            outcome = "stale, already alerted" if stale else "fresh"
        context.update_cursor(json.dumps({"firstSeen": first_seen, "alertedAt": alerted_at}))
        return dg.SkipReason(outcome)

    return guest_favorites_cleanup_stale_sensor


# No monitored_jobs: the sensor then watches every job of this code location, which is what
# catches backfills launched from the UI (they run as Dagster's implicit asset job, not as
# guest_favorites_cleanup_job). The location holds nothing but the cleanup.
@dg.run_failure_sensor(
    name=FAILURE_SENSOR_NAME,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Alerts when a cleanup run fails (scheduled, launched or backfilled).",
)
def guest_favorites_cleanup_failure_sensor(context: dg.RunFailureSensorContext,
                                           alerts: AlertSink):
    """Send the failed run's id, partition and error message through the alert sink."""
    run = context.dagster_run
    partition = run.tags.get("dagster/partition", "-")
    message = context.failure_event.message or "no message"
    alerts.send(f"{run.job_name} run {run.run_id} (partition {partition}) failed: {message}",
                log=context.log)
