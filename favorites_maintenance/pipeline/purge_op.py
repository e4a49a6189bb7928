"""The body of a policy's purge op: the batched purge of the retention core, run inside a
Dagster step, with its progress in the run's log, its retries, its stop requests, its trace and
its metrics.
"""

import dataclasses
import datetime as dt
import logging
import math
import time
from collections.abc import Callable

import dagster as dg
from pydantic import Field

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.config.policy_settings import PolicySettings
from favorites_maintenance.pipeline import tracing
from favorites_maintenance.pipeline.checks import (
    archive_check_evaluation,
    archive_check_left_out,
)
from favorites_maintenance.pipeline.dagster_internals import capture_interrupts
from favorites_maintenance.pipeline.resources import (
    MetricsPush,
    PolicyDatabase,
    name_database,
)
from favorites_maintenance.pipeline.run_log import core_logs_in_run_log, to_run_log
from favorites_maintenance.pipeline.run_report import RunReport
from favorites_maintenance.pipeline.stop_requests import StopRequests
from favorites_maintenance.retention.archive import ArchiveTarget
from favorites_maintenance.retention.archive_retention import ArchivePruneReport, prune_archive
from favorites_maintenance.retention.database import (
    error_summary,
    is_database_error,
    transient_error_kind,
)
from favorites_maintenance.retention.errors import PurgeError, RetentionError
from favorites_maintenance.retention.partition_phase import PartitionDropResult
from favorites_maintenance.retention.partitioned import drop_expired_partitions
from favorites_maintenance.retention.report import BatchResult, PurgeReport, StopReason
from favorites_maintenance.retention.purge import purge
from favorites_maintenance.retention.rule import RetentionRule

#: How often a batch line reaches the run's log, in seconds (the first batch's always does;
#: every batch is logged at DEBUG by the retention core's Python logger). An event written to
#: Dagster's storage for each batch would cost more than the batch itself.
PROGRESS_EVERY_S = 5.0

#: How many of the asset's latest materializations are read for the time per row of the
#: previous run that deleted rows: a month of daily runs, some of which may have found nothing.
PREVIOUS_RUNS_READ = 30


class PurgeConfig(dg.Config):
    """Run config of the ops that reach the favorites database: the purge op
    (``ops.<schema>__<name>_cleanup.ops.purge.config``) and ``compute_cutoff``, which reads
    the database's clock (``...ops.compute_cutoff.config``).

    Attributes:
        max_retries: retries of the op after a transient database error (connection lost,
            serialization failure, deadlock, lock timeout).
        retry_delay_seconds: pause before the first retry, in seconds; doubled at each retry.
    """

    # The descriptions are the launchpad's: its config editor shows them beside each field.
    max_retries: int = Field(
        default=3, ge=0,
        description="Retries of the op after a transient database error (connection lost, "
                    "serialization failure, deadlock, lock timeout); at least 0.")
    retry_delay_seconds: float = Field(
        default=5.0, ge=0,
        description="Pause before the first retry, in seconds, doubled at each retry; at "
                    "least 0.")


#: :class:`PurgeConfig`'s config schema, inferred once: an op that declares it
#: (``config_schema=PURGE_CONFIG``) and reads :func:`purge_config` builds in half the time of
#: one with a ``config: PurgeConfig`` parameter, which Dagster infers again for every op of every
#: policy (0.2 ms an op). The launchpad and run config are the same.
PURGE_CONFIG = PurgeConfig.to_config_schema()


def purge_config(context: dg.OpExecutionContext) -> PurgeConfig:
    """The run config of an op declaring :data:`PURGE_CONFIG`, with its defaults filled in.
    Each op reads it at its start: Dagster's schema takes any number (or null), so a value
    :class:`PurgeConfig` refuses (a negative one) fails the op before it reads the database,
    not only once a transient error asks for it.

    Raises:
        pydantic.ValidationError: naming the field and the bound it breaks."""
    return PurgeConfig(**context.op_config)


def retry_follows(context: dg.OpExecutionContext, config: PurgeConfig,
                  exc: BaseException) -> bool:
    """Whether a failure ``exc`` of this attempt of an op is retried (see
    :func:`attempt_failed`): a transient database error, with retries left."""
    return (transient_error_kind(exc) is not None
            and context.retry_number < config.max_retries)


