"""Alerts of a policy: no successful cleanup for too long, a failed cleanup run, a failed
schedule tick. Each policy has its three sensors, named after it (``<name>_cleanup_stale_sensor``,
``<name>_cleanup_failure_sensor``, ``<name>_cleanup_tick_failure_sensor``).

Both send through the ``favorites_maintenance_alerts`` resource (a sensor's parameter is named
after its resource key; :class:`~favorites_maintenance.pipeline.resources.AlertSink`):
the log always, a Slack-compatible webhook when ``FAVORITES_ALERT_WEBHOOK_URL`` is set.

What counts as a success for the staleness sensor is a materialization of the cleanup asset
(the purge and the backlog measure both finished) of a *current* partition: one whose day ended
at most :data:`~favorites_maintenance.pipeline.partitions.CURRENT_PARTITION_LAG` (two days)
before the
materialization. A backfill of an old day cleans
nothing today's run would not, so it does not reset the clock; a CANCELED or FAILED run records
no materialization, and the run of the chosen materialization must have ended SUCCESS.
"""


import datetime as dt
import json
import re
import time
from collections.abc import Callable

import dagster as dg
from dagster._core.scheduler.instigation import InstigatorType, TickStatus

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.partitions import (
    CURRENT_PARTITION_LAG,
    daily_partitions,
    is_current,
    policy_partitions,
)
from favorites_maintenance.pipeline.resources import AlertSink

#: Seconds between two evaluations of the tick-failure sensor: a failed tick is alerted at most
#: this long (plus the daemon's own loop) after it.
TICK_FAILURE_INTERVAL_S = 60
#: Characters of a failed tick's error kept in the alert.
_ERROR_CHARS = 600

#: Materializations read per query at most (those of the few partitions of one time window).
_RECORD_LIMIT = 50
#: Width of the time windows the first tick walks back through, looking for the last success.
_WALK_WINDOW = dt.timedelta(days=31)


def _hours(value: dt.timedelta) -> str:
    return f"{value.total_seconds() / 3600:g} h"


def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def _partition_keys_between(after: float, before: float) -> list[str]:
    """Keys of the daily partitions a current run could have materialized between ``after``
    and ``before`` (epoch seconds): those whose day ends in ``[after - lag, before]``."""
    newest = dt.datetime.fromtimestamp(before, dt.timezone.utc).date()
    oldest = (dt.datetime.fromtimestamp(after, dt.timezone.utc)
              - CURRENT_PARTITION_LAG).date() - dt.timedelta(1)
    return [(oldest + dt.timedelta(days=i)).isoformat() for i in range((newest - oldest).days + 1)]


def _current_success_between(instance: dg.DagsterInstance, asset_key: dg.AssetKey, after: float,
                             before: float) -> float | None:
    """Timestamp of the newest current-partition success materialized in ``(after, before]``
    (epoch seconds), or ``None``.

    Indexed queries on the asset's materializations, narrowed to the partitions a current run
    could have materialized in that window, newest first, plus one run lookup per candidate.
    """
    keys = _partition_keys_between(after, before)
    cursor = None
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
                return record.timestamp
        if not page.has_more:
            return None
        cursor = page.cursor


def last_current_success(instance: dg.DagsterInstance, asset_key: dg.AssetKey, now: float,
                         stale_after: dt.timedelta) -> float | None:
    """Timestamp (epoch seconds) of the newest current-partition success of ``asset_key``
    within ``stale_after`` before ``now``, or ``None``: what every tick reads, one query."""
    return _current_success_between(instance, asset_key, now - stale_after.total_seconds(), now)


def latest_current_success(instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                           now: float, partitions: dg.DailyPartitionsDefinition = daily_partitions
                           ) -> float | None:
    """Timestamp (epoch seconds) of the newest current-partition success in the whole history
    before ``now``, however old, or ``None`` when there never was one.

    Walks back from ``now`` in windows of 31 days down to the first day of ``partitions`` (the
    policy's), stopping at the first window holding a success: at most one query per month
    since the policy's partitions start, whatever the number of runs.
    """
    first = partitions.time_window_for_partition_key(
        partitions.get_first_partition_key()).start.timestamp()
    before = now
    while before > first:
        after = before - _WALK_WINDOW.total_seconds()
        found = _current_success_between(instance, asset_key, after, before)
        if found is not None:
            return found
        before = after
    return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _read_cursor(context: dg.SensorEvaluationContext,
                 valid: Callable[[dict], bool]) -> dict | None:
    """The sensor's cursor as the JSON object it writes (``valid`` says whether an object is
    one), or ``None`` when there is none or it is not one: a cursor set by hand (``dagster
    sensor cursor --set``) or left by an older sensor of the same name. A cursor that cannot be
    read is treated as none (the lookup of a fresh deployment), with a warning in the tick's
    log, so the tick succeeds, writes its own cursor and sends the alerts it owes instead of
    failing on every tick."""
    if not context.cursor:
        return None
    try:
        state = json.loads(context.cursor)
    except ValueError:
        state = None
    if isinstance(state, dict) and valid(state):
        return state
    shown = context.cursor if len(context.cursor) <= 80 else context.cursor[:77] + "..."
    context.log.warning(f"cursor {shown!r} is not one this sensor writes; treated as none, "
                        "as on a fresh deployment")
    return None


