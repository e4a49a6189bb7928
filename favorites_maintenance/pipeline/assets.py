"""A policy's cleanup as an op graph ``compute_cutoff -> purge -> measure_backlog``.

:func:`build_cleanup_asset` exposes the graph as a daily-partitioned graph-backed asset, one per
policy, so runs can be launched and backfilled from the UI. Dagster puts only the terminal op's
output metadata on the asset materialization, so the purge report travels to
``measure_backlog``, which records it.

A backfill runs as one run over its range of days (``BackfillPolicy.single_run()``): the purge
goes once to the cutoff of the range's last day, and ``measure_backlog`` materializes every day
of the range, the run's figures on the last one (:mod:`favorites_maintenance.pipeline.ranges`).
A run of one day stays possible (the schedule's, or one day launched from the UI).

A policy that sets ``max_parallel_partitions`` purges its range-partitioned table one partition
per step: ``compute_cutoff -> plan_partitions -> purge_partition[<partition>] ->
collect_partitions -> measure_backlog`` (:mod:`favorites_maintenance.pipeline.partition_steps`).
Each partition step is the same purge on the partition alone, with its own retries, stop
requests and health readings; ``collect_partitions`` sums their records into the run's.

Each policy has its own op definitions (``<name>_purge``, ...: Dagster refuses two definitions
of one name in a code location, and the purge's concurrency pool is the policy's), used under
the same node names in every graph: ``compute_cutoff``, ``purge``, ``measure_backlog``. Run
config and step keys read the same for every policy, e.g.
``ops.favorites__guest_favorites_cleanup.ops.purge.config``.
"""

import dataclasses
import datetime as dt
import os
import socket

import dagster as dg

from favorites_maintenance.config.policy import ALERTS_KEY, METRICS_KEY, Policy
from favorites_maintenance.config.policy_settings import BatchSizeMode, PolicySettings
from favorites_maintenance.pipeline.op_functions import op_function
from favorites_maintenance.pipeline.partition_steps import (
    PartitionPlan,
    PartitionWork,
    mapping_keys,
    partitions_to_purge,
)
from favorites_maintenance.pipeline.partitions import (
    policy_partitions,
    require_run_partitions,
    run_cutoff,
    run_now,
)
from favorites_maintenance.pipeline.purge_op import (
    PURGE_CONFIG,
    attempt_failed,
    drop_phase_figures,
    purge_config,
    record_detached,
    run_drop_phase,
    run_purge_op,
)
from favorites_maintenance.pipeline.ranges import (
    is_range_run,
    range_text,
    run_partitions,
)
from favorites_maintenance.pipeline.resources import (
    MetricsPush,
    PolicyDatabase,
    RunLimits,
    deployed_retention,
    name_database,
)
from favorites_maintenance.pipeline.run_log import core_logs_in_run_log
from favorites_maintenance.pipeline.run_report import RunReport
from favorites_maintenance.pipeline.stop_requests import StopRequests
from favorites_maintenance.retention.backlog import measure_backlog
from favorites_maintenance.retention.errors import BacklogError, ConnectError, RetentionError

#: The freshness policy warns at this fraction of the policy's ``stale_after`` and fails at it:
#: 26 h of 48 h for guest favorites, a daily run missed once with two hours of slack.
FRESHNESS_WARN_FRACTION = 26 / 48
#: The shortest window Dagster's freshness policies take.
FRESHNESS_MIN_WINDOW = dt.timedelta(minutes=1)


def freshness_policy(stale_after: dt.timedelta) -> dg.FreshnessPolicy:
    """Fail when the asset has not been materialized for ``stale_after`` (the staleness alert's
    threshold), warn at :data:`FRESHNESS_WARN_FRACTION` of it. Dagster's windows are at least a
    minute: a shorter ``stale_after`` fails after one minute, and a warning that would come
    before a minute is left out."""
    fail = max(stale_after, FRESHNESS_MIN_WINDOW)
    warn = fail * FRESHNESS_WARN_FRACTION
    return dg.FreshnessPolicy.time_window(
        fail_window=fail, warn_window=warn if warn >= FRESHNESS_MIN_WINDOW else None)


