"""The job that materializes the cleanup asset, one daily partition per run.

Its partitioning is the asset's (:mod:`favorites_maintenance.partitions`).
"""

import dagster as dg

from favorites_maintenance.assets import guest_favorites_cleanup

guest_favorites_cleanup_job = dg.define_asset_job(
    "guest_favorites_cleanup_job",
    selection=dg.AssetSelection.assets(guest_favorites_cleanup),
    description="Delete stale guest favorites for one daily partition.",
)