def _stale_cursor(state: dict) -> bool:
    # "firstSeen": cursors written before the clock remembered the last success.
    return ((_number(state.get("since")) or _number(state.get("firstSeen")))
            and all(state.get(k) is None or _number(state[k])
                    for k in ("lastSuccess", "alertedAt")))


def _tick_failure_cursor(state: dict) -> bool:
    return "failingSince" in state and (state["failingSince"] is None
                                        or _number(state["failingSince"]))


def build_stale_sensor(policy: Policy, stale_after: dt.timedelta | None = None,
                       clock: Callable[[], float] = time.time) -> dg.SensorDefinition:
    """The staleness sensor of ``policy`` (``<name>_cleanup_stale_sensor``) for a threshold of
    ``stale_after``.

    Alerts once per episode when no current success happened for ``stale_after``, and sends a
    resolution message when one returns. The clock starts at the last current success in the
    instance's history, however old; a tick without a cursor (a new deployment, a reset or
    renamed sensor, a migrated instance), or with one it cannot read (set by hand, left by an
    older sensor of the same name), looks it up, and only when there never was one does the
    clock start at that tick, so a fresh deployment alerts only after ``stale_after``.

    Args:
        policy: whose cleanup asset is watched.
        stale_after: threshold (default: the policy's ``stale_after``, 48 h unless set).
        clock: epoch seconds now; tests pass a fixed clock.

    The cursor is JSON ``{"since": epoch_s, "lastSuccess": epoch_s | null,
    "alertedAt": epoch_s | null}``: ``since`` is the instant staleness is measured from.
    """

    stale_after = stale_after or policy.settings.stale_after
    asset_key = dg.AssetKey(list(policy.asset_key_path))
    cleanup = policy.cleanup

    @dg.sensor(
        name=policy.stale_sensor_name,
        minimum_interval_seconds=300,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(f"Alerts when {cleanup} has had no successful current run "
                     f"for {_hours(stale_after)}."),
    )
    def stale_sensor(context: dg.SensorEvaluationContext,
                     favorites_maintenance_alerts: AlertSink):
        alerts = favorites_maintenance_alerts
        now = clock()
        state = _read_cursor(context, _stale_cursor)
        if state is not None:
            since = state["since"] if _number(state.get("since")) else state["firstSeen"]
            last = state.get("lastSuccess")
            alerted_at = state.get("alertedAt")
            recent = last_current_success(context.instance, asset_key, now, stale_after)
        else:
            alerted_at = None
            recent = latest_current_success(context.instance, asset_key, now,
                                            policy_partitions(policy))
            last = recent
            since = recent if recent is not None else now
        succeeded_again = recent is not None and (last is None or recent > last)
        if succeeded_again:
            since = last = recent
        stale = now - since > stale_after.total_seconds()
        if stale and alerted_at is None:
            seen = (f"last successful run at {_utc(last)}" if last is not None
                    else f"none since watching began at {_utc(since)}")
            alerts.send(f"{cleanup}: no successful run for more than "
                        f"{_hours(stale_after)} (checked at {_utc(now)}; {seen}). "
                        f"See the runbook in docs/runbook.md.", log=context.log)
            alerted_at = now
            outcome = "alerted"
        elif not stale and alerted_at is not None:
            # No success but no longer stale: the threshold was raised since the alert.
            why = (f"a run succeeded at {_utc(last)}" if succeeded_again
                   else f"within the threshold of {_hours(stale_after)} again")
            alerts.send(f"{cleanup}: resolved, {why}.", log=context.log,
                        level=20)
            alerted_at = None
            outcome = "resolved"
        else:
            outcome = "stale, already alerted" if stale else "fresh"
        context.update_cursor(json.dumps({"since": since, "lastSuccess": last,
                                          "alertedAt": alerted_at}))
        return dg.SkipReason(outcome)

    return stale_sensor


