"""The code location: ``defs`` wires the asset, job, schedule and resources together.

Settings are read and validated when this module is imported, i.e. when the code location
loads: an invalid ``FAVORITES_*`` variable stops the load with a message naming it.
"""

from __future__ import annotations

import dagster as dg

from favorites_maintenance.assets import guest_favorites_cleanup
from favorites_maintenance.checks import asset_checks
from favorites_maintenance.jobs import guest_favorites_cleanup_job
from favorites_maintenance.resources import (
    AlertSink,
    GuestRetention,
    deployed_database,
    deployed_retention,
)
from favorites_maintenance.schedules import build_schedule
from favorites_maintenance.sensors import (
    build_stale_sensor,
    guest_favorites_cleanup_failure_sensor,
    guest_favorites_cleanup_tick_failure_sensor,
)
from favorites_maintenance.settings import (
    ALERT_WEBHOOK_URL_VAR,
    Settings,
    load_settings,
)


def build_defs(settings: Settings) -> dg.Definitions:
    """Build the definitions for ``settings``.

    The database and webhook URLs are passed as ``dg.EnvVar`` so they are read at run time and
    never shown in the UI; ``settings`` only proves them valid (an absent database URL fails the
    run, naming the variable). A run's config may set the run limits and nothing else (see
    :func:`~favorites_maintenance.resources.deployed_retention`).
    """
    return dg.Definitions(
        assets=[guest_favorites_cleanup],
        asset_checks=asset_checks,
        jobs=[guest_favorites_cleanup_job],
        schedules=[build_schedule(settings.cron)],
        sensors=[build_stale_sensor(settings.stale_after), guest_favorites_cleanup_failure_sensor,
                 guest_favorites_cleanup_tick_failure_sensor],
        resources={
            # What the job deletes is the deployment's: run config may set only run limits.
            "database": deployed_database(),
            "retention": deployed_retention(GuestRetention(
                retention_days=settings.retention_days,
                batch_size=settings.batch_size,
                max_run_duration_seconds=settings.max_run_duration.total_seconds(),
                batch_size_max=settings.batch_size_max,
                target_batch_duration_seconds=settings.target_batch_duration.total_seconds(),
                max_replication_lag_bytes=settings.max_replication_lag_bytes,
                max_wal_bytes_per_second=settings.max_wal_bytes_per_second,
                max_pause_seconds=settings.max_pause.total_seconds(),
            )),
            # The webhook URL holds a token: pass it by reference, only when it is set.
            "alerts": AlertSink(webhook_url=dg.EnvVar(ALERT_WEBHOOK_URL_VAR)
                                if settings.alert_webhook_url else None),
        },
    )


defs = build_defs(load_settings())
