"""The tick-failure sensor: alerts when a retention policy's schedule tick fails (its run never
launched), and when its ticks succeed again."""

import json
from collections import defaultdict
from collections.abc import Sequence

import dagster as dg

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.dagster_internals import InstigatorType, TickStatus
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
TICK_FAILURE_SENSOR = "favorites_maintenance_tick_failure_sensor"

#: Seconds between two evaluations of the tick-failure sensor: a failed tick is alerted at most
#: this long (plus the daemon's own loop) after it.
TICK_FAILURE_INTERVAL_S = 60
#: Characters of a failed tick's error kept in the alert.
_ERROR_CHARS = 600
#: Statuses of a finished schedule tick.
_TICK_FINISHED = (TickStatus.SUCCESS, TickStatus.SKIPPED, TickStatus.FAILURE)


def _tick_failure_cursor(state: dict) -> bool:
    failing = state.get("failingSince")
    return isinstance(failing, dict) and all(is_number(v) for v in failing.values())


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
            sensor,
            :func:`~favorites_maintenance.pipeline.sensor_support.location_policies`).
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
        cursor = read_cursor(context, _tick_failure_cursor)
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
                alerts.send(f"{schedule}: the tick at {utc_instant(tick.timestamp)} failed and "
                            f"started no cleanup run: {_error_summary(tick)}", log=context.log)
                failing_since, outcome = tick.timestamp, "alerted"
            elif tick.status == TickStatus.FAILURE:
                outcome = "failing, already alerted"
            elif failing_since is not None:
                alerts.send(f"{schedule}: resolved, the tick at {utc_instant(tick.timestamp)} "
                            f"succeeded (ticks failed from {utc_instant(failing_since)}).",
                            log=context.log, level=20)
                failing_since, outcome = None, "resolved"
            else:
                outcome = "ticks succeed"
            if failing_since is not None:
                failing[policy.name] = failing_since
            outcomes[outcome].append(policy.name)
        context.update_cursor(json.dumps({"failingSince": failing}))
        return dg.SkipReason(summary(outcomes))

    return tick_failure_sensor
