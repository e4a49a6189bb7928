"""Asset checks of a policy's cleanup asset, for the SLOs of the table and of the runs; they run
in every run of the job. :func:`build_asset_checks` builds them for one policy; the names are the
same for every policy (checks are named per asset), except the freshness check's and its keys,
which follow the policy's row noun and age column (:mod:`~favorites_maintenance.config.names`;
below, those of the guest-favorites policy: row noun ``guest row``, age column ``updated_at``).

The checks are partitioned like the asset, so each run records exactly one result per check
for each day it covers. (An unpartitioned check on this partitioned asset gets two rows in Dagster's
check history per run: the *planned* execution, stored under the run's partition, and the
result, stored under none; the UI then shows the planned one as "Skipped".)

- ``no_guest_row_older_than_retention_plus_one_day`` (ERROR): the freshness SLO. After a run of
  day ``D`` no row the rule admits may be older than that run's cutoff
  (:func:`~favorites_maintenance.pipeline.partitions.partition_cutoff`) minus one day, i.e.
  ``updated_at < cutoff - 1 day``: the day of slack covers a run's backlog
  and rows skipped because a user held them. For the latest day this is the table's SLO as of
  that day's end; a backfilled past day is judged against its own, older cutoff, never against
  rows only today's cutoff covers.
- ``deleted_total_spike`` (WARN): a run deleted far more than usual, which is what an
  over-deletion or a changed upstream would look like. The run's ``deletedTotal`` is compared
  with the median of up to :data:`SPIKE_HISTORY` earlier materializations of *current* days
  (:func:`~favorites_maintenance.pipeline.partitions.is_current`; backfills of past days, which
  often
  delete 0, are left out of the baseline); it is a spike when it exceeds both ``SPIKE_FACTOR``
  times that median and the median plus :data:`SPIKE_MIN_ROWS` (so a quiet table going from 3
  to 40 rows is no spike). Fewer than :data:`SPIKE_MIN_HISTORY` earlier runs: passes, saying so.

- ``held_rows`` (WARN, passes), only for a policy with a ``hold_table``: how many rows the
  guard and the age admit at the run's cutoff that an active hold keeps (``heldRows``), how
  many holds are active and how long the oldest has stood (``oldestActiveHoldAgeSeconds``),
  how many of them no row of the table has the value of (``holdsMatchingNoRow``: a typo, or
  a row still to come; left out when not counted within 10 seconds), never a held value. A
  hold is deliberate, so the check passes; its figures are for a dashboard, and a hold table
  that cannot be read fails it.

- ``archive_within_retention`` (ERROR), only for a policy with an ``archive_table``: no row the
  policy archived is older than its ``archive_retention_days`` (by the database's clock), i.e.
  the archive's retention ran. It reads the archive as it is, whatever the day; a run whose purge
  failed records it from the purge's step (:func:`archive_check_evaluation`), since the check's
  own step does not run after a failed purge.

A range run (a single-run backfill) records one result per check for every day of its range:
each day is judged by its own materialization, as a run of that day would be. The earlier days
of a range hold a reference to the last day's record, whose figures they do not repeat
(:meth:`~favorites_maintenance.pipeline.run_report.RunReport.range_metadata`): they pass the
spike and skipped-rows checks saying so, are left out of the spike check's baseline, and the
last day is checked with the run's figures. The overdue-rows check counts each day against
that day's own cutoff; the archive's check, which does not depend on the day, refers the
earlier days to the last one as the spike check does.
"""


import datetime as dt
import statistics
import warnings
from collections.abc import Callable, Iterator, Mapping

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.config.names import PolicyNames
from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.dagster_internals import (
    AssetCheckEvaluationTargetMaterializationData,
)
from favorites_maintenance.pipeline.op_functions import op_function
from favorites_maintenance.pipeline.partitions import (
    is_current,
    partition_cutoff,
    policy_partitions,
    run_cutoff,
    run_now,
)
from favorites_maintenance.pipeline.ranges import is_range_run, run_partitions
from favorites_maintenance.pipeline.resources import PolicyDatabase, name_database
from favorites_maintenance.pipeline.run_metadata import ATTRIBUTED_KEY
from favorites_maintenance.pipeline.run_report import RunReport
from favorites_maintenance.retention.archive_retention import count_overdue_archive
from favorites_maintenance.retention.backlog import (
    Backlog,
    compared_as_batches,
    count_held,
    measure_backlog,
)
from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.holds import count_holds_matching_no_row, summarize_holds
from favorites_maintenance.retention.database import error_summary

