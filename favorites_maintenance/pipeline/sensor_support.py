"""What the retention sensors share: the policies of the code location evaluating them, a
tick's summary, and reading a sensor's JSON cursor."""

import datetime as dt
import json
import math
from collections.abc import Callable

import dagster as dg

from favorites_maintenance.config.policy import Policy

#: Policies a tick's summary names per outcome; the others are counted.
_NAMED = 10

#: Policy name -> the policy, for every policy whose definitions this process built
#: (:func:`~favorites_maintenance.pipeline.sensors.policy_sensors`); a sensor keeps those its
#: code location holds (:func:`location_policies`).
_POLICIES: dict[str, Policy] = {}


def remember_policy(policy: Policy) -> None:
    """Record ``policy`` so that the sensors find it (:func:`location_policies`); a policy
    built again (a reloaded code location) replaces the one of its name."""
    _POLICIES[policy.name] = policy


def location_policies(context) -> list[Policy]:
    """The policies of the code location evaluating a sensor, by name: those whose job
    (``<name>_cleanup_job``) the location's repository holds, among the policies this process
    built (:func:`~favorites_maintenance.pipeline.sensors.policy_sensors`). Without a
    repository on the context (a sensor called directly, in a test) every policy this process
    built.

    Args:
        context: a sensor's evaluation context, or a run-status sensor's.
    """
    policies = [_POLICIES[name] for name in sorted(_POLICIES)]
    repository = context.repository_def
    if repository is None:
        return policies
    return [p for p in policies if repository.has_job(p.job_name)]


def summary(outcomes: dict[str, list[str]]) -> str:
    """A tick's skip message: each outcome with the policies it applies to, ``fresh:
    guest_carts, guest_favorites``; past :data:`_NAMED` names, the rest counted."""
    parts = []
    for outcome, names in outcomes.items():
        shown = ", ".join(names[:_NAMED])
        if len(names) > _NAMED:
            shown += f" and {len(names) - _NAMED} more"
        parts.append(f"{outcome}: {shown}")
    return "; ".join(parts) or "no policy in this code location"


def utc_instant(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


def is_number(value) -> bool:
    # NaN or Infinity (JSON that Python reads) would compare as no time at all.
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def read_cursor(context: dg.SensorEvaluationContext,
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