def attempt_failed(context: dg.OpExecutionContext, config: PurgeConfig, policy: Policy,
                   exc: BaseException, *, batch_no: int = 0,
                   deleted_before: int = 0) -> dg.RetryRequested | None:
    """Log the failure of this attempt of an op and say whether a retry follows.

    A transient database error (see :func:`~favorites_maintenance.retention.database.
    transient_error_kind`) with retries left is logged at WARNING as a retry, and the
    ``RetryRequested`` to raise is returned: a run that then succeeds has no ERROR line of
    ours. Any other failure is the run's: ``run failed: ...`` at ERROR, and ``None``.

    Args:
        batch_no: the batch (1-based) the failure came from; 0 before the first.
        deleted_before: rows this attempt had deleted and committed.
    """
    database = _failed_database(exc, policy)
    fields = (f"run_id={context.run_id} policy={policy.name} batch_no={batch_no} "
              f"deleted_before={deleted_before} database={database} "
              f"error={error_summary(exc)}")
    if database != "dagster_storage":
        name_database(exc, policy)
    if retry_follows(context, config, exc):
        wait = config.retry_delay_seconds * 2 ** context.retry_number
        context.log.warning(f"transient database error ({transient_error_kind(exc)}); retry "
                            f"{context.retry_number + 1}/{config.max_retries} in {wait:g} s: "
                            f"attempt {context.retry_number + 1} failed: {fields}")
        return dg.RetryRequested(max_retries=config.max_retries, seconds_to_wait=wait)
    context.log.error(f"run failed: {fields}")
    return None


def run_purge_op(context: dg.OpExecutionContext, config: PurgeConfig,
                 database: PolicyDatabase, policy: Policy, settings: PolicySettings,
                 asset_key: dg.AssetKey,
                 cutoff: dt.datetime, metrics: MetricsPush | None = None,
                 rule: RetentionRule | None = None) -> RunReport:
    """The body of a policy's purge op: the batched purge, its progress in the run's log, its
    retries and its stop requests; returns the run's record for ``measure_backlog``.

    ``rule`` is the policy's rule narrowed to one partition's ranges of the age column (a
    partition purged by a step of its own, through the table; default: the policy's rule); the
    record then counts that step's rows and its own retries.

    A transient database error (see :func:`~favorites_maintenance.retention.database.
    transient_error_kind`) retries the op with exponential backoff; batches committed before it
    stay deleted (recorded as an asset observation) and the retry goes on from there; the
    run's ``deletedTotal`` and ``batches`` count every attempt. The retry is requested
    explicitly rather than by a declarative ``RetryPolicy``, which would turn a termination
    into a retry.

    A termination request (UI "Terminate", SIGTERM) is captured, never raised mid-batch, and
    checked before each batch, with the run's CANCELING status (see
    :class:`~favorites_maintenance.pipeline.stop_requests.StopRequests`):
    the open batch commits, no batch starts after the request, and the op then raises
    Dagster's interruption so the run ends CANCELED rather than SUCCESS. What was deleted
    before the stop is recorded as an asset observation.

    The first batch is sized from the time per row of the asset's previous run that deleted
    rows (:func:`previous_row_s`; see :mod:`~favorites_maintenance.retention.batch_size`), or
    has ``batch_size`` rows when none is recorded: the time budget cannot stop a batch in
    flight.

    A failure that ends the run (no retry left) and a stop push the run's gauges to
    ``metrics``, if given, with ``last_run_success`` 0. With an archive, a failure that ends
    the run still runs the archive's retention and records its check
    (:meth:`PurgeStep.archive_after_failure`).

    The purge is the span ``<policy>.cleanup``, parent of the batch spans, exported only when
    an OTLP endpoint is configured (:mod:`favorites_maintenance.pipeline.tracing`).

    Raises:
        BatchError: a batch failed and was rolled back (not transient, or out of retries).
        RetryRequested: a transient database error, retries left.
        DagsterExecutionInterruptedError: after a stop request.
    """
    return PurgeStep(context, config, database, policy, settings, asset_key, cutoff,
                     metrics, rule=rule or policy.rule).run()