# Partitioned checks are a preview feature of Dagster 1.13: say it once, here, not at every load.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec",
                        category=dg.PreviewWarning)

SPIKE_HISTORY = 14
SPIKE_MIN_HISTORY = 3
SPIKE_FACTOR = 5.0
SPIKE_MIN_ROWS = 10_000
#: Materializations read per page, and pages at most, when collecting the spike baseline: the
#: cost of a check stays bounded whatever the length of the history.
_PAGE = 50
_MAX_PAGES = 4
#: The archive's check, on a policy with an ``archive_table``.
ARCHIVE_CHECK = "archive_within_retention"
#: The name of the held-rows check of a policy with a hold table.
HELD_CHECK = "held_rows"


#: What a check of the policy evaluates: the run's result for each day it covers (one entry,
#: under the run's day or ``None``, for a run of one day).
Evaluation = Callable[[dg.AssetCheckExecutionContext], dict[str | None, dg.AssetCheckResult]]


def build_asset_checks(policy: Policy) -> list[dg.AssetChecksDefinition]:
    """The asset checks of ``policy``'s cleanup asset (see the module docstring): three, and
    the held-rows and archive checks of a policy with a ``hold_table`` or an
    ``archive_table``, in one definition whose one step (after the asset's) evaluates every
    check the run selected. One step, not one per check: a step is an op in every job
    snapshot Dagster serializes, and an op defined for every check of every policy.

    A check that cannot be evaluated (its database unreachable) does not stop the others:
    they record their results, then the step fails with the first such error, naming its
    check in the run's log.
    """
    asset_key = dg.AssetKey(list(policy.asset_key_path))
    rule = policy.rule
    names = policy.names
    which = f"with {rule.guard_sql} " if rule.guards else ""
    checks: dict[str, tuple[str, Evaluation]] = {
        names.overdue_check: (
            f"SLO: after a day's run, no row {which}whose {rule.age.name} is more than the "
            "retention period plus one day past, measured from that run's cutoff.",
            _overdue_rows(policy)),
        "deleted_total_spike": (
            f"WARN when deletedTotal exceeds {SPIKE_FACTOR:g}x the median of the last "
            f"{SPIKE_HISTORY} current-day runs and that median + {SPIKE_MIN_ROWS:,} rows.",
            _deleted_total_spike(asset_key)),
        "no_rows_skipped": (
            "WARN when the run left prunable rows in place because deleting them failed (a "
            "foreign key, a trigger) or had no effect.",
            _no_rows_skipped(asset_key)),
    }
    if rule.hold is not None:
        checks[HELD_CHECK] = (
            f"How many rows the rule would delete but an active hold of "
            f"{rule.hold.qualified_name} keeps, and how long the oldest active hold has stood "
            "(passes: a hold is deliberate; fails when the hold table cannot be read).",
            _held_rows(policy, asset_key))
    if policy.archive_table is not None:
        checks[ARCHIVE_CHECK] = (
            f"No row archived in {policy.archive_table} by this policy more than "
            f"archive_retention_days ({policy.settings.archive_retention_days}) days ago, by "
            "the database's clock: the archive's retention ran.",
            _archive_within_retention(policy, asset_key))
    # The checks that read the policy's database (their errors name it, once, in the step);
    # the others read Dagster's storage.
    on_database = {names.overdue_check, HELD_CHECK, ARCHIVE_CHECK}
    partitions = policy_partitions(policy)
    specs = [dg.AssetCheckSpec(name, asset=asset_key, description=description,
                               partitions_def=partitions)
             for name, (description, _) in checks.items()]

    @dg.multi_asset_check(
        specs=specs, name=f"{asset_key.to_python_identifier()}_checks", can_subset=True,
        description=f"The asset checks of {asset_key.to_user_string()}.",
        # The policy's own database: the key is its variable's (policy.database_key).
        required_resource_keys={policy.database_key},
    )
    @op_function
    def policy_checks(context: dg.AssetCheckExecutionContext) -> Iterator[CheckOutput]:
        """Evaluate each selected check and yield its results (see :func:`_outcome`)."""
        failed: Exception | None = None
        for spec in specs:
            if spec.key not in context.selected_asset_check_keys:
                continue
            try:
                results = checks[spec.name][1](context)
            except Exception as exc:
                if spec.name in on_database:
                    name_database(exc, policy)
                context.log.error(f"check {spec.name} could not be evaluated: "
                                  f"{error_summary(exc)}")
                failed = failed or exc
                continue
            yield from _outcome(context, spec, results)
        if failed is not None:
            raise failed

    return [policy_checks]


