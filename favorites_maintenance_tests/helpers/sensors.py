"""Evaluating a run-status sensor as Dagster's daemon does, over an instance's history."""

from __future__ import annotations

import dagster as dg
from favorites_maintenance_tests.helpers.dagster_internals import RunStatusSensorCursor

from favorites_maintenance.pipeline.resources import AlertSink
from favorites_maintenance_tests.helpers.resource_keys import ALERTS_KEY


def react_to_failures(defs, sensor_name: str, instance, sink: AlertSink):
    """One tick of a run-failure sensor as the daemon evaluates it, over every failure in
    ``instance`` so far: the runs it acted on (Dagster's "acted on" on a run's page)."""
    with dg.build_sensor_context(instance=instance, resources={ALERTS_KEY: sink},
                                 repository_def=defs.get_repository_def(),
                                 cursor=RunStatusSensorCursor(record_id=-1).to_json()) as ctx:
        data = defs.resolve_sensor_def(sensor_name).evaluate_tick(ctx)
    return [r.dagster_run.run_id for r in data.dagster_run_reactions or []]