def previous_row_s(instance: dg.DagsterInstance, asset_key: dg.AssetKey) -> float | None:
    """The time a row took in the batch transactions of the latest run of ``asset_key`` that
    recorded one (``msPerRow`` of its materialization, among the latest
    :data:`PREVIOUS_RUNS_READ`, any partition), in seconds; ``None`` when none did (a new
    policy, runs that deleted nothing, records older than the figure)."""
    for record in instance.fetch_materializations(asset_key, limit=PREVIOUS_RUNS_READ).records:
        materialization = record.asset_materialization
        item = materialization.metadata.get("msPerRow") if materialization else None
        value = getattr(item, "value", item)
        if (isinstance(value, int | float) and not isinstance(value, bool)
                and 0 < value < math.inf):
            return value / 1000
    return None


def run_drop_phase(context: dg.OpExecutionContext, database: PolicyDatabase,
                   policy: Policy, settings: PolicySettings, cutoff: dt.datetime,
                   should_stop: Callable[[], bool] = lambda: False,
                   ) -> PartitionDropResult | None:
    """With ``drop_expired_partitions``: detach the partitions of the policy's table wholly
    before ``cutoff`` that hold nothing the rule keeps, finish an interrupted detach, drop the
    detached tables whose ``detached_retention`` is over (:func:`~favorites_maintenance.
    retention.partitioned.drop_expired_partitions`), each decision in the run's log; ``None``
    without the setting. Runs before the batches (or the partition steps), which then delete
    the prunable rows of every partition left attached. ``should_stop`` (the run's stop
    requests) ends the phase early, the partitions not reached left attached.

    Raises:
        TableShapeError: the table is not range-partitioned by the age column.
        TableCheckError: its catalogs could not be read.
    """
    if not settings.drop_expired_partitions:
        return None
    result = drop_expired_partitions(database.engine, policy.rule, cutoff,
                                     detached_retention=settings.detached_retention,
                                     should_stop=should_stop)
    later = [d.partition for d in result.decisions if d.ends_after_cutoff]
    for decision in result.decisions:
        if not decision.ends_after_cutoff:
            to_run_log(context, logging.INFO, decision.describe())
    if later:
        to_run_log(context, logging.INFO,
                   f"{len(later)} partitions end after the cutoff {cutoff.isoformat()} "
                   f"({later[0]} ... {later[-1]}): kept")
    to_run_log(context, logging.INFO,
               f"partitions: {len(result.detached)} detached ({result.rows_removed:,} rows), "
               f"{len(result.dropped)} dropped; the batches delete the prunable rows of the "
               "others")
    return result


def record_detached(context: dg.OpExecutionContext, asset_key: dg.AssetKey,
                    dropped: PartitionDropResult | None) -> None:
    """Before a failed attempt of the plan of partition steps ends: record what its drop
    phase detached and dropped as an observation with ``failedBatch`` 0, so that a retry,
    which finds those partitions gone and detaches nothing, still counts their rows (see
    :func:`drop_phase_figures`). Nothing when it detached and dropped nothing."""
    if dropped is None or not (dropped.detached or dropped.dropped):
        return
    record = RunReport(deleted_total=0, batches=0).with_partitions(*dropped.figures())
    context.log_event(dg.AssetObservation(asset_key=asset_key, metadata={
        **record.as_metadata(), "failedBatch": 0, "attempt": context.retry_number + 1}))


def drop_phase_figures(context: dg.OpExecutionContext,
                       dropped: PartitionDropResult | None) -> tuple[int, int, int] | None:
    """(partitions detached, detached tables dropped, rows of the detached partitions) of
    this attempt's drop phase and of the failed attempts of this op before it (see
    :func:`record_detached`); ``None`` without ``drop_expired_partitions``."""
    if dropped is None:
        return None
    detached, dropped_tables, rows = dropped.figures()
    earlier = _committed_by_earlier_attempts(context)
    if earlier is None:
        return detached, dropped_tables, rows
    return (detached + (earlier.partitions_detached or 0),
            dropped_tables + (earlier.partitions_dropped or 0), rows + earlier.deleted_total)