def _overdue_rows(policy: Policy) -> Evaluation:
    """The overdue-rows check: count the rows the rule admits older than ``cutoff - 1 day``,
    where ``cutoff`` is the run's own
    (:func:`~favorites_maintenance.pipeline.partitions.partition_cutoff`), through the backlog
    measurement, on the policy's database; any such row fails (ERROR). In a range run each
    day is counted against its own cutoff."""
    rule, names = policy.rule, policy.names

    def overdue_rows(context: dg.AssetCheckExecutionContext
                     ) -> dict[str | None, dg.AssetCheckResult]:
        days = policy.settings.retention_days
        database: PolicyDatabase = getattr(context.resources, policy.database_key)
        now = run_now(context, database.engine)
        cutoff = run_cutoff(context, days, now)
        latest = measure_backlog(database.engine, rule, cutoff - dt.timedelta(days=1))
        results = {}
        for partition in run_partitions(context)[:-1] if is_range_run(context) else []:
            own = partition_cutoff(partition, days, now=now)
            # An earlier day's limit is older: none of its rows is left if none is left at the
            # last day's, so only a non-zero count needs a query of its own.
            overdue = (measure_backlog(database.engine, rule, own - dt.timedelta(days=1))
                       if latest.remaining else latest)
            results[partition] = _overdue_result(own, overdue, names, rule.older_than)
        results[_last_partition(context)] = _overdue_result(cutoff, latest, names,
                                                            rule.older_than)
        return results

    return overdue_rows


def _deleted_total_spike(asset_key: dg.AssetKey) -> Evaluation:
    """The spike check: this run's ``deletedTotal`` against the median of earlier current-day
    runs."""

    def deleted_total_spike(context: dg.AssetCheckExecutionContext
                            ) -> dict[str | None, dg.AssetCheckResult]:
        results = _references(context, asset_key)
        current, history = _deleted_totals(context.instance, asset_key, context.run.run_id)
        results[_last_partition(context)] = _spike_result(current, history)
        return results

    return deleted_total_spike


def _no_rows_skipped(asset_key: dg.AssetKey) -> Evaluation:
    """The skipped-rows check: this run's ``skippedRows`` and ``skippedCauses``; any skipped
    row fails (WARN). Skipped rows are retried by every run; they stay until the reference or
    trigger that blocks them is dealt with (docs/runbook.md: "Rows are skipped")."""

    def no_rows_skipped(context: dg.AssetCheckExecutionContext
                        ) -> dict[str | None, dg.AssetCheckResult]:
        results = _references(context, asset_key)
        record = _run_materializations(context, asset_key).get(_last_partition(context))
        results[_last_partition(context)] = _skipped_result(
            record.asset_materialization.metadata if record else None)
        return results

    return no_rows_skipped


def _archive_within_retention(policy: Policy, asset_key: dg.AssetKey) -> Evaluation:
    """The archive's check of a policy with an ``archive_table``: no archived row is past the
    archive's retention; any fails (ERROR)."""
    days = policy.settings.archive_retention_days

    def archive_within_retention(context: dg.AssetCheckExecutionContext
                                 ) -> dict[str | None, dg.AssetCheckResult]:
        database: PolicyDatabase = getattr(context.resources, policy.database_key)
        results = _references(context, asset_key, figures={})
        results[_last_partition(context)] = archive_retention_result(database.engine, policy,
                                                                     days)
        return results

    return archive_within_retention


