"""Alerts of the retention policies: no successful cleanup for too long, a failed cleanup run, a
failed schedule tick. Three sensors serve every policy of the code location, whatever their
number (:func:`policy_sensors`): ``favorites_maintenance_stale_sensor``,
``favorites_maintenance_failure_sensor`` and ``favorites_maintenance_tick_failure_sensor``. Each
alert names its policy; a policy's alert settings (``stale_after``) stay in its YAML.

They send through the ``favorites_maintenance_alerts`` resource (a sensor's parameter is named
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
import functools
import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

import dagster as dg

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.dagster_internals import InstigatorType, TickStatus
from favorites_maintenance.pipeline.partitions import (
    CURRENT_PARTITION_LAG,
    daily_partitions,
    is_current,
    policy_partitions,
)
from favorites_maintenance.pipeline.resources import AlertSink

#: The sensors' names, one of each for the whole code location: the package's name first, so a
#: host project's own sensors never take them.
STALE_SENSOR = "favorites_maintenance_stale_sensor"
FAILURE_SENSOR = "favorites_maintenance_failure_sensor"
TICK_FAILURE_SENSOR = "favorites_maintenance_tick_failure_sensor"

#: Seconds between two evaluations of the staleness sensor.
STALE_INTERVAL_S = 300
#: Seconds between two evaluations of the tick-failure sensor: a failed tick is alerted at most
#: this long (plus the daemon's own loop) after it.
TICK_FAILURE_INTERVAL_S = 60
#: Characters of a failed tick's error kept in the alert.
_ERROR_CHARS = 600

#: Materializations read per query at most (those of the few partitions of one time window).
_RECORD_LIMIT = 50
#: Width of the time windows the first tick walks back through, looking for the last success.
_WALK_WINDOW = dt.timedelta(days=31)
#: Seconds a staleness tick spends at most looking up the last success of the policies it has
#: no state for (a new deployment, new policies): the others wait for the next tick, so a tick
#: stays well within Dagster's 60 s limit on a sensor's evaluation however many policies it
#: meets at once.
LOOKUP_BUDGET_S = 20.0
#: Policies a tick's summary names per outcome; the others are counted.
_NAMED = 10
#: Statuses of a run that will not change any more.
_FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE,
             dg.DagsterRunStatus.CANCELED)
#: Statuses of a finished schedule tick.
_TICK_FINISHED = (TickStatus.SUCCESS, TickStatus.SKIPPED, TickStatus.FAILURE)

#: Policy name -> the policy, for every policy whose definitions this process built
#: (:func:`policy_sensors`); a sensor keeps those its code location holds
#: (:func:`location_policies`).
_POLICIES: dict[str, Policy] = {}


def policy_sensors(policy: Policy) -> list[dg.SensorDefinition]:
    """The sensors serving ``policy``: the same three objects for every policy of the process,
    which a repository holds once however many policies return them (a defs folder, which
    copies each component's definitions, takes them from one policy: see
    :meth:`~favorites_maintenance.components.retention_policy.RetentionPolicy.build_defs`).
    Records ``policy`` so that the sensors find it (:func:`location_policies`); a policy built
    again (a reloaded code location) replaces the one of its name."""
    _POLICIES[policy.name] = policy
    return [_location_stale_sensor(), _location_failure_sensor(),
            _location_tick_failure_sensor()]


def with_sensors(defs: dg.Definitions, sensors: Sequence[dg.SensorDefinition]
                 ) -> dg.Definitions:
    """``defs`` with ``sensors`` in place of its own; every other field (assets, checks, jobs,
    schedules, resources, executor, loggers, metadata, component tree) as it was."""
    return dg.Definitions(
        assets=defs.assets, asset_checks=defs.asset_checks, jobs=defs.jobs,
        schedules=defs.schedules, sensors=sensors, resources=defs.resources,
        executor=defs.executor, loggers=defs.loggers, metadata=defs.metadata,
        component_tree=defs.component_tree)


def location_policies(context) -> list[Policy]:
    """The policies of the code location evaluating a sensor, by name: those whose job
    (``<name>_cleanup_job``) the location's repository holds, among the policies this process
    built (:func:`policy_sensors`). Without a repository on the context (a sensor called
    directly, in a test) every policy this process built.

    Args:
        context: a sensor's evaluation context, or a run-status sensor's.
    """
    policies = [_POLICIES[name] for name in sorted(_POLICIES)]
    repository = context.repository_def
    if repository is None:
        return policies
    return [p for p in policies if repository.has_job(p.job_name)]


def _summary(outcomes: dict[str, list[str]]) -> str:
    """A tick's skip message: each outcome with the policies it applies to, ``fresh:
    guest_carts, guest_favorites``; past :data:`_NAMED` names, the rest counted."""
    parts = []
    for outcome, names in outcomes.items():
        shown = ", ".join(names[:_NAMED])
        if len(names) > _NAMED:
            shown += f" and {len(names) - _NAMED} more"
        parts.append(f"{outcome}: {shown}")
    return "; ".join(parts) or "no policy in this code location"


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


def _number(value) -> bool:
    # NaN or Infinity (JSON that Python reads) would compare as no time at all.
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


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
    return isinstance(state.get("policies"), dict)


def _stale_entry(entry) -> bool:
    """Whether ``entry`` is one policy's state as the staleness sensor writes it."""
    return (isinstance(entry, dict) and _number(entry.get("since"))
            and all(entry.get(k) is None or _number(entry[k])
                    for k in ("lastSuccess", "alertedAt", "seen")))