def build_failure_sensor(policy: Policy) -> dg.SensorDefinition:
    """The run-failure sensor of ``policy`` (``<name>_cleanup_failure_sensor``): alerts when a
    run that materializes the policy's cleanup asset fails, whatever launched it.

    It watches every job of the code location and keeps the runs whose job is the policy's or
    whose asset selection holds its asset: runs launched or backfilled from the UI run as
    Dagster's implicit asset job, not as ``<name>_cleanup_job``. Another policy's run is
    answered with a skip, so this sensor does not act on it: Dagster records "acted on" on a
    run's page only for the runs a run-status sensor handled. (A skip ends the tick: each
    other policy's failure delays this sensor's next one by a tick.)

    The alert names the policy, the asset, the partition, what launched the run and why it
    failed (:func:`failure_alert`).
    """
    asset_key = dg.AssetKey(list(policy.asset_key_path))

    @dg.run_failure_sensor(
        name=policy.failure_sensor_name,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Alerts when a {policy.name} cleanup run fails (scheduled, launched or "
                    "backfilled).",
    )
    def failure_sensor(context: dg.RunFailureSensorContext,
                       favorites_maintenance_alerts: AlertSink):
        """Send the failed run's policy, asset, partition, cause and page through the sink."""
        alerts = favorites_maintenance_alerts
        run = context.dagster_run
        if run.job_name != policy.job_name and asset_key not in (run.asset_selection or ()):
            return dg.SkipReason(f"run {run.run_id} is not a {policy.name} cleanup run")
        alerts.send(failure_alert(context.instance, run, policy, alerts.webserver_base_url,
                                  fallback=context.failure_event.message),
                    log=context.log)
        return None  # handled: Dagster records that this sensor acted on the run

    return failure_sensor


def failure_alert(instance: dg.DagsterInstance, run: dg.DagsterRun, policy: Policy,
                  webserver_base_url: str | None = None, fallback: str | None = None) -> str:
    """The text of a failed cleanup run's alert, one line: the policy, its asset, the
    partition, what launched the run, its id, why it failed (:func:`failure_cause`) and, when
    the webserver's base URL is configured, the run's page.

    Example: ``guest_carts cleanup failed: asset carts/guest_carts_cleanup, partition
    2026-06-15, launched from the UI, run 6f0c...: TableShapeError: carts.guest_carts has no
    column 'touched_at'; database=CARTS_DATABASE_URL. https://dagster.example.internal/runs/
    6f0c...``
    """
    partition = run.tags.get("dagster/partition", "none")
    cause = failure_cause(instance, run.run_id) or fallback or "no error recorded"
    text = (f"{policy.name} cleanup failed: asset {'/'.join(policy.asset_key_path)}, partition "
            f"{partition}, {_launched_by(run)}, run {run.run_id}: {cause.rstrip('.')}.")
    if webserver_base_url:
        text += f" {webserver_base_url.rstrip('/')}/runs/{run.run_id}"
    return text


def _launched_by(run: dg.DagsterRun) -> str:
    """What started ``run``, from Dagster's tags."""
    if run.tags.get("dagster/backfill"):
        return f"backfill {run.tags['dagster/backfill']}"
    if run.tags.get("dagster/schedule_name"):
        return f"scheduled by {run.tags['dagster/schedule_name']}"
    if run.tags.get("dagster/sensor_name"):
        return f"requested by {run.tags['dagster/sensor_name']}"
    if run.parent_run_id:
        return f"re-execution of run {run.parent_run_id}"
    return "launched from the UI or the API"


#: How the purge and the backlog measure word a failure in the run's log.
_RUN_FAILED = "run failed: "
#: The database field of a ``run failed`` line: the variable of the database that failed, or
#: ``dagster_storage``.
_DATABASE_FIELD = re.compile(r" database=(\S+)")
#: The note every error of a policy's database carries (see
#: :func:`~favorites_maintenance.pipeline.resources.name_database`).
_DATABASE_NOTE = re.compile(r"^policy \S+: its database is (\S+)$", re.M)


def failure_cause(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """Why run ``run_id`` failed, worded as its log words it, on one line: the error of the
    op's own ``run failed`` line (the error's type and its privacy-safe description: a
    database error's kind, class and SQLSTATE, never its DETAIL, which may quote row values),
    else the first failed step's innermost error, its type and the first line of its message;
    then the database it came from, as the run's log names it (``; database=<variable>``),
    when the run recorded one. ``None`` when the run recorded neither error.

    Example: ``ConnectError: could not open a session on the database (check its URL and the
    server): connection_lost ...; database=CARTS_DATABASE_URL``
    """
    logged = step_error = database = step_database = None
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None:
            if entry.user_message.startswith(_RUN_FAILED) and " error=" in entry.user_message:
                fields, error = entry.user_message.split(" error=", 1)
                logged = error.strip()  # the last attempt's
                named = _DATABASE_FIELD.search(fields)
                database = named.group(1) if named else None
        elif event.event_type == dg.DagsterEventType.STEP_FAILURE and step_error is None:
            step_error = _innermost(event.event_specific_data.error)
            step_database = _noted_database(event.event_specific_data.error)
    cause, database = (logged, database) if logged else (step_error, step_database)
    if cause is None or database is None:
        return cause
    return f"{cause.rstrip('.')}; database={database}"


def _noted_database(error) -> str | None:
    """The variable named by the database note of a serialized error or of one of its
    causes, or ``None``."""
    while error is not None:
        noted = _DATABASE_NOTE.search(error.message)
        if noted:
            return noted.group(1)
        error = error.cause
    return None


def _innermost(error) -> str | None:
    """The innermost cause of a serialized error: ``Type: first line of its message``."""
    if error is None:
        return None
    while error.cause is not None:
        error = error.cause
    first = (error.message.strip().splitlines() or [""])[0]
    name = error.cls_name or "Error"
    # The message starts with the exception's qualified name: keep its class name alone.
    first = first.split(": ", 1)[1] if first.split(": ", 1)[0].endswith(name) else first
    return f"{name}: {first}"


def _schedule_state(context: dg.SensorEvaluationContext, schedule_name: str):
    """The stored state of schedule ``schedule_name`` of this code location, or ``None`` before
    the scheduler first saw it."""
    location = context.code_location_origin.location_name if context.code_location_origin else None
    for state in context.instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE):
        origin = state.origin.repository_origin.code_location_origin
        if state.instigator_name == schedule_name and location in (None, origin.location_name):
            return state
    return None


def _error_summary(tick) -> str:
    """The failed tick's error, on one line and shortened; Dagster's config errors name the
    variable at fault, never its value."""
    if tick.error is None:
        return "no error recorded"
    text = " ".join(tick.error.message.split())
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS - 3] + "..."