def _held_rows(policy: Policy, asset_key: dg.AssetKey) -> Evaluation:
    """The ``held_rows`` check of a policy with a hold table (see the module docstring): the
    held rows at the run's cutoff and a summary of the active holds."""
    rule = policy.rule

    def held_rows(context: dg.AssetCheckExecutionContext
                  ) -> dict[str | None, dg.AssetCheckResult]:
        database: PolicyDatabase = getattr(context.resources, policy.database_key)
        cutoff = run_cutoff(context, policy.settings.retention_days,
                            run_now(context, database.engine))
        with database.engine.connect() as conn, conn.begin():
            limit_transaction(conn)
            # Read as the run's batches read the holds, as its heldRows is.
            held = conn.execute(count_held(compared_as_batches(conn, rule), cutoff)
                                ).scalar_one()
            summary = summarize_holds(conn, rule.hold)
            unmatched = count_holds_matching_no_row(conn, rule.hold, rule.qualified_name)
        results = _references(context, asset_key, figures={})
        results[_last_partition(context)] = dg.AssetCheckResult(
            passed=True, severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "heldRows": held,
                "activeHolds": summary.active,
                "oldestActiveHoldPlacedAt": (summary.oldest_placed_at.isoformat()
                                             if summary.oldest_placed_at else "none"),
                "oldestActiveHoldAgeSeconds": round(summary.oldest_age_s, 3),
                # Left out when it could not be counted in time (or a hold is not of the
                # column's type: the run's log says so).
                **({"holdsMatchingNoRow": unmatched} if unmatched is not None else {}),
            },
            description=(f"{held} rows past the cutoff are kept by {summary.active} active "
                         f"holds; the oldest was placed {summary.oldest_placed_at.isoformat()}"
                         if summary.oldest_placed_at else None))
        return results

    return held_rows


def archive_retention_result(engine: sa.Engine, policy: Policy,
                             days: int) -> dg.AssetCheckResult:
    """The archive's check of ``policy`` (which has an ``archive_table``) on ``engine``: passes
    when none of its rows was archived more than ``days`` days ago.

    Raises:
        ArchiveCountError: the archive could not be read (a note names the database's
            variable).
    """
    try:
        overdue = count_overdue_archive(engine, policy.archive_table, policy.name, days,
                                        hold=policy.rule.hold)
    except Exception as exc:
        name_database(exc, policy)
        raise
    return dg.AssetCheckResult(
        passed=overdue.rows == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "overdueArchivedRows": overdue.rows,
            "oldestOverdueArchivedAt": overdue.oldest.isoformat() if overdue.oldest else "none",
            "archiveRetentionDays": days,
            "limit": overdue.limit.isoformat(),
        },
        description=(f"{overdue.rows} archived rows of policy {policy.name} in "
                     f"{policy.archive_table} are older than its archive_retention_days "
                     f"({days}): archived before {overdue.limit.isoformat()}"
                     if overdue.rows else None),
    )


def archive_check_evaluation(context: dg.OpExecutionContext, engine: sa.Engine,
                             policy: Policy, days: int) -> dg.AssetCheckEvaluation:
    """The archive's check of ``policy``, evaluated from an op of its run (the purge, after it
    failed: the check's own step is then skipped), for the run's day (the last of a range).
    An archive that cannot be read fails it, saying why."""
    try:
        result = archive_retention_result(engine, policy, days)
    except Exception as exc:
        result = dg.AssetCheckResult(
            passed=False, severity=dg.AssetCheckSeverity.ERROR,
            description=f"{policy.archive_table} could not be read: {error_summary(exc)}")
    partitions = run_partitions(context)
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(list(policy.asset_key_path)), check_name=ARCHIVE_CHECK,
        passed=result.passed, metadata=result.metadata, severity=result.severity,
        description=result.description, partition=partitions[-1] if partitions else None)


