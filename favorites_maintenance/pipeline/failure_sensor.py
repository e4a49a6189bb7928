"""The failure sensor: alerts when a retention policy's cleanup run fails, naming the policy,
the run and the cause (never a row's values or a URL's password)."""

import re
from collections.abc import Sequence

import dagster as dg

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.resources import AlertSink
from favorites_maintenance.pipeline.sensor_support import location_policies

#: The sensor's name, one for the whole code location: the package's name first, so a host
#: project's own sensors never take it.
FAILURE_SENSOR = "favorites_maintenance_failure_sensor"


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
            sensor,
            :func:`~favorites_maintenance.pipeline.sensor_support.location_policies`).
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
