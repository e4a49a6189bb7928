"""The job that materializes a policy's cleanup asset, one daily partition per run.

Its partitioning is the asset's (:mod:`favorites_maintenance.pipeline.partitions`).
"""

import dagster as dg

from favorites_maintenance.config.policy import DATABASE_TAG, Policy


def build_job(policy: Policy):
    """``<name>_cleanup_job``: the cleanup asset of ``policy`` (and its checks), one daily
    partition per run. Each of its runs carries the run tag ``favorites_maintenance/database``
    with the variable of the policy's database (``dagster.yaml`` admits one such run per
    value at a time)."""
    return dg.define_asset_job(
        policy.job_name,
        selection=dg.AssetSelection.assets(dg.AssetKey(list(policy.asset_key_path))),
        description=f"Delete stale rows of {policy.rule.qualified_name} "
                    f"({policy.rule.predicate_sql}) for one daily partition, on the database of "
                    f"{policy.database_url_env}.",
        tags={DATABASE_TAG: policy.database_url_env},
    )