def build_tick_failure_sensor(policy: Policy) -> dg.SensorDefinition:
    """The tick-failure sensor of ``policy`` (``<name>_cleanup_tick_failure_sensor``), which
    watches the policy's schedule, ``<name>_cleanup_schedule``."""
    schedule = policy.schedule_name

    @dg.sensor(
        name=policy.tick_failure_sensor_name,
        minimum_interval_seconds=TICK_FAILURE_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(f"Alerts when a tick of {schedule} fails (no run is created, so the "
                     "run-failure sensor never fires), and when ticks succeed again."),
    )
    def tick_failure_sensor(context: dg.SensorEvaluationContext,
                            favorites_maintenance_alerts: AlertSink):
        """Alert once per episode of failed schedule ticks, with a resolution message when a tick
        succeeds (or skips) again.

        Reads the newest finished tick of the schedule from the instance: one indexed query, however
        long the tick history. The cursor is JSON ``{"failingSince": epoch_s | null}``, the first
        failed tick of the episode already alerted; a cursor it cannot read counts as none.
        """
        alerts = favorites_maintenance_alerts
        state = _schedule_state(context, schedule)
        ticks = [] if state is None else context.instance.get_ticks(
            state.instigator_origin_id, state.selector_id, limit=1,
            statuses=[TickStatus.SUCCESS, TickStatus.SKIPPED, TickStatus.FAILURE])
        if not ticks:
            return dg.SkipReason(f"{schedule} has no finished tick yet")
        [tick] = ticks
        state = _read_cursor(context, _tick_failure_cursor)
        failing_since = state["failingSince"] if state is not None else None
        if tick.status == TickStatus.FAILURE and failing_since is None:
            alerts.send(f"{schedule}: the tick at {_utc(tick.timestamp)} failed and started no "
                        f"cleanup run: {_error_summary(tick)}", log=context.log)
            failing_since, outcome = tick.timestamp, "alerted"
        elif tick.status == TickStatus.FAILURE:
            outcome = "failing, already alerted"
        elif failing_since is not None:
            alerts.send(f"{schedule}: resolved, the tick at {_utc(tick.timestamp)} succeeded "
                        f"(ticks failed from {_utc(failing_since)}).", log=context.log, level=20)
            failing_since, outcome = None, "resolved"
        else:
            outcome = "ticks succeed"
        context.update_cursor(json.dumps({"failingSince": failing_since}))
        return dg.SkipReason(outcome)

    return tick_failure_sensor

