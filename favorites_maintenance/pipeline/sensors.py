"""Alerts of the retention policies: no successful cleanup for too long, a failed cleanup run, a
failed schedule tick. Three sensors serve every policy of the code location, whatever their
number (:func:`policy_sensors`): the staleness sensor
(:mod:`~favorites_maintenance.pipeline.stale_sensor`), the failure sensor
(:mod:`~favorites_maintenance.pipeline.failure_sensor`) and the tick-failure sensor
(:mod:`~favorites_maintenance.pipeline.tick_failure_sensor`). Each alert names its policy; a
policy's alert settings (``stale_after``) stay in its YAML.

They send through the ``favorites_maintenance_alerts`` resource (a sensor's parameter is named
after its resource key; :class:`~favorites_maintenance.pipeline.resources.AlertSink`):
the log always, a Slack-compatible webhook when ``FAVORITES_ALERT_WEBHOOK_URL`` is set.
"""

import functools
from collections.abc import Sequence

import dagster as dg

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.failure_sensor import build_failure_sensor
from favorites_maintenance.pipeline.sensor_support import remember_policy
from favorites_maintenance.pipeline.stale_sensor import build_stale_sensor
from favorites_maintenance.pipeline.tick_failure_sensor import build_tick_failure_sensor


def policy_sensors(policy: Policy) -> list[dg.SensorDefinition]:
    """The sensors serving ``policy``: the same three objects for every policy of the process,
    which a repository holds once however many policies return them (a defs folder, which
    copies each component's definitions, takes them from one policy: see
    :meth:`~favorites_maintenance.components.retention_policy.RetentionPolicy.build_defs`).
    Records ``policy`` so that the sensors find it
    (:func:`~favorites_maintenance.pipeline.sensor_support.location_policies`); a policy built
    again (a reloaded code location) replaces the one of its name."""
    remember_policy(policy)
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


@functools.cache
def _location_stale_sensor() -> dg.SensorDefinition:
    return build_stale_sensor()


@functools.cache
def _location_failure_sensor() -> dg.SensorDefinition:
    return build_failure_sensor()


@functools.cache
def _location_tick_failure_sensor() -> dg.SensorDefinition:
    return build_tick_failure_sensor()