@dataclasses.dataclass
class PurgeStep:
    """One attempt of a policy's purge op (see :func:`run_purge_op`), its steps named: the
    purge inside its stop requests and span (:meth:`run`), the progress lines
    (:meth:`on_batch`), a failure (:meth:`failed`), a stop (:meth:`stopped`)."""

    context: dg.OpExecutionContext
    config: PurgeConfig
    database: PolicyDatabase
    policy: Policy
    settings: PolicySettings
    asset_key: dg.AssetKey
    cutoff: dt.datetime
    metrics: MetricsPush | None = None
    #: The rule purged: the policy's, or the policy's narrowed to one partition's ranges.
    rule: RetentionRule | None = None
    last_progress: float = dataclasses.field(default_factory=time.monotonic)
    #: What this attempt's drop phase did, once it ran.
    dropped: PartitionDropResult | None = None
    #: When this attempt started (``time.monotonic()``, seconds).
    started: float = dataclasses.field(default_factory=time.monotonic)

    def __post_init__(self):
        if self.rule is None:
            self.rule = self.policy.rule

    def run(self) -> RunReport:
        """Run the purge; return the run's record, or raise as :func:`run_purge_op` says."""
        context, settings = self.context, self.settings
        tracing.setup()  # idempotent: the first purge of the process installs the exporter
        # capture_interrupts only works on the main thread; elsewhere nothing captures it.
        with capture_interrupts(), core_logs_in_run_log(context), \
                StopRequests(context) as stop_requests, tracing.run_span(
                    self.policy.name, self.database.engine, self.rule,
                    run_id=context.run_id,
                    partition=context.partition_key if context.has_partition_key else None,
                    retry_number=context.retry_number, cutoff=self.cutoff,
                    retention_days=settings.retention_days,
                    batch_size=settings.batch_size) as span:
            try:
                dropped = self.drop_expired_partitions(stop_requests.requested)
                known_row_s = previous_row_s(context.instance, self.asset_key)
                report = purge(
                    self.database.engine, self.rule, self.cutoff,
                    settings.purge_options(known_row_s),
                    should_stop=stop_requests.requested, on_batch=self.on_batch,
                    archive=self.archive_target())
            except Exception as exc:
                tracing.run_failed(span, exc)
                self.failed(exc, archive=self.archive_after_failure(exc, stop_requests))
                raise
            # A request that arrived during the last batch is still a request: the flag is
            # only visible inside capture_interrupts, which resets it on exit.
            if (report.stop_reason is not StopReason.STOP_REQUESTED
                    and stop_requests.requested(read_now=True)):
                report = dataclasses.replace(report, stop_reason=StopReason.STOP_REQUESTED)
            tracing.run_done(span, report)
            summary = RunReport.of_purge(report, settings)
            if dropped is not None:
                summary = summary.with_partitions(len(dropped.detached), len(dropped.dropped),
                                                  dropped.rows_removed)
            summary = summary.after(_committed_by_earlier_attempts(context))
            if (self.policy.archive_table is not None
                    and report.stop_reason is not StopReason.STOP_REQUESTED):
                summary = self.prune_archive(summary, report, stop_requests)
            if report.stop_reason is StopReason.STOP_REQUESTED:
                # Still inside capture_interrupts: a signal now cannot cut this record short.
                self.stopped(report, summary)
        return summary

    def drop_expired_partitions(self, should_stop: Callable[[], bool],
                                ) -> PartitionDropResult | None:
        """The drop phase (:func:`run_drop_phase`) when this step purges the policy's whole
        table; ``None`` for a partition step (the plan ran it before the steps) or without
        ``drop_expired_partitions``."""
        if self.rule != self.policy.rule:
            return None
        self.dropped = run_drop_phase(self.context, self.database, self.policy, self.settings,
                                      self.cutoff, should_stop)
        return self.dropped

    def archive_target(self) -> ArchiveTarget | None:
        """Where the batches move their rows: the policy's archive, stamped with this run's id
        and the policy's name; ``None`` for a policy without an archive."""
        if self.policy.archive_table is None:
            return None
        return ArchiveTarget(self.policy.archive_table, self.policy.name, self.context.run_id)

    def prune_archive(self, summary: RunReport, report: PurgeReport,
                      stop_requests: StopRequests) -> RunReport:
        """After the purge: delete the archive's rows past ``archive_retention_days`` in
        batches of at most ``batch_size_max`` rows, within what is left of the run's time
        budget (at least one batch), and record its figures (``archiveDeletedTotal``,
        ``archiveRows``), and the archive's check when the run leaves it out of its checks' step
        (:func:`~favorites_maintenance.pipeline.checks.archive_check_left_out`). A failure fails
        the step like a failed batch (retried when transient)."""
        settings = self.settings
        left = settings.max_run_duration - dt.timedelta(seconds=report.duration_s)
        try:
            pruned = prune_archive(
                self.database.engine, self.policy.archive_table, self.policy.name,
                settings.archive_retention_days, batch_size=settings.batch_size_max,
                max_duration=max(left, dt.timedelta(0)), should_stop=stop_requests.requested,
                hold=self.policy.rule.hold)
        except Exception as exc:
            if not retry_follows(self.context, self.config, exc):
                self.record_archive_check()  # the check's own step will not run
            # The purge's batches are committed: the failure's record (and a retry) counts them.
            self.failed(exc, purged=report)
            raise
        to_run_log(self.context, logging.INFO,
                   f"archive {self.policy.archive_table}: {pruned.deleted_total} rows archived "
                   f"more than {settings.archive_retention_days} days ago deleted, "
                   f"{pruned.rows} rows of the policy kept")
        if archive_check_left_out(self.context, self.policy):
            # A re-execution from asset failure: else the check stays as the failed run left it.
            self.record_archive_check()
        return summary.with_archive(pruned.deleted_total, pruned.rows)

    def archive_after_failure(self, exc: Exception,
                              stop_requests: StopRequests) -> ArchivePruneReport | None:
        """After a purge that failed for good (``exc``, no retry follows), with an archive:
        run the archive's retention all the same, within what is left of the run's time budget
        (at least one batch), so that a refused purge (a migration the archive does not fit
        yet) never keeps archived rows past ``archive_retention_days``. What it did, or why it
        could not, is added to ``exc`` as a note (Dagster shows it with the step's error) and
        logged; the archive's check is recorded (:meth:`record_archive_check`). Returns its
        report, or ``None`` when it did not run or failed."""
        if self.policy.archive_table is None or retry_follows(self.context, self.config, exc):
            return None
        settings, archive = self.settings, self.policy.archive_table
        days = settings.archive_retention_days
        left = settings.max_run_duration - dt.timedelta(seconds=time.monotonic() - self.started)
        pruned = None
        try:
            pruned = prune_archive(
                self.database.engine, archive, self.policy.name, days,
                batch_size=settings.batch_size_max, max_duration=max(left, dt.timedelta(0)),
                should_stop=stop_requests.requested, hold=self.policy.rule.hold)
        except Exception as failure:
            why = str(failure) if isinstance(failure, RetentionError) else error_summary(failure)
            note = (f"the archive's retention did not "
                    f"{'finish' if getattr(failure, 'deleted_total', 0) else 'run'}: {why}; "
                    f"the rows of {archive} archived more than {days} days ago stay until a "
                    f"run deletes them")
            level = logging.WARNING
        else:
            note = (f"the archive's retention ran all the same: {pruned.deleted_total} rows of "
                    f"{archive} archived more than {days} days ago deleted, {pruned.rows} rows "
                    f"of the policy kept"
                    + (" (stopped with rows left, for the next run)" if pruned.stopped else ""))
            level = logging.INFO
        exc.add_note(note)
        to_run_log(self.context, level, f"archive {archive}: {note}")
        self.record_archive_check()
        return pruned

    def record_archive_check(self) -> None:
        """Record the archive's check (``archive_within_retention``) for this run from this
        step: after a failure that ends the run, the check's own step is skipped."""
        self.context.log_event(archive_check_evaluation(
            self.context, self.database.engine, self.policy,
            self.settings.archive_retention_days))

    def on_batch(self, batch: BatchResult) -> None:
        """A progress line in the run's log: the first batch, then every
        :data:`PROGRESS_EVERY_S` seconds."""
        if batch.deleted == 0:  # not a batch in the run's metadata (`batches` counts none)
            if batch.batch_no == 1:
                noun = self.policy.names.row_noun
                to_run_log(self.context, logging.INFO,
                           f"nothing to delete: no {noun} {self.rule.older_than} "
                           f"{self.cutoff.isoformat()} that no other session holds")
            return
        now = time.monotonic()
        line = (f"batch {batch.batch_no} deleted {batch.deleted} rows "
                f"({batch.deleted_total} so far)")
        if batch.batch_no == 1 or now - self.last_progress >= PROGRESS_EVERY_S:
            self.last_progress = now
            to_run_log(self.context, logging.INFO, line)

    def failed(self, exc: Exception, purged: PurgeReport | None = None,
               archive: ArchivePruneReport | None = None) -> None:
        """Log the failure, record what stays deleted (``purged``: the report of a purge that
        finished before ``exc``, else the one ``exc`` carries; ``archive``: what the archive's
        retention did after it), and request a retry for a transient error with retries left
        (raises ``RetryRequested``); otherwise push the run's gauges and return, so the caller
        re-raises ``exc``."""
        context, settings = self.context, self.settings
        failed_report = purged or (getattr(exc, "report", None)
                                   if isinstance(exc, PurgeError) else None)
        # BatchError, SkippedRowsError and NoProgressError name the batch; errors before the
        # first batch (a standby, the table's shape) have none.
        batch_no = getattr(exc, "batch_no", 0) if isinstance(exc, PurgeError) else 0
        deleted_before = failed_report.deleted_total if failed_report else 0
        if self.dropped is not None:
            deleted_before += self.dropped.rows_removed
        earlier = _committed_by_earlier_attempts(context)  # before this attempt's record
        retry = attempt_failed(context, self.config, self.policy, exc, batch_no=batch_no,
                               deleted_before=deleted_before)
        this_attempt = (RunReport.of_purge(failed_report, settings) if failed_report
                        else RunReport(deleted_total=0, batches=0))
        if self.dropped is not None:
            this_attempt = this_attempt.with_partitions(
                len(self.dropped.detached), len(self.dropped.dropped), self.dropped.rows_removed)
        if archive is not None:
            this_attempt = this_attempt.with_archive(archive.deleted_total, archive.rows)
        if deleted_before or (failed_report and failed_report.skipped_rows) or (
                self.dropped is not None and self.dropped.dropped) or archive is not None:
            # Those rows stay deleted: say so, and let a retry of this op count them.
            context.log_event(dg.AssetObservation(asset_key=self.asset_key, metadata={
                **this_attempt.as_metadata(),
                "failedBatch": batch_no, "attempt": context.retry_number + 1}))
        if retry is not None:
            raise retry from exc
        if self.metrics is not None:
            self.metrics.push_run(context, self.policy, this_attempt.after(earlier),
                                  succeeded=False)

    def stopped(self, report: PurgeReport, summary: RunReport) -> None:
        """Record what a stopped purge deleted and end the step as interrupted, so the run
        ends CANCELED.

        Raises:
            DagsterExecutionInterruptedError: always.
        """
        stopped = (f"stopped on request after {report.batches} batches: "
                   f"{report.deleted_total} rows deleted and committed; the run ends CANCELED")
        self.context.log.warning(f"run {stopped} (Dagster shows this step as interrupted and "
                                 "the steps after it as not executed)")
        self.context.log_event(dg.AssetObservation(asset_key=self.asset_key,
                                                   metadata=summary.as_metadata()))
        if self.metrics is not None:
            self.metrics.push_run(self.context, self.policy, summary, succeeded=False)
        raise dg.DagsterExecutionInterruptedError(stopped)


