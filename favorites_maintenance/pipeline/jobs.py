"""The job that materializes a policy's cleanup asset, one daily partition (or a range of them)
per run, and the executor every run of the policy uses.

Its partitioning is the asset's (:mod:`favorites_maintenance.pipeline.partitions`).
"""

import dagster as dg

from favorites_maintenance.config.policy import DATABASE_TAG, Policy

#: The executor of a policy's runs: every step in the run worker's own process, one after the
#: other. The steps only talk to the database (a cutoff, a batched purge, a count, three
#: checks), so a process per step would add a Python start and a code-location load per step
#: (seconds each) to work that takes milliseconds. Set on the policy's own jobs only: the code
#: location's default executor is the location's (Dagster's multiprocess one unless the project
#: sets another), and Dagster's implicit asset job, which runs the UI's "Materialize" and asset
#: backfills, uses that one (docs/adopting.md). The steps of one run depend on each other in a
#: line, so nothing runs in parallel either way.
#:
#: What termination needs under it: a purge that stops on request raises Dagster's interruption
#: (the run ends CANCELED, see :mod:`favorites_maintenance.pipeline.purge_op`), and no op of the
#: job carries a declarative ``RetryPolicy``, which the in-process executor would turn a
#: termination into a retry of (the purge requests its retries explicitly).
#:
#: Configured with its defaults and no run config of its own (retries enabled, which the
#: purge's explicit retry requests need): an executor's config schema is part of every job's
#: snapshot, which the daemon fetches from the code server every minute, for every policy.
CLEANUP_EXECUTOR = dg.in_process_executor.configured({})


def partition_executor(policy: Policy) -> dg.ExecutorDefinition:
    """The executor of the job of a policy that purges its table one partition per step:
    Dagster's multiprocess executor, a process per step, at most ``max_parallel_partitions``
    steps at once. ``max_concurrent`` bounds the steps inside a run; the pools (run
    granularity) do not: a run holds one slot of each pool its steps name however many steps
    name it, which is what keeps two runs of the policy from overlapping."""
    return dg.multiprocess_executor.configured(
        {"max_concurrent": policy.settings.max_parallel_partitions},
        name=f"{policy.name}_partition_executor")


def build_job(policy: Policy):
    """``<name>_cleanup_job``: the cleanup asset of ``policy`` (and its checks), one daily
    partition per run (a range in a single-run backfill). Each of its runs carries the run tag
    ``favorites_maintenance/database`` with the variable of the policy's database
    (``dagster.yaml`` admits one such run per value at a time). A policy that purges its
    table one partition per step runs on :func:`partition_executor`."""
    return dg.define_asset_job(
        policy.job_name,
        selection=dg.AssetSelection.assets(dg.AssetKey(list(policy.asset_key_path))),
        description=f"Delete stale rows of {policy.rule.qualified_name} "
                    f"({policy.rule.predicate_sql}) for one daily partition, on the database of "
                    f"{policy.database_url_env}.",
        tags={DATABASE_TAG: policy.database_url_env},
        executor_def=(partition_executor(policy) if policy.purges_partitions
                      else CLEANUP_EXECUTOR),
    )
