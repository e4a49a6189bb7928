"""The staleness sensor: alerts when a retention policy has had no successful cleanup of a
current day for its ``stale_after``, and when one succeeds again.

What counts as a success is a materialization of the cleanup asset (the purge and the backlog
measure both finished) of a *current* partition: one whose day ended at most
:data:`~favorites_maintenance.pipeline.partitions.CURRENT_PARTITION_LAG` (two days) before
the materialization. A backfill of an old day cleans nothing today's run would not, so it does not
reset the clock; a CANCELED or FAILED run records no materialization, and the run of the chosen
materialization must have ended SUCCESS.
"""

import datetime as dt
import json
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import dagster as dg

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.partitions import (
    CURRENT_PARTITION_LAG,
    daily_partitions,
    is_current,
    policy_partitions,
)
from favorites_maintenance.pipeline.resources import AlertSink
from favorites_maintenance.pipeline.sensor_support import (
    is_number,
    location_policies,
    read_cursor,
    summary,
    utc_instant,
)

#: The sensor's name, one for the whole code location: the package's name first, so a host
#: project's own sensors never take it.
#: The sensors' names, one of each for the whole code location: the package's name first, so a
#: host project's own sensors never take them.
STALE_SENSOR = "favorites_maintenance_stale_sensor"

#: Seconds between two evaluations of the staleness sensor.
STALE_INTERVAL_S = 300

#: Materializations read per query at most (those of the few partitions of one time window).
_RECORD_LIMIT = 50
#: Width of the time windows the first tick walks back through, looking for the last success.
_WALK_WINDOW = dt.timedelta(days=31)
#: Seconds a staleness tick spends at most looking up the last success of the policies it has
#: no state for (a new deployment, new policies): the others wait for the next tick, so a tick
#: stays well within Dagster's 60 s limit on a sensor's evaluation however many policies it
#: meets at once.
LOOKUP_BUDGET_S = 20.0
#: Statuses of a run that will not change any more.
_FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
             dg.DagsterRunStatus.CANCELED)


def _hours(value: dt.timedelta) -> str:
    return f"{value.total_seconds() / 3600:g} h"


def _partition_keys_between(after: float, before: float) -> list[str]:
    """Keys of the daily partitions a current run could have materialized between ``after``
    and ``before`` (epoch seconds): those whose day ends in ``[after - lag, before]``."""
    newest = dt.datetime.fromtimestamp(before, dt.timezone.utc).date()
    oldest = (dt.datetime.fromtimestamp(after, dt.timezone.utc)
              - CURRENT_PARTITION_LAG).date() - dt.timedelta(1)
    return [(oldest + dt.timedelta(days=i)).isoformat() for i in range((newest - oldest).days + 1)]


def _current_success_between(instance: dg.DagsterInstance, asset_key: dg.AssetKey, after: float,
                             before: float) -> tuple[float | None, bool]:
    """The timestamp of the newest current-partition success materialized in ``(after,
    before]`` (epoch seconds), or ``None``; and whether that answer is final: ``False`` while
    a newer materialization of a current partition belongs to a run not finished yet, which
    may still end SUCCESS.

    Indexed queries on the asset's materializations, narrowed to the partitions a current run
    could have materialized in that window, newest first, plus one run lookup per candidate.
    """
    keys = _partition_keys_between(after, before)
    cursor = None
    settled = True
    while True:
        page = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=keys,
                                  after_timestamp=after, before_timestamp=before),
            limit=_RECORD_LIMIT, cursor=cursor)
        for record in page.records:  # newest first
            if record.timestamp > before or not is_current(record.partition_key,
                                                           record.timestamp):
                continue  # a backfill of an old day
            run = instance.get_run_record_by_id(record.run_id)
            if run is not None and run.dagster_run.status == dg.DagsterRunStatus.SUCCESS:
                return record.timestamp, settled
            if run is not None and run.dagster_run.status not in _FINISHED:
                settled = False
        if not page.has_more:
            return None, settled
        cursor = page.cursor


