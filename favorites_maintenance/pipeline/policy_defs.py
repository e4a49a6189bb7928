"""Everything Dagster runs for one retention policy, under the policy's own names."""

import dagster as dg

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.assets import build_cleanup_asset
from favorites_maintenance.pipeline.checks import build_asset_checks
from favorites_maintenance.pipeline.jobs import build_job
from favorites_maintenance.pipeline.resources import policy_resources
from favorites_maintenance.pipeline.restore import build_restore_job
from favorites_maintenance.pipeline.schedules import build_schedule
from favorites_maintenance.pipeline.sensors import policy_sensors


def policy_definitions(policy: Policy) -> dg.Definitions:
    """The cleanup asset of ``policy`` and its checks, the job, the schedule and the three
    sensors, for a policy with an archive its restore job, and every resource they use
    (:func:`~favorites_maintenance.pipeline.resources.policy_resources`): complete on their
    own, merged into any code location. No executor: the policy's jobs name their own
    (:mod:`favorites_maintenance.pipeline.jobs`), and the location's default stays the host's.

    Raises:
        favorites_maintenance.config.parsers.SettingsError: a malformed deployment variable.
    """
    return dg.Definitions(
        assets=[build_cleanup_asset(policy)],
        asset_checks=build_asset_checks(policy),
        jobs=[build_job(policy),
              *([build_restore_job(policy)] if policy.archive_table is not None else [])],
        schedules=[build_schedule(policy)],
        sensors=policy_sensors(policy),
        resources=policy_resources(policy),
    )