def _batch_sizes(settings: PolicySettings) -> str:
    """How the run sizes its batches, for the run's first log line."""
    mode = settings.batch_size_mode
    if mode is BatchSizeMode.FIXED:
        return f"fixed: at most {settings.batch_size} rows a batch"
    largest = f"{settings.batch_size_max} rows"
    # Adaptive batches may grow past batch_size_max when the run walks in keyset order.
    keyset_max = settings.purge_options().keyset_batch_size_max
    if keyset_max is not None and keyset_max > settings.batch_size_max:
        largest += f" ({keyset_max} in keyset order)"
    return (f"{mode}: from {settings.batch_size} up to {largest}, target "
            f"{settings.target_batch_duration.total_seconds() * 1000:g} ms a batch")


def build_cleanup_asset(policy: Policy) -> dg.AssetsDefinition:
    """The cleanup asset of ``policy``: key ``<schema>/<name>_cleanup``, daily partitions, the
    graph ``compute_cutoff -> purge -> measure_backlog`` (for a policy that purges its table
    one partition per step, ``compute_cutoff -> plan_partitions -> purge_partition[...] ->
    collect_partitions -> measure_backlog``), and a freshness policy (fail after the policy's
    ``stale_after`` without a materialization, see :func:`freshness_policy`).

    The ops read the policy's database resource (:class:`~favorites_maintenance.pipeline.
    resources.PolicyDatabase`, key ``policy.database_key``: one per database variable, a
    resource of the code location) and its run limits
    (:class:`~favorites_maintenance.pipeline.resources.RunLimits`, key ``policy.run_limits_key``:
    what a launch changed of the policy's batch size and time budget), a resource the asset
    carries itself (see :func:`~favorites_maintenance.pipeline.resources.policy_resources`):
    its run config is ``resources.<policy.run_limits_key>.config`` of any run of the asset. The
    purge holds the
    policy's pool and ``measure_backlog`` its database's: with the pools' run granularity, a
    run holds both from start to end, whatever launched it (the schedule, the asset page, a
    backfill).

    Its group, owners, kinds and tags are the policy's catalog settings (``group``, else its
    database's, :attr:`~favorites_maintenance.config.policy.Policy.group`).
    """
    rule = policy.rule
    asset_key = dg.AssetKey(list(policy.asset_key_path))
    # The key is the database variable's, so the resource cannot be a parameter's name.
    database_key = policy.database_key

    def settings_of(context: dg.OpExecutionContext):
        limits: RunLimits = getattr(context.resources, policy.run_limits_key)
        return limits.apply(policy)

    def database_of(context: dg.OpExecutionContext) -> PolicyDatabase:
        return getattr(context.resources, database_key)

    compute_cutoff, purge, record_backlog = _cleanup_ops(policy, asset_key, settings_of,
                                                         database_of)

    if policy.purges_partitions:
        plan_partitions, purge_partition, collect_partitions = _partition_ops(
            policy, asset_key, settings_of, database_of)

        def graph():
            cutoff = compute_cutoff.alias("compute_cutoff")()
            works, plan = plan_partitions.alias("plan_partitions")(cutoff)
            reports = works.map(
                lambda work: purge_partition.alias("purge_partition")(cutoff, work))
            report = collect_partitions.alias("collect_partitions")(cutoff, plan,
                                                                    reports.collect())
            return record_backlog.alias("measure_backlog")(cutoff, report)
        shape = (f" The table is range-partitioned by {rule.age.name}: each partition with "
                 f"prunable rows is purged by its own step, at most "
                 f"{policy.settings.max_parallel_partitions} at once.")
    else:
        def graph():
            cutoff = compute_cutoff.alias("compute_cutoff")()
            return record_backlog.alias("measure_backlog")(cutoff,
                                                           purge.alias("purge")(cutoff))
        shape = ""
    graph.__name__ = "cleanup"

    cleanup = dg.graph_asset(
        key=asset_key,
        partitions_def=policy_partitions(policy),
        backfill_policy=dg.BackfillPolicy.single_run(),
        # Bound here, not at the location: Dagster binds each location resource to each asset.
        resource_defs={policy.run_limits_key: deployed_retention([policy])},
        # The catalog's filters: the policy's own, or the defaults (its database's group).
        group_name=policy.group,
        kinds=set(policy.settings.kinds),
        owners=list(policy.settings.owners),
        tags=dict(policy.settings.tags),
        description=(
            f"Stale rows removed from {rule.qualified_name} by retention policy "
            f"{policy.name}: rows "
            + (f"with {rule.guard_sql} " if rule.guards else "(no guard: whoever owns them) ")
            + f"whose {rule.age.name} is more than {policy.settings.retention_days} days "
            f"past, deleted in SKIP LOCKED batches, on the database of "
            f"{policy.database_url_env}. A partition is one day; its metadata says what the "
            "run that covered it deleted and what is left (a backfill is one run over its "
            "days, its figures on the last)." + shape
        ),
    )(graph)

    # @graph_asset takes no freshness policy: attach it to the spec.
    freshness = freshness_policy(policy.settings.stale_after)
    return cleanup.map_asset_specs(
        lambda spec: spec.replace_attributes(freshness_policy=freshness))