def _committed_by_earlier_attempts(context: dg.OpExecutionContext) -> RunReport | None:
    """Rows and batches that failed attempts of this op committed in this run (op retries),
    or ``None`` on the first attempt.

    Each failed attempt records its
    :class:`~favorites_maintenance.pipeline.run_report.RunReport` as an observation with
    ``failedBatch``; the run's ``deletedTotal`` and ``batches`` are the sum
    over its attempts, not the last one alone. Only this step's attempts count: the other
    partition steps of a run count their own.
    """
    if context.retry_number == 0:
        return None
    step_key = context.get_step_execution_context().step.key
    total = RunReport(deleted_total=0, batches=0)
    for entry in context.instance.all_logs(context.run_id,
                                           of_type=dg.DagsterEventType.ASSET_OBSERVATION):
        observation = entry.asset_observation
        if (observation is None or "failedBatch" not in observation.metadata
                or entry.step_key != step_key):
            continue
        total = RunReport.from_metadata(observation.metadata).after(total)
    return total


def _failed_database(exc: BaseException, policy: Policy) -> str:
    """Which database an error came from, for the log: the variable of the policy's database,
    or ``dagster_storage``. The core wraps every error of the policy's database in its own
    exceptions, so a bare driver error here is Dagster's."""
    if not isinstance(exc, RetentionError) and is_database_error(exc):
        return "dagster_storage"
    return policy.database_url_env