def _tick_failure_cursor(state: dict) -> bool:
    failing = state.get("failingSince")
    return isinstance(failing, dict) and all(_number(v) for v in failing.values())


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
            sensor, :func:`location_policies`).
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
        cursor = _read_cursor(context, _stale_cursor)
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
        return dg.SkipReason(_summary(outcomes))

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
        found = (f"last successful run at {_utc(last)}" if last is not None
                 else f"none since watching began at {_utc(since)}")
        alerts.send(f"{cleanup}: no successful run for more than "
                    f"{_hours(stale_after)} (checked at {_utc(now)}; {found}). "
                    f"See the runbook in docs/runbook.md.", log=context.log)
        alerted_at = now
        outcome = "alerted"
    elif not stale and alerted_at is not None:
        # No success but no longer stale: the threshold was raised since the alert.
        why = (f"a run succeeded at {_utc(last)}" if succeeded_again
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


def build_failure_sensor(policies: Sequence[Policy] | None = None,
                         name: str = FAILURE_SENSOR) -> dg.SensorDefinition:
    """The run-failure sensor (``favorites_maintenance_failure_sensor``): alerts when a run
    that materializes a policy's cleanup asset fails, whatever launched it, one alert per
    policy the run was for.

    It watches every job of the code location and keeps the runs whose job is a policy's or
    whose asset selection holds a policy's asset: runs launched or backfilled from the UI run
    as Dagster's implicit asset job, not as ``<name>_cleanup_job``. Any other run is answered
    with a skip, so this sensor does not act on it: Dagster records "acted on" on a run's page
    only for the runs a run-status sensor handled. (A skip ends the tick: each other job's
    failure delays this sensor's next one by a tick.)

    The alert names the policy, the asset, the partition, what launched the run and why it
    failed (:func:`failure_alert`).

    Args:
        policies: the policies watched (default: those of the code location evaluating the
            sensor, :func:`location_policies`).
        name: the sensor's name.
    """

    @dg.run_failure_sensor(
        name=name,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Alerts when a retention policy's cleanup run fails (scheduled, launched "
                    "or backfilled), naming the policy; one sensor for every policy.",
    )
    def failure_sensor(context: dg.RunFailureSensorContext,
                       favorites_maintenance_alerts: AlertSink):
        """Send each of the failed run's policies, its asset, partition, cause and page
        through the sink."""
        alerts = favorites_maintenance_alerts
        run = context.dagster_run
        selected = set(run.asset_selection or ())
        watched = list(policies) if policies is not None else location_policies(context)
        mine = [p for p in watched if run.job_name == p.job_name
                or dg.AssetKey(list(p.asset_key_path)) in selected]
        if not mine:
            return dg.SkipReason(f"run {run.run_id} is not a cleanup run of a policy")
        for policy in mine:
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


def _schedule_states(context: dg.SensorEvaluationContext, names: set[str]) -> dict:
    """Schedule name -> its stored state, for the schedules ``names`` of this code location
    the scheduler has seen (one storage call)."""
    location = context.code_location_origin.location_name if context.code_location_origin else None
    found = {}
    for state in context.instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE):
        origin = state.origin.repository_origin.code_location_origin
        if state.instigator_name in names and location in (None, origin.location_name):
            found[state.instigator_name] = state
    return found