def _cleanup_ops(policy: Policy, asset_key: dg.AssetKey, settings_of, database_of):
    """The ops every policy's graph has: ``compute_cutoff`` (the run's cutoff), ``purge`` (the
    batched purge of the whole table) and ``measure_backlog`` (the backlog count and the run's
    metadata). ``settings_of`` gives the run's settings from its run limits resource,
    ``database_of`` the policy's database resource from an op's context."""
    rule = policy.rule
    database_key = policy.database_key

    # The alerts: Dagster checks a launch's config only of the resources its run uses, and a
    # launch may not redirect the alerts (deployed_alerts refuses it).
    @dg.op(name=f"{policy.name}_compute_cutoff", config_schema=PURGE_CONFIG,
           required_resource_keys={database_key, policy.run_limits_key, ALERTS_KEY},
           description="The cutoff instant: min(now, end of the partition window) - retention "
                       "days, now by the database server's clock.")
    @op_function
    def compute_cutoff(context: dg.OpExecutionContext) -> dt.datetime:
        """Return the run's cutoff, a timezone-aware UTC datetime (see :func:`run_cutoff`).
        A run that is not of the policy's days fails here, before any read
        (:func:`require_run_partitions`). A database that cannot be read fails the op, retried
        as the purge is for a transient error (see :func:`attempt_failed`)."""
        # A run without its day could not record what it deleted: refused before any read.
        require_run_partitions(context, policy)
        # Dagster's schema lets a negative value through: refused here, not at the first error.
        config = purge_config(context)
        settings = settings_of(context)
        try:
            cutoff = run_cutoff(context, settings.retention_days,
                                run_now(context, database_of(context).engine))
        except ConnectError as exc:
            retry = attempt_failed(context, config, policy, exc)
            if retry is not None:
                raise retry from exc
            raise
        context.log.info(f"run started: run_id={context.run_id} policy={policy.name} "
                         f"table={rule.qualified_name} database={policy.database_url_env} "
                         f"cutoff={cutoff.isoformat()} "
                         f"retention_days={settings.retention_days} "
                         f"batch_size={settings.batch_size} ({_batch_sizes(settings)})")
        return cutoff

    @dg.op(name=f"{policy.name}_purge", pool=policy.pool, config_schema=PURGE_CONFIG,
           required_resource_keys={database_key, policy.run_limits_key, METRICS_KEY},
           description=f"Delete prunable rows of {rule.qualified_name} ({rule.predicate_sql}) in "
                       f"SKIP LOCKED batch transactions, on the database of "
                       f"{policy.database_url_env}.")
    @op_function
    def purge(context: dg.OpExecutionContext, cutoff: dt.datetime) -> RunReport:
        """Run the batched purge and return its record for ``measure_backlog`` (see
        :func:`run_purge_op`)."""
        return run_purge_op(context, purge_config(context), database_of(context), policy,
                            settings_of(context), asset_key, cutoff,
                            metrics=getattr(context.resources, METRICS_KEY))

    @dg.op(name=f"{policy.name}_measure_backlog", out=dg.Out(dg.Nothing),
           pool=policy.database_pool, required_resource_keys={database_key, METRICS_KEY},
           description="Count what the rule still matches and record the run's metadata.")
    @op_function
    def record_backlog(context: dg.AssetExecutionContext, cutoff: dt.datetime,
                       report: RunReport) -> None:
        """Measure the backlog for the run's cutoff, attach the run metadata to the asset
        materialization (of each day of a range run: the run's figures on the last day, a
        reference to it on the others) and push the run's gauges (failed or not)."""
        metrics: MetricsPush = getattr(context.resources, METRICS_KEY)
        try:
            backlog = measure_backlog(database_of(context).engine, rule, cutoff)
        except BacklogError as exc:
            context.log.error(f"run failed: run_id={context.run.run_id} after deleting "
                              f"{report.deleted_total} rows: {exc}")
            # The purge's deletions are committed: report them even though the run fails.
            context.log_event(dg.AssetObservation(asset_key=asset_key,
                                                  metadata=report.as_metadata()))
            metrics.push_run(context, policy, report, succeeded=False)
            name_database(exc, policy)
            raise
        oldest = backlog.oldest_age
        partitions = run_partitions(context)
        context.log.info(f"run completed: deleted_total={report.deleted_total} "
                         f"batches={report.batches} duration_ms={report.duration_ms} "
                         f"backlog={backlog.remaining}"
                         + (f" held={backlog.held}" if rule.hold is not None else "")
                         + (f" partitions={range_text(partitions)}" if partitions else ""))
        report = report.with_backlog(backlog.remaining, oldest.isoformat() if oldest else None,
                                     backlog.held if rule.hold is not None else None,
                                     oldest_key=policy.names.backlog_oldest_key)
        if is_range_run(context):
            # Dagster materializes each day of the range with the output's metadata: give each
            # day its own, so that no total is counted once per day.
            for partition, metadata in report.range_metadata(partitions).items():
                context.add_asset_metadata(metadata, partition_key=partition)
        else:
            context.add_output_metadata(report.as_metadata())
        metrics.push_run(context, policy, report, succeeded=True)

    return compute_cutoff, purge, record_backlog