def archive_check_left_out(context: dg.OpExecutionContext, policy: Policy) -> bool:
    """Whether the run of ``context`` leaves the archive's check of ``policy`` out of its
    checks' step although it runs the archive's retention: its selection of checks
    (``asset_check_selection``) names others but not this one. Dagster's re-execution from
    asset failure selects only the checks the failed run did not evaluate, and the purge's
    step of a failed run evaluated the archive's (:func:`archive_check_evaluation`); a
    materialization without its checks selects none. ``False`` for a run of every check of its
    job (no selection)."""
    selection = context.run.asset_check_selection
    return (policy.archive_table is not None and selection is not None
            and dg.AssetCheckKey(dg.AssetKey(list(policy.asset_key_path)), ARCHIVE_CHECK)
            not in selection)


#: What a check function yields: one result (a run of one day), or one evaluation per day and
#: the check's output (a range run).
CheckOutput = dg.AssetCheckResult | dg.AssetCheckEvaluation | dg.Output


def _overdue_result(cutoff: dt.datetime, overdue: Backlog, names: PolicyNames,
                    older_than: str = "older than") -> dg.AssetCheckResult:
    """The overdue-rows result of a day whose cutoff is ``cutoff``, from the rows left older
    than ``cutoff - 1 day`` (``overdue``: its count and oldest age), under the policy's
    ``names`` (its keys and row noun); ``older_than`` is how the rule compares an age with the
    limit (:attr:`~favorites_maintenance.retention.rule.RetentionRule.older_than`)."""
    limit = cutoff - dt.timedelta(days=1)
    oldest = overdue.oldest_age
    return dg.AssetCheckResult(
        passed=overdue.remaining == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            names.overdue_key: overdue.remaining,
            names.oldest_overdue_key: oldest.isoformat() if oldest else "none",
            "cutoff": cutoff.isoformat(),
            "limit": limit.isoformat(),
        },
        description=(f"{overdue.remaining} {names.rows} are {older_than} this run's cutoff "
                     f"minus one day ({limit.isoformat()})" if overdue.remaining else None),
    )


def _spike_result(current: int | None, history: list[int]) -> dg.AssetCheckResult:
    """The spike result of a run that deleted ``current`` rows (``None``: it recorded no
    materialization), against the ``history`` of earlier current-day runs."""
    if current is None:
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN,
                                   description="no materialization in this run to check")
    if len(history) < SPIKE_MIN_HISTORY:
        return dg.AssetCheckResult(
            passed=True, severity=dg.AssetCheckSeverity.WARN,
            metadata={"deletedTotal": current, "history": len(history)},
            description=(f"only {len(history)} earlier current-day runs; a spike needs "
                         f"{SPIKE_MIN_HISTORY}"))
    median = statistics.median(history)
    threshold = max(SPIKE_FACTOR * median, median + SPIKE_MIN_ROWS)
    spike = current > threshold
    return dg.AssetCheckResult(
        passed=not spike,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"deletedTotal": current, "median": float(median),
                  "threshold": float(threshold), "history": len(history)},
        description=(f"deletedTotal {current:,} is above {threshold:,.0f} "
                     f"({SPIKE_FACTOR:g}x / +{SPIKE_MIN_ROWS:,} the median {median:,.0f})"
                     if spike else None),
    )


def _skipped_result(metadata: Mapping | None) -> dg.AssetCheckResult:
    """The skipped-rows result of a run whose materialization recorded ``metadata``
    (``None``: it recorded none)."""
    if metadata is None:
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN,
                                   description="no materialization in this run to check")
    run = RunReport.from_metadata(metadata)
    skipped, causes = run.skipped_rows, run.skipped_causes
    return dg.AssetCheckResult(
        passed=skipped == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"skippedRows": skipped, "skippedCauses": causes},
        description=(f"{skipped} prunable rows could not be deleted: {causes}"
                     if skipped else None),
    )


def _last_partition(context: dg.AssetCheckExecutionContext) -> str | None:
    """The day whose materialization holds the run's figures: the run's day, or the last day
    of its range (``None`` for a run without a partition)."""
    partitions = run_partitions(context)
    return partitions[-1] if partitions else None