def _newest_finished_ticks(instance: dg.DagsterInstance, states: dict) -> dict:
    """Schedule name -> its newest finished tick, for the schedules of ``states`` that have
    one: the two newest ticks of every schedule in one storage call, then one indexed query
    for a schedule whose two newest ticks are both still in progress."""
    by_selector = {state.selector_id: name for name, state in states.items()}
    newest = instance.get_batch_ticks(list(by_selector), limit=2) if by_selector else {}
    found = {}
    for selector_id, name in by_selector.items():
        ticks = [t for t in newest.get(selector_id, ()) if t.status in _TICK_FINISHED]
        if not ticks and len(newest.get(selector_id, ())) == 2:
            state = states[name]
            ticks = instance.get_ticks(state.instigator_origin_id, selector_id, limit=1,
                                       statuses=list(_TICK_FINISHED))
        if ticks:
            found[name] = max(ticks, key=lambda t: t.timestamp)
    return found


def _error_summary(tick) -> str:
    """The failed tick's error, on one line and shortened; Dagster's config errors name the
    variable at fault, never its value."""
    if tick.error is None:
        return "no error recorded"
    text = " ".join(tick.error.message.split())
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS - 3] + "..."


def build_tick_failure_sensor(policies: Sequence[Policy] | None = None,
                              name: str = TICK_FAILURE_SENSOR) -> dg.SensorDefinition:
    """The tick-failure sensor (``favorites_maintenance_tick_failure_sensor``), which watches
    every policy's schedule, ``<name>_cleanup_schedule``.

    Args:
        policies: the policies watched (default: those of the code location evaluating the
            sensor, :func:`location_policies`).
        name: the sensor's name.
    """

    @dg.sensor(
        name=name,
        minimum_interval_seconds=TICK_FAILURE_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=("Alerts when a tick of a retention policy's schedule fails (no run is "
                     "created, so the run-failure sensor never fires), and when ticks succeed "
                     "again; one sensor for every policy."),
    )
    def tick_failure_sensor(context: dg.SensorEvaluationContext,
                            favorites_maintenance_alerts: AlertSink):
        """Alert once per episode of failed ticks of a policy's schedule, with a resolution
        message when a tick succeeds (or skips) again.

        Reads the newest finished tick of every schedule from the instance in one storage
        call, however long the tick history. The cursor is JSON ``{"failingSince": {<policy
        name>: epoch_s}}``, for each policy in an episode the first failed tick, already
        alerted; a cursor it cannot read counts as none.
        """
        alerts = favorites_maintenance_alerts
        watched = list(policies) if policies is not None else location_policies(context)
        states = _schedule_states(context, {p.schedule_name for p in watched})
        newest = _newest_finished_ticks(context.instance, states)
        cursor = _read_cursor(context, _tick_failure_cursor)
        previous = cursor["failingSince"] if cursor is not None else {}
        failing: dict[str, float] = {}
        outcomes: dict[str, list[str]] = defaultdict(list)
        for policy in watched:
            schedule = policy.schedule_name
            tick = newest.get(schedule)
            failing_since = previous.get(policy.name)
            if tick is None:
                outcome = "no finished tick yet"
            elif tick.status == TickStatus.FAILURE and failing_since is None:
                alerts.send(f"{schedule}: the tick at {_utc(tick.timestamp)} failed and started "
                            f"no cleanup run: {_error_summary(tick)}", log=context.log)
                failing_since, outcome = tick.timestamp, "alerted"
            elif tick.status == TickStatus.FAILURE:
                outcome = "failing, already alerted"
            elif failing_since is not None:
                alerts.send(f"{schedule}: resolved, the tick at {_utc(tick.timestamp)} "
                            f"succeeded (ticks failed from {_utc(failing_since)}).",
                            log=context.log, level=20)
                failing_since, outcome = None, "resolved"
            else:
                outcome = "ticks succeed"
            if failing_since is not None:
                failing[policy.name] = failing_since
            outcomes[outcome].append(policy.name)
        context.update_cursor(json.dumps({"failingSince": failing}))
        return dg.SkipReason(_summary(outcomes))

    return tick_failure_sensor


@functools.cache
def _location_stale_sensor() -> dg.SensorDefinition:
    return build_stale_sensor()


@functools.cache
def _location_failure_sensor() -> dg.SensorDefinition:
    return build_failure_sensor()


@functools.cache
def _location_tick_failure_sensor() -> dg.SensorDefinition:
    return build_tick_failure_sensor()