def _partition_ops(policy: Policy, asset_key: dg.AssetKey, settings_of, database_of):
    """The ops of a policy that purges its table one partition per step: ``plan_partitions``
    (a dynamic output per partition with prunable rows), ``purge_partition`` (the purge on one
    partition) and ``collect_partitions`` (the run's record, summed)."""
    rule = policy.rule
    database_key = policy.database_key

    @dg.op(name=f"{policy.name}_plan_partitions", config_schema=PURGE_CONFIG,
           required_resource_keys={database_key, policy.run_limits_key},
           out={"partitions": dg.DynamicOut(PartitionWork), "plan": dg.Out(PartitionPlan)},
           description=f"Find the partitions of {rule.qualified_name} that hold prunable rows: "
                       "one purge step each.")
    @op_function
    def plan_partitions(context: dg.OpExecutionContext, cutoff: dt.datetime):
        """Yield the run's plan and one :class:`PartitionWork` per partition with prunable
        rows (mapping key: the partition's name). A database error is retried as the purge's
        is (see :func:`attempt_failed`); a table that is not range-partitioned by the age
        column fails the run before anything is deleted."""
        config = purge_config(context)  # refused before the drop phase detaches anything
        settings = settings_of(context)
        started = dt.datetime.now(dt.UTC)
        dropped = None
        try:
            with core_logs_in_run_log(context), StopRequests(context) as stop_requests:
                # A stop ends the drop phase early; the partition steps then stop too.
                dropped = run_drop_phase(context, database_of(context), policy, settings,
                                         cutoff, stop_requests.requested)
            found = partitions_to_purge(context, database_of(context), policy, cutoff)
        except RetentionError as exc:
            # The partitions it detached are gone from the table: a retry does not see them.
            record_detached(context, asset_key, dropped)
            retry = attempt_failed(context, config, policy, exc)
            if retry is not None:
                raise retry from exc
            raise
        deadline = started + settings.max_run_duration
        yield dg.Output(PartitionPlan(started_at=started,
                                      partitions=tuple(p.qualified_name for p in found),
                                      dropped=drop_phase_figures(context, dropped)),
                        output_name="plan")
        for partition, key in zip(found, mapping_keys(found)):
            yield dg.DynamicOutput(PartitionWork(partition, deadline), mapping_key=key,
                                   output_name="partitions")

    @dg.op(name=f"{policy.name}_purge_partition", pool=policy.pool, config_schema=PURGE_CONFIG,
           required_resource_keys={database_key, policy.run_limits_key, METRICS_KEY},
           description=f"Delete prunable rows of one partition of {rule.qualified_name} "
                       f"({rule.predicate_sql}) in SKIP LOCKED batch transactions, on the "
                       f"database of {policy.database_url_env}.")
    @op_function
    def purge_partition(context: dg.OpExecutionContext, cutoff: dt.datetime,
                        work: PartitionWork) -> RunReport:
        """Run the batched purge on one partition, through the table with the rule narrowed to
        the partition's ranges (so the table's statement triggers see its DELETEs), within what
        is left of the run's time budget (at least a second), and return its record (see
        :func:`run_purge_op`)."""
        partition = work.partition
        settings = settings_of(context)
        left = work.deadline - dt.datetime.now(dt.UTC)
        settings = dataclasses.replace(settings,
                                       max_run_duration=max(left, dt.timedelta(seconds=1)))
        # Which process of which host ran the step: the executor decides (a worker, a pod).
        context.log.info(f"partition {partition.qualified_name} {partition.describe_range()}: "
                         f"purged on host {socket.gethostname()} by pid {os.getpid()}")
        report = run_purge_op(context, purge_config(context), database_of(context), policy,
                              settings, asset_key, cutoff,
                              metrics=getattr(context.resources, METRICS_KEY),
                              rule=rule.within(partition.ages))
        # A run stopped before collect_partitions sums the steps never records this step's
        # rows otherwise: its output shows them.
        context.add_output_metadata(report.as_metadata())
        return report

    @dg.op(name=f"{policy.name}_collect_partitions",
           required_resource_keys={policy.run_limits_key},
           description="Sum the partition steps' records into the run's.")
    @op_function
    def collect_partitions(context: dg.OpExecutionContext, cutoff: dt.datetime,
                           plan: PartitionPlan, reports: list[RunReport]) -> RunReport:
        """The run's record: the partition steps' records summed (see
        :meth:`RunReport.combined`); with no partition to purge, a record of nothing deleted,
        so that the asset is still materialized."""
        settings = settings_of(context)
        report = RunReport.combined(reports, cutoff=cutoff.isoformat(), settings=settings,
                                    duration_ms=plan.duration_ms())
        if plan.dropped is not None:  # the plan's drop phase: its partitions and rows
            report = report.with_partitions(*plan.dropped)
        context.log.info(f"{len(reports)} partition steps: deleted_total={report.deleted_total} "
                         f"batches={report.batches}")
        return report

    return plan_partitions, purge_partition, collect_partitions
