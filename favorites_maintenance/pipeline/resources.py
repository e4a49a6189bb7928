"""Resources: the policies' databases, the run limits, the alert sink and the metrics push.

Each policy's definitions carry the resources they use (:func:`policy_resources`), under keys
of the package's (:data:`~favorites_maintenance.config.policy.RESOURCE_PREFIX`), so a host's
code location merges them beside resources of its own: the database of a variable, the alert
sink and the metrics push are one object each, shared by every policy that uses them. Each
policy's run limits (:func:`deployed_retention`) are bound to its own asset instead: Dagster
binds every resource of a code location to every asset, so a resource per policy at the
location would make loading it quadratic in the policies. The job deletes rows for good, so
what it deletes is decided by the deployment alone:
:func:`shared_database` serves one database per variable the policies name
(``database_url_env``), as the code location's environment gives it; each policy's rule and
retention days are its ``defs.yaml``; and a run's config (the launchpad, a re-execution,
``execute_in_process``) may set only the run limits (:func:`deployed_retention`), within the
same bounds as the policy's own values. Anything else is refused when the run is launched,
before a run exists, with a message naming the variable that configures it. A database URL
reaches Dagster only as an ``EnvVar``, so the UI and the run config never show it.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import requests
import sqlalchemy as sa
from pydantic import Field, PrivateAttr

from favorites_maintenance.config.deployment import (
    DeploymentSettings,
    load_deployment_settings,
)
from favorites_maintenance.config.parsers import (
    ALERT_WEBHOOK_URL_VAR,
    METRICS_PUSHGATEWAY_URL_VAR,
    WEBSERVER_BASE_URL_VAR,
    SettingsError,
    parse_database_url,
)
from favorites_maintenance.config.policy import (
    ALERTS_KEY,
    METRICS_KEY,
    Policy,
)
from favorites_maintenance.config.policy_settings import (
    LAUNCH_LIMITS,
    SETTINGS,
    PolicySettings,
)
from favorites_maintenance.pipeline import metrics
from favorites_maintenance.pipeline.heartbeat import Heartbeat, beat_every
from favorites_maintenance.pipeline.run_report import RunReport
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR


_alerts_log = logging.getLogger("favorites_maintenance.alerts")

#: Where the code location reads its settings from, as the refusals tell the operator.
_WHERE = "the environment of the process serving the code location (README, \"Configuration\")"

class PolicyDatabase(dg.ConfigurableResource):
    """The PostgreSQL database of one or more policies (their table lives there).

    Attributes:
        url: SQLAlchemy URL (``postgresql+psycopg://…``); a secret, pass it as
            ``dg.EnvVar(url_env)``.
        url_env: the environment variable ``url`` is read from, named by every error
            (``FAVORITES_DATABASE_URL`` unless the policies set ``database_url_env``).

    The engine opens connections lazily, once per step, and is disposed when the step ends.
    While a run's step holds it, its process beats for the run
    (:class:`~favorites_maintenance.pipeline.heartbeat.Heartbeat`), so that a run whose
    process was killed is found and ended (``cleanup_dead_run_sensor``).
    """

    url: str
    url_env: str = DATABASE_URL_VAR
    _engine: sa.Engine | None = PrivateAttr(default=None)
    _heartbeat: Heartbeat | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        try:
            self._engine = create_engine(parse_database_url(self.url, variable=self.url_env))
        except SettingsError:
            raise
        except Exception:
            raise SettingsError(self.url_env, "could not be used to build an engine") from None
        if context.run is not None and context.instance is not None:
            timeout = load_deployment_settings().run_heartbeat_timeout
            self._heartbeat = Heartbeat(context.instance, context.run.run_id,
                                        beat_every(timeout)).start()

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine; only inside a step (after ``setup_for_execution``)."""
        if self._engine is None:
            self._engine = create_engine(parse_database_url(self.url, variable=self.url_env))
        return self._engine


class RunLimits(dg.ConfigurableResource):
    """The run limits a launch set for one run (``resources.<policy.run_limits_key>.config``);
    a limit left out keeps the policy's own (its ``defs.yaml``, or its variables).

    Served by :func:`deployed_retention`, which checks a launch's values against the bounds of
    the settings they stand in for (:data:`~favorites_maintenance.config.policy_settings.
    LAUNCH_LIMITS`: ``batch_size`` in rows, ``max_run_duration_seconds`` in seconds). A
    launch's ``batch_size`` bounds every batch of its run (batch size mode ``fixed``), and may
    not exceed a ``batch_size_max`` the policy sets.

    Attributes:
        limits: run-config key -> the value the launch gave, already checked.
    """

    limits: dict[str, float] = Field(default_factory=dict,
                                     description="Run limits set by the launch, checked.")

    def apply(self, policy: Policy) -> PolicySettings:
        """``policy``'s settings with the limits this launch set, the rest unchanged.

        Raises:
            dagster.Failure: the launch's ``batch_size`` is above the policy's explicit
                ``batch_size_max`` (named by its variable or field); nothing is deleted.
        """
        changed = {}
        for key, value in self.limits.items():
            name = LAUNCH_LIMITS[key]
            changed[name] = (dt.timedelta(seconds=value)
                             if SETTINGS[name].launch_unit == "seconds" else int(value))
        try:
            return policy.settings.launched(**changed)
        except ValueError:
            if "batch_size" not in changed:
                raise
            raise dg.Failure(_above_cap(changed["batch_size"], [policy])) from None


def _above_cap(value: float, policies: Sequence[Policy]) -> str:
    """Why a launch's ``batch_size`` of ``value`` rows is refused for ``policies``."""
    caps = "; ".join(f"{p.label('batch_size_max')} ({p.settings.batch_size_max:,} rows"
                     + (f", policy {p.name}" if len(policies) > 1 else "") + ")"
                     for p in policies)
    return (f"batch_size={value:g} refused: it is above {caps}, the largest batch the "
            f"deployment allows, read from {_WHERE}. A launch may lower the batch size, never "
            "raise that cap.")


def _capped_below(value: Any, policies: Sequence[Policy]) -> list[Policy]:
    """The policies whose settings refuse a launch's ``batch_size`` of ``value`` rows (the rule
    is :meth:`~favorites_maintenance.config.policy_settings.PolicySettings.launched`'s)."""
    refused = []
    for policy in policies if _is_number(value) else ():
        try:
            policy.settings.launched(batch_size=value)
        except ValueError:
            refused.append(policy)
    return refused


def _refuse(message: str, config: Any) -> dg.DagsterInvalidConfigError:
    return dg.DagsterInvalidConfigError(message, [], config)


def _labels(policies: Sequence[Policy], setting: str) -> str:
    """What configures ``setting``: its label, or, with several policies, each policy's."""
    if len(policies) == 1:
        return policies[0].label(setting)
    return "; ".join(f"{p.name}: {p.label(setting)}" for p in policies)


def _is_number(value: Any) -> bool:
    """A real number of run config (``True`` is not 1 second, nor ``[365]`` 365 days)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _launch_value(settings: PolicySettings, key: str) -> float:
    """The value of launch key ``key`` that ``settings`` hold, in the key's unit."""
    name = LAUNCH_LIMITS[key]
    value = getattr(settings, name)
    return value.total_seconds() if SETTINGS[name].launch_unit == "seconds" else value


def deployed_retention(policies: Sequence[Policy]) -> dg.ResourceDefinition:
    """The run limits resource (``policy.run_limits_key``; each policy's cleanup asset carries
    its own, :func:`~favorites_maintenance.pipeline.assets.build_cleanup_asset`): the run limits
    a launch may set for a run of any of ``policies``, and nothing else.

    Run config ``resources.<key>.config`` may hold the launch keys of the policy settings
    table (``batch_size``, rows, 1 to 100,000; ``max_run_duration_seconds``, seconds, 1 to
    3,000), within the bounds of the settings they stand in for
    (``FAVORITES_GUEST_RETENTION_BATCH_SIZE`` and ``FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION``
    for the guest-favorites policy); left out, each policy's own applies. A ``batch_size``
    bounds every batch of the run; one above a policy's explicit ``batch_size_max`` is refused
    (at launch when it is above every policy's, else when that policy's run starts, before it
    deletes anything). The retention days
    are the deployment's: a ``retention_days`` other than a policy's deployed value is refused
    (a deployed value is accepted and changes nothing: the retention is never taken from a
    launch), and so is any other key. The table, the guard and the age column are the
    policy's ``defs.yaml`` and have no run config at all.

    The check runs when Dagster resolves the run config: in the code server when a run is
    launched from the UI or GraphQL (the launch fails, no run is created) and before
    ``execute_in_process`` creates its run.

    Raises (at launch):
        dagster.DagsterInvalidConfigError: naming the key, the value and the setting (its
            variable) that configures it.
    """
    if not policies:
        raise ValueError("deployed_retention needs at least one policy")
    days = {p.settings.retention_days for p in policies}
    deployed = "; ".join(f"{p.label('retention_days')} ({p.settings.retention_days} days in "
                         "this deployment" + (f", policy {p.name}" if len(policies) > 1 else "")
                         + ")" for p in policies)

    # One policy: the launchpad offers its values; several: each policy's own when left out.
    only = policies[0].settings if len(policies) == 1 else None
    deployed_limits = ({key: _launch_value(only, key) for key in LAUNCH_LIMITS}
                       if only else {})

    def at_launch(config: Mapping[str, Any]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for key, value in config.items():
            if key == "retention_days":
                # A deployed value changes nothing (the retention is never taken from a
                # launch): the config of an older run can be re-executed.
                if value is None or (_is_number(value) and value in days):
                    continue
                raise _refuse(
                    f"retention_days={value!r} refused: the retention is not set at launch. It "
                    f"is {deployed}, read from {_WHERE}; change it there, "
                    f"reviewed, and restart that process.", config)
            if key not in LAUNCH_LIMITS:
                raise _refuse(
                    f"{key!r} refused: a launch may set only {', '.join(LAUNCH_LIMITS)}. The "
                    f"rule (table, guard, age column, retention days) is fixed by the "
                    f"deployment: the policy's defs.yaml and "
                    f"{_labels(policies, 'retention_days')} in {_WHERE}.", config)
            if value is None or value == deployed_limits.get(key):
                continue  # the policy's own value (the launchpad's default): nothing to change
            setting = LAUNCH_LIMITS[key]
            low, high = SETTINGS[setting].launch_bounds
            if not _is_number(value) or not low <= value <= high:
                shown = (int(value) if _is_number(value) and float(value).is_integer()
                         and abs(value) < 1e15 else value)  # 0, not 0.0
                raise _refuse(
                    f"{key}={shown!r} refused: it must be between {low:,g} and {high:,g}, "
                    f"the bounds of {_labels(policies, setting)}.", config)
            if setting == "batch_size" and len(_capped_below(value, policies)) == len(policies):
                # Above the cap of every policy: refused now. Above some only, the run of
                # such a policy refuses it before deleting anything (RunLimits.apply).
                raise _refuse(_above_cap(value, policies), config)
            values[key] = value
        return {"limits": values}

    own = "; ".join(f"{p.name}: {p.settings.batch_size} rows, "
                    f"{p.settings.max_run_duration.total_seconds():g} s" for p in policies)
    description = (
        f"Retention: {deployed}; fixed by the deployment, not settable at launch. Run limits "
        f"a launch may set, within the bounds of their settings: {' and '.join(LAUNCH_LIMITS)} "
        f"(left out, each policy's own: {own}).")
    schema = dg.Permissive({key: _launch_field(key, policies, deployed_limits.get(key))
                            for key in LAUNCH_LIMITS})
    return _run_limits_definition().configured(at_launch, config_schema=schema,
                                               description=description)


@functools.cache
def _run_limits_definition() -> dg.ResourceDefinition:
    """:class:`RunLimits` as a resource definition, built once: each policy's is this one,
    configured."""
    return RunLimits().get_resource_definition()


def _launch_field(key: str, policies: Sequence[Policy], default: float | None) -> dg.Field:
    """The launchpad's field of launch key ``key``: its type, bounds and what sets it."""
    name = LAUNCH_LIMITS[key]
    declared = SETTINGS[name]
    low, high = declared.launch_bounds
    unit = " in seconds" if declared.launch_unit == "seconds" else ""
    kind = float if declared.launch_unit == "seconds" else int
    return dg.Field(dg.Noneable(kind), default_value=default, is_required=False,
                    description=f"{declared.description[0].upper()}{declared.description[1:]}"
                    f"{unit}, {low:,g} to {high:,g} ({_labels(policies, name)}).")


def _refuse_any(config: Mapping[str, Any], what: str, variables: str) -> None:
    """Refuse any key of a launch's config of a resource the deployment alone sets: ``what``
    it sets, ``variables`` the settings that configure it.

    Raises:
        dagster.DagsterInvalidConfigError: ``config`` is not empty; the message names its keys
            (never their values) and ``variables``.
    """
    if config:
        raise _refuse(f"{', '.join(sorted(config))} refused: {what} is not chosen at launch. "
                      f"It is {variables}, read from {_WHERE}.", config)


def _fixed_at_launch(resource: dg.ConfigurableResource, deployed: dict[str, Any], what: str,
                     variables: str) -> dg.ResourceDefinition:
    """``resource`` with the deployment's config ``deployed`` (a secret as ``{"env": VAR}``),
    which no run config can change: any ``resources.<key>.config`` of a run that uses it is
    refused at launch (:func:`_refuse_any`)."""

    def at_launch(config: Mapping[str, Any]) -> dict[str, Any]:
        _refuse_any(config, what, variables)
        return deployed

    return resource.get_resource_definition().configured(
        at_launch, config_schema=dg.Permissive({}),
        description=f"{what[0].upper()}{what[1:]}: {variables}, read from {_WHERE}; not "
                    "settable at launch.")


def deployed_alerts(settings: DeploymentSettings) -> dg.ResourceDefinition:
    """The alert sink resource (:class:`AlertSink`, key ``favorites_maintenance_alerts``) of
    the deployment's ``settings``: the webhook of ``FAVORITES_ALERT_WEBHOOK_URL`` (by
    reference, read when a run or a sensor tick
    starts; none when unset) and the UI's base URL of ``FAVORITES_WEBSERVER_BASE_URL``, which
    no launch can change, so whoever may launch a run can neither silence the failure alert
    nor send it elsewhere.

    Raises (at launch):
        dagster.DagsterInvalidConfigError: any key given in its run config
            (``resources.favorites_maintenance_alerts.config``).
    """
    deployed = {"webhook_url": ({"env": ALERT_WEBHOOK_URL_VAR} if settings.alert_webhook_url
                                else None),
                # Not a secret (credentials are refused): alerts show it.
                "webserver_base_url": settings.webserver_base_url}
    return _fixed_at_launch(AlertSink(), deployed, "where alerts go",
                            f"{ALERT_WEBHOOK_URL_VAR} and {WEBSERVER_BASE_URL_VAR}")


def deployed_metrics(settings: DeploymentSettings) -> dg.ResourceDefinition:
    """The metrics push resource (:class:`MetricsPush`, key ``favorites_maintenance_metrics``)
    of the deployment's ``settings``: the Pushgateway of ``FAVORITES_METRICS_PUSHGATEWAY_URL``
    (by reference, read when a run
    starts; none when unset), which no launch can change, so a run's figures go nowhere else.

    Raises (at launch):
        dagster.DagsterInvalidConfigError: any key given in its run config
            (``resources.favorites_maintenance_metrics.config``).
    """
    deployed = {"gateway_url": ({"env": METRICS_PUSHGATEWAY_URL_VAR}
                                if settings.metrics_pushgateway_url else None)}
    return _fixed_at_launch(MetricsPush(), deployed, "where a run's metrics go",
                            METRICS_PUSHGATEWAY_URL_VAR)


def deployed_database(variable: str = DATABASE_URL_VAR,
                      policies: Sequence[Policy] = ()) -> dg.ResourceDefinition:
    """The resource serving the database of ``variable`` (read by ``EnvVar`` when the run
    starts) to ``policies``, the policies naming it, which no run config can change: any
    ``resources.<key>.config`` of a run that uses it is refused at launch, naming the variable,
    so a launch can neither point a policy at another database nor leave a password in a run's
    config.

    An unset ``variable`` refuses the launch of those policies' runs alone, naming it: the
    code location still loads, and every other policy runs (Dagster resolves only the
    resources a run uses).

    Raises (at launch):
        dagster.DagsterInvalidConfigError: any key given in run config; ``variable`` unset in
            the environment of the process serving the code location.
    """
    names = ", ".join(p.name for p in policies)
    whose = f"the database of policy {names}" if len(policies) == 1 else (
        f"the database of policies {names}" if policies else "the database")

    def at_launch(config: Mapping[str, Any]) -> dict[str, Any]:
        _refuse_any(config, whose, variable)
        if not os.environ.get(variable, "").strip():
            raise _refuse(
                f"{variable} is not set: it holds the URL of {whose}; set it in {_WHERE} "
                "and restart that process. Policies on other databases are not affected.",
                config)
        # Resolved by Dagster when the run starts: the URL never enters the run's config.
        return {"url": {"env": variable}, "url_env": variable}

    return PolicyDatabase(url=dg.EnvVar(variable), url_env=variable) \
        .get_resource_definition().configured(
            at_launch, config_schema=dg.Permissive({}),
            description=f"{whose[0].upper()}{whose[1:]}: {variable} (by reference, never "
                        "shown); not settable at launch.")


def name_database(exc: BaseException, policy: Policy) -> None:
    """Add to ``exc``, once, a note naming the variable of ``policy``'s database: Dagster shows
    an error's notes with its message, in the run's log and the UI, so the operator reads which
    database failed (the retention core knows engines, not variables)."""
    note = f"policy {policy.name}: its database is {policy.database_url_env}"
    if note not in getattr(exc, "__notes__", ()):
        exc.add_note(note)


class AlertSink(dg.ConfigurableResource):
    """Where alerts go: the log always, and a Slack-compatible webhook when one is configured.

    Attributes:
        webhook_url: optional URL receiving ``POST {"text": ...}`` (JSON); a secret, pass it as
            ``dg.EnvVar("FAVORITES_ALERT_WEBHOOK_URL")``. Never logged.
        webserver_base_url: optional base URL of the Dagster UI
            (``FAVORITES_WEBSERVER_BASE_URL``, e.g. ``https://dagster.example.internal``): a
            failed run's alert ends with its page, ``<base>/runs/<run id>``.
        timeout_seconds: per-attempt HTTP timeout, in seconds.
        attempts: HTTP attempts before giving up (with 1 s, 2 s, ... pauses between them).
    """

    webhook_url: str | None = None
    webserver_base_url: str | None = None
    timeout_seconds: float = 5.0
    attempts: int = 3

    def send(self, text: str, *, log: logging.Logger | None = None,
             level: int = logging.ERROR) -> bool:
        """Log ``text`` and post it to the webhook, if any. Never raises.

        Returns:
            ``True`` when the webhook accepted it (or none is configured), ``False`` when every
            attempt failed (the failure is logged, without the URL).
        """
        logger = log or _alerts_log
        logger.log(level, "ALERT: %s", text)
        if not self.webhook_url:
            return True
        for attempt in range(1, self.attempts + 1):
            try:
                response = requests.post(self.webhook_url, json={"text": text},
                                         timeout=self.timeout_seconds)
                if response.status_code < 300:
                    return True
                problem = f"HTTP {response.status_code}"
            except requests.RequestException as exc:
                problem = type(exc).__name__
            logger.warning("alert webhook attempt %d/%d failed: %s", attempt, self.attempts,
                           problem)
            if attempt < self.attempts:
                time.sleep(attempt)
        return False


class MetricsPush(dg.ConfigurableResource):
    """Where a cleanup run's gauges go when it ends: a Prometheus Pushgateway, when one is
    configured (see :mod:`favorites_maintenance.pipeline.metrics`); otherwise nowhere.

    Attributes:
        gateway_url: optional ``http(s)://[user:password@]host[:port]``; it may hold
            credentials, so pass it as ``dg.EnvVar("FAVORITES_METRICS_PUSHGATEWAY_URL")``.
            Never logged with them.
        timeout_seconds: how long one push may take, in seconds.
    """

    gateway_url: str | None = None
    timeout_seconds: float = metrics.PUSH_TIMEOUT_S

    def push_run(self, context: dg.OpExecutionContext, policy: Policy, report: RunReport, *,
                 succeeded: bool) -> None:
        """Push the gauges of the run of ``context`` (``succeeded``: it ends SUCCESS). Never
        raises: a failed push is a warning in the run's log, without the URL's credentials."""
        if self.gateway_url:
            metrics.push_run(self.gateway_url, policy, report, succeeded=succeeded,
                             timeout=self.timeout_seconds, log=context.log)


@functools.cache
def shared_database(variable: str) -> dg.ResourceDefinition:
    """The resource of the database of ``variable`` (:func:`deployed_database`), one object per
    variable in the process: the policies naming it share it, so their definitions merge."""
    return deployed_database(variable)


#: The shared resources built in this process, by what they are built from: one object each,
#: as ``dg.Definitions.merge`` requires of resources under one key.
_shared: dict[tuple, dg.ResourceDefinition] = {}


def _one_of(key: tuple, build) -> dg.ResourceDefinition:
    if key not in _shared:
        _shared[key] = build()
    return _shared[key]


def policy_resources(policy: Policy) -> dict[str, Any]:
    """The code location's resources the definitions of ``policy`` use, by key: its
    database's (:func:`shared_database`), the alert sink and the metrics push
    (:func:`deployed_alerts`, :func:`deployed_metrics`), each the same object for every policy
    of the process, as ``dg.Definitions.merge`` requires. Its run limits
    (:func:`deployed_retention`) are not among them: its asset carries them, so that the
    location's resources stay as many whatever the number of policies.

    Raises:
        favorites_maintenance.config.parsers.SettingsError: a malformed deployment variable
            (``FAVORITES_ALERT_WEBHOOK_URL``, ...), named.
    """
    settings = load_deployment_settings()
    return {
        policy.database_key: shared_database(policy.database_url_env),
        ALERTS_KEY: _one_of(("alerts", settings.alert_webhook_url is not None,
                             settings.webserver_base_url), lambda: deployed_alerts(settings)),
        METRICS_KEY: _one_of(("metrics", settings.metrics_pushgateway_url is not None),
                             lambda: deployed_metrics(settings)),
    }