def latest_current_success(instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                           now: float, partitions: dg.DailyPartitionsDefinition = daily_partitions
                           ) -> tuple[float | None, bool]:
    """The timestamp (epoch seconds) of the newest current-partition success in the whole
    history before ``now``, however old, or ``None`` when there never was one; and whether the
    answer is final (see :func:`_current_success_between`).

    Walks back from ``now`` in windows of 31 days down to the first day of ``partitions`` (the
    policy's), stopping at the first window holding a success: at most one query per month
    since the policy's partitions start, whatever the number of runs.
    """
    first = partitions.time_window_for_partition_key(
        partitions.get_first_partition_key()).start.timestamp()
    before = now
    settled = True
    while before > first:
        after = before - _WALK_WINDOW.total_seconds()
        found, window_settled = _current_success_between(instance, asset_key, after, before)
        settled = settled and window_settled
        if found is not None:
            return found, settled
        before = after
    return None, settled


def _stale_cursor(state: dict) -> bool:
    return isinstance(state.get("policies"), dict)


def _stale_entry(entry) -> bool:
    """Whether ``entry`` is one policy's state as the staleness sensor writes it."""
    return (isinstance(entry, dict) and is_number(entry.get("since"))
            and all(entry.get(k) is None or is_number(entry[k])
                    for k in ("lastSuccess", "alertedAt", "seen")))


def build_stale_sensor(policies: Sequence[Policy] | None = None,
                       clock: Callable[[], float] = time.time,
                       name: str = STALE_SENSOR) -> dg.SensorDefinition:
    """The staleness sensor (``favorites_maintenance_stale_sensor``): every 300 s, for each
    policy, whether its cleanup asset has had a current success within the policy's
    ``stale_after`` (48 h unless set).

    Alerts once per episode per policy when no current success happened for ``stale_after``,
    and sends a resolution message when one returns, each naming the policy's asset. A
    policy's clock starts at its last current success in the instance's history, however old;
    a policy without state in the cursor (a new deployment, a new policy, a reset or renamed
    sensor, a migrated instance), or a cursor it cannot read (set by hand, left by an older
    sensor of the same name), looks it up, and only when there never was one does the clock
    start at that tick, so a fresh deployment alerts only after ``stale_after``.

    A tick reads the newest materialization of every watched asset in one storage call
    (``get_asset_records``) and queries a policy's history only when its asset was
    materialized since the last tick that settled it (when that newest materialization is a
    current success, one run lookup): the steady cost is one call, whatever the number of
    policies. The lookups of policies without state stop after :data:`LOOKUP_BUDGET_S` (one at
    least per tick); the rest are looked up by the next ticks, and alert only once looked up.

    Args:
        policies: the policies watched (default: those of the code location evaluating the
            sensor,
            :func:`~favorites_maintenance.pipeline.sensor_support.location_policies`).
        clock: epoch seconds now; tests pass a fixed clock.
        name: the sensor's name.

    The cursor is JSON ``{"policies": {<policy name>: {"since": epoch_s, "lastSuccess":
    epoch_s | null, "alertedAt": epoch_s | null, "seen": storage id | null}}}``: ``since`` is
    the instant staleness is measured from, ``seen`` the newest materialization of the asset
    already judged.
    """

    @dg.sensor(
        name=name,
        minimum_interval_seconds=STALE_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=("Alerts when a retention policy's cleanup asset has had no successful "
                     "current run for its stale_after (48 h unless set), once per episode, "
                     "and when one succeeds again; one sensor for every policy."),
    )
    def stale_sensor(context: dg.SensorEvaluationContext,
                     favorites_maintenance_alerts: AlertSink):
        alerts = favorites_maintenance_alerts
        now = clock()
        watched = list(policies) if policies is not None else location_policies(context)
        cursor = read_cursor(context, _stale_cursor)
        previous = cursor["policies"] if cursor is not None else {}
        keys = {p.name: dg.AssetKey(list(p.asset_key_path)) for p in watched}
        newest = {record.asset_entry.asset_key: record.asset_entry.last_materialization_record
                  for record in context.instance.get_asset_records(list(keys.values()))}
        states: dict[str, dict] = {}
        outcomes: dict[str, list[str]] = defaultdict(list)
        lookups_until = time.monotonic() + LOOKUP_BUDGET_S
        looked_up = 0
        for policy in watched:
            entry = previous.get(policy.name)
            if entry is not None and not _stale_entry(entry):
                context.log.warning(f"cursor entry of {policy.name} is not one this sensor "
                                    "writes; treated as none, as on a fresh deployment")
                entry = None
            if entry is None:
                if looked_up and time.monotonic() > lookups_until:
                    outcomes["last success not looked up yet"].append(policy.name)
                    continue  # no state: the next tick looks it up
                looked_up += 1
            states[policy.name], outcome = _judge_staleness(
                context, alerts, policy, keys[policy.name], newest.get(keys[policy.name]),
                entry, now)
            outcomes[outcome].append(policy.name)
        context.update_cursor(json.dumps({"policies": states}))
        return dg.SkipReason(summary(outcomes))

    return stale_sensor