def _references(context: dg.AssetCheckExecutionContext, asset_key: dg.AssetKey,
                figures: Mapping | None = None) -> dict[str, dg.AssetCheckResult]:
    """The passing result of each earlier day of a range run (none for a run of one day):
    its materialization refers to the last day's, which is the one checked. ``figures``: the
    metadata each holds besides the reference (default ``deletedTotal`` 0)."""
    if not is_range_run(context):
        return {}
    last = _last_partition(context)
    figures = {"deletedTotal": 0} if figures is None else figures
    return {partition: dg.AssetCheckResult(
                passed=True, severity=dg.AssetCheckSeverity.WARN,
                metadata={**figures, ATTRIBUTED_KEY: last},
                description=f"this run's figures are on {last}, the last day of its range")
            for partition in run_partitions(context)[:-1]}


def _run_materializations(context: dg.AssetCheckExecutionContext, asset_key: dg.AssetKey
                          ) -> dict[str | None, dg.EventLogRecord]:
    """The materialization records of this run, by partition (one read of at most as many
    records as the run has days, newest first: this run's are the newest of its days)."""
    partitions = run_partitions(context)
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=partitions or None),
        limit=max(len(partitions), 1) + SPIKE_HISTORY).records
    found: dict[str | None, dg.EventLogRecord] = {}
    for record in records:
        if record.run_id == context.run.run_id and record.asset_materialization is not None:
            found.setdefault(record.partition_key, record)
    return found


def _outcome(context: dg.AssetCheckExecutionContext, spec: dg.AssetCheckSpec,
             results: dict[str | None, dg.AssetCheckResult]) -> Iterator[CheckOutput]:
    """Yield the ``results`` (partition -> result) of the check of ``spec`` as Dagster records
    them.

    A run of one day yields its one result. A range run yields an evaluation for each day,
    each tied to that day's materialization in this run, then the check's output: Dagster
    records a result of a range run under no partition, leaving every day's planned
    execution unresolved.
    """
    if not is_range_run(context):
        [result] = results.values()
        yield dg.AssetCheckResult(
            asset_key=spec.asset_key, check_name=spec.name, passed=result.passed,
            severity=result.severity, metadata=result.metadata,
            description=result.description)
        return
    materialized = _run_materializations(context, spec.asset_key)
    for partition, result in results.items():
        record = materialized.get(partition)
        yield dg.AssetCheckEvaluation(
            asset_key=spec.asset_key, check_name=spec.name, passed=result.passed,
            metadata=result.metadata, severity=result.severity,
            description=result.description, blocking=False, partition=partition,
            target_materialization_data=AssetCheckEvaluationTargetMaterializationData(
                run_id=record.run_id, storage_id=record.storage_id,
                timestamp=record.timestamp) if record else None)
    yield dg.Output(None, output_name=spec.get_python_identifier())


def _deleted_totals(instance: dg.DagsterInstance, asset_key: dg.AssetKey,
                    run_id: str) -> tuple[int | None, list[int]]:
    """This run's ``deletedTotal`` and those of up to :data:`SPIKE_HISTORY` earlier current-day
    materializations, newest first; at most ``_PAGE * _MAX_PAGES`` records are read. A
    reference (an earlier day of a range run) is neither: its run's figures are on another
    day."""
    current, history = None, []
    cursor = None
    for _ in range(_MAX_PAGES):
        page = instance.fetch_materializations(asset_key, limit=_PAGE, cursor=cursor)
        for record in page.records:  # newest first
            mat = record.asset_materialization
            if (mat is None or "deletedTotal" not in mat.metadata
                    or RunReport.is_reference(mat.metadata)):
                continue
            value = RunReport.from_metadata(mat.metadata).deleted_total
            if record.run_id == run_id:
                current = value if current is None else current
            elif is_current(record.partition_key, record.timestamp):
                history.append(value)
        if len(history) >= SPIKE_HISTORY or not page.has_more:
            break
        cursor = page.cursor
    return current, history[:SPIKE_HISTORY]
