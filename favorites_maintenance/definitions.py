"""The code location: ``defs`` wires the asset, job, schedule and resources together.

Settings are read and validated when this module is imported, i.e. when the code location
loads (SPEC 4): an invalid ``FAVORITES_*`` variable stops the load with a message naming it.
"""

from __future__ import annotations

import dagster as dg

from favorites_maintenance.assets import guest_favorites_cleanup
from favorites_maintenance.jobs import guest_favorites_cleanup_job
from favorites_maintenance.resources import FavoritesDatabase, GuestRetention
from favorites_maintenance.schedules import build_schedule
from favorites_maintenance.settings import DATABASE_URL_VAR, Settings, load_settings


def build_defs(settings: Settings) -> dg.Definitions:
    """Build the definitions for ``settings``.

    The database URL is passed as ``dg.EnvVar`` so it is read at run time and never shown in
    the UI; ``settings`` only proves it valid (or absent: the run then fails naming the variable).
    """
    return dg.Definitions(
        assets=[guest_favorites_cleanup],
        jobs=[guest_favorites_cleanup_job],
        schedules=[build_schedule(settings.cron)],
        resources={
            "database": FavoritesDatabase(url=dg.EnvVar(DATABASE_URL_VAR)),
            "retention": GuestRetention(
                retention_days=settings.retention_days,
                batch_size=settings.batch_size,
                max_run_duration_seconds=settings.max_run_duration.total_seconds(),
            ),
        },
    )


defs = build_defs(load_settings())