def _judge_staleness(context: dg.SensorEvaluationContext, alerts: AlertSink, policy: Policy,
                     asset_key: dg.AssetKey, newest, entry: dict | None,
                     now: float) -> tuple[dict, str]:
    """One policy's turn in a staleness tick: ``(its new state, the outcome)``, after sending
    the alert or the resolution it owes. ``newest`` is the asset's newest materialization
    record (any partition), ``None`` when it never had one; ``entry`` the policy's state from
    the cursor, ``None`` when there is none."""
    stale_after = policy.settings.stale_after
    cleanup = policy.cleanup
    seen = entry.get("seen") if entry is not None else None
    # With state, a tick looks within the threshold; without, through the whole history.
    window_start = now - stale_after.total_seconds() if entry is not None else float("-inf")
    if newest is None:
        recent, settled = None, True
    elif entry is not None and newest.storage_id == seen:
        recent, settled = None, True  # nothing materialized since the last judged success
    elif _is_current_success(context.instance, newest, window_start, now):
        recent, settled = newest.timestamp, True  # the newest of all: no older one matters
    elif entry is not None:
        recent, settled = _current_success_between(context.instance, asset_key, window_start,
                                                    now)
    else:
        # No current success after the newest materialization: walk back from it.
        recent, settled = latest_current_success(context.instance, asset_key,
                                                 min(now, newest.timestamp),
                                                 policy_partitions(policy))
    if entry is not None:
        since, last, alerted_at = entry["since"], entry.get("lastSuccess"), entry.get("alertedAt")
    else:
        alerted_at, last = None, recent
        since = recent if recent is not None else now
    if newest is not None and settled and newest.timestamp <= now:
        seen = newest.storage_id
    succeeded_again = recent is not None and (last is None or recent > last)
    if succeeded_again:
        since = last = recent
    stale = now - since > stale_after.total_seconds()
    if stale and alerted_at is None:
        found = (f"last successful run at {utc_instant(last)}" if last is not None
                 else f"none since watching began at {utc_instant(since)}")
        alerts.send(f"{cleanup}: no successful run for more than "
                    f"{_hours(stale_after)} (checked at {utc_instant(now)}; {found}). "
                    f"See the runbook in docs/runbook.md.", log=context.log)
        alerted_at = now
        outcome = "alerted"
    elif not stale and alerted_at is not None:
        # No success but no longer stale: the threshold was raised since the alert.
        why = (f"a run succeeded at {utc_instant(last)}" if succeeded_again
               else f"within the threshold of {_hours(stale_after)} again")
        alerts.send(f"{cleanup}: resolved, {why}.", log=context.log, level=20)
        alerted_at = None
        outcome = "resolved"
    else:
        outcome = "stale, already alerted" if stale else "fresh"
    return {"since": since, "lastSuccess": last, "alertedAt": alerted_at, "seen": seen}, outcome


def _is_current_success(instance: dg.DagsterInstance, record, after: float,
                        before: float) -> bool:
    """Whether materialization ``record`` (an event log record), in ``(after, before]`` (epoch
    seconds), is of a current partition and its run ended SUCCESS."""
    if not after < record.timestamp <= before or not is_current(record.partition_key,
                                                                 record.timestamp):
        return False
    run = instance.get_run_record_by_id(record.run_id) if record.run_id else None
    return run is not None and run.dagster_run.status == dg.DagsterRunStatus.SUCCESS
