"""A policy's cleanup as an op graph ``compute_cutoff -> purge -> measure_backlog``.

:func:`build_cleanup_asset` exposes the graph as a daily-partitioned graph-backed asset, one per
policy, so runs can be launched and backfilled from the UI. Dagster puts only the terminal op's
output metadata on the asset materialization, so the purge report travels to
``measure_backlog``, which records it.

Each policy has its own op definitions (``<name>_purge``, ...: Dagster refuses two definitions
of one name in a code location, and the purge's concurrency pool is the policy's), used under
the same node names in every graph: ``compute_cutoff``, ``purge``, ``measure_backlog``. Run
config and step keys read the same for every policy, e.g.
``ops.favorites__guest_favorites_cleanup.ops.purge.config``.
"""

import contextlib
import dataclasses
import datetime as dt
import logging
import math
import threading
import time

import dagster as dg
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.storage.event_log import (
    ConsolidatedSqliteEventLogStorage,
    SqliteEventLogStorage,
)
from dagster._utils.interrupts import capture_interrupts, check_captured_interrupt
from pydantic import Field

from favorites_maintenance import tracing
from favorites_maintenance.partitions import daily_partitions, partition_cutoff
from favorites_maintenance.policy import GUEST_POLICY, Policy
from favorites_maintenance.resources import (
    FavoritesDatabase,
    MetricsPush,
    RunLimits,
    health_limits,
)
from favorites_maintenance.retention.backlog import measure_backlog as count_backlog
from favorites_maintenance.retention.database import (
    error_summary,
    is_database_error,
    transient_error_kind,
)
from favorites_maintenance.retention.errors import (
    BacklogError,
    BatchError,
    PurgeError,
    RetentionError,
)
from favorites_maintenance.retention.purge import BatchResult, StopReason
from favorites_maintenance.retention.purge import purge as run_purge
from favorites_maintenance.run_report import RunReport
from favorites_maintenance.settings import PolicySettings

#: The guest-favorites cleanup asset's key.
ASSET_KEY = dg.AssetKey(list(GUEST_POLICY.asset_key_path))

#: Concurrency pool of the guest-favorites purge op (each policy has its own, ``<name>_cleanup``):
#: with run granularity and limit 1 in ``dagster.yaml``, at most one cleanup run of a policy is
#: in progress, whoever launched it (Laravel's ``withoutOverlapping``).
POOL = GUEST_POLICY.pool

#: Warn when the asset has not been materialized for 26 h, fail after 48 h (the alert threshold).
FRESHNESS_POLICY = dg.FreshnessPolicy.time_window(fail_window=dt.timedelta(hours=48),
                                                  warn_window=dt.timedelta(hours=26))

#: How often a batch line reaches the run's log, in seconds (the first batch's always does;
#: every batch is logged at DEBUG by the retention core's Python logger). An event written to
#: Dagster's storage for each batch would cost more than the batch itself.
PROGRESS_EVERY_S = 5.0

#: How often the purge reads its run's status from Dagster's storage, in seconds, when no
#: interrupt or pushed event has told it of a stop request. A read opens a connection to the
#: storage (about 25 ms against PostgreSQL), longer than a batch.
STATUS_EVERY_S = 1.0

#: The retention core logs through Python's ``logging``; its records at INFO and above (skipped
#: rows and their causes, a missing index, a stale statement) are shown in the run's log too.
CORE_LOGGER = "favorites_maintenance.retention"

_log = logging.getLogger(__name__)


class PurgeConfig(dg.Config):
    """Run config of the purge op (``ops.<schema>__<name>_cleanup.ops.purge.config``).

    Attributes:
        max_retries: retries of the op after a transient database error (connection lost,
            serialization failure, deadlock, lock timeout).
        retry_delay_seconds: pause before the first retry, in seconds; doubled at each retry.
    """

    max_retries: int = Field(default=3, ge=0)
    retry_delay_seconds: float = Field(default=5.0, ge=0)


def build_cleanup_asset(policy: Policy) -> dg.AssetsDefinition:
    """The cleanup asset of ``policy``: key ``<schema>/<name>_cleanup``, daily partitions, the
    graph ``compute_cutoff -> purge -> measure_backlog``, and a freshness policy (warn after
    26 h, fail after 48 h without a materialization).

    The ops read the ``database`` resource (:class:`~favorites_maintenance.resources.
    FavoritesDatabase`) and the ``retention`` resource (:class:`~favorites_maintenance.
    resources.RunLimits`: what a launch changed of the policy's batch size and time budget).
    """
    rule = policy.rule
    asset_key = dg.AssetKey(list(policy.asset_key_path))

    def settings_of(limits: RunLimits):
        return limits.apply(policy.settings)

    @dg.op(name=f"{policy.name}_compute_cutoff",
           description="The cutoff instant: min(now, end of the partition window) - retention "
                       "days.")
    def compute_cutoff(context: dg.OpExecutionContext, retention: RunLimits) -> dt.datetime:
        """Return the run's cutoff, a timezone-aware UTC datetime (see :func:`run_cutoff`)."""
        settings = settings_of(retention)
        cutoff = run_cutoff(context, settings.retention_days)
        context.log.info(f"run started: run_id={context.run_id} policy={policy.name} "
                         f"table={rule.qualified_name} cutoff={cutoff.isoformat()} "
                         f"retention_days={settings.retention_days} "
                         f"batch_size={settings.batch_size}"
                         + (f" (adaptive up to {settings.batch_size_max}, target "
                            f"{settings.target_batch_duration.total_seconds() * 1000:g} ms)"
                            if settings.target_batch_duration else ""))
        return cutoff

    @dg.op(name=f"{policy.name}_purge", pool=policy.pool,
           description=f"Delete prunable rows of {rule.qualified_name} ({rule.guard_sql}) in "
                       "SKIP LOCKED batch transactions.")
    def purge(context: dg.OpExecutionContext, config: PurgeConfig, database: FavoritesDatabase,
              retention: RunLimits, metrics: MetricsPush, cutoff: dt.datetime) -> RunReport:
        """Run the batched purge and return its record for ``measure_backlog`` (see
        :func:`run_purge_op`)."""
        return run_purge_op(context, config, database, policy, settings_of(retention),
                            asset_key, cutoff, metrics=metrics)

    @dg.op(name=f"{policy.name}_measure_backlog", out=dg.Out(dg.Nothing),
           description="Count what the rule still matches and record the run's metadata.")
    def measure_backlog(context: dg.OpExecutionContext, database: FavoritesDatabase,
                        metrics: MetricsPush, cutoff: dt.datetime, report: RunReport) -> None:
        """Measure the backlog for the run's cutoff, attach the run metadata to the asset
        materialization and push the run's gauges (failed or not)."""
        try:
            backlog = count_backlog(database.engine, cutoff, rule)
        except BacklogError as exc:
            context.log.error(f"run failed: run_id={context.run_id} after deleting "
                              f"{report.deleted_total} rows: {exc}")
            # The purge's deletions are committed: report them even though the run fails.
            context.log_event(dg.AssetObservation(asset_key=asset_key,
                                                  metadata=report.as_metadata()))
            metrics.push_run(context, policy, report, succeeded=False)
            raise
        oldest = backlog.oldest_updated_at
        context.log.info(f"run completed: deleted_total={report.deleted_total} "
                         f"batches={report.batches} duration_ms={report.duration_ms} "
                         f"backlog={backlog.remaining}")
        report = report.with_backlog(backlog.remaining, oldest.isoformat() if oldest else None)
        context.add_output_metadata(report.as_metadata())
        metrics.push_run(context, policy, report, succeeded=True)

    @dg.graph_asset(
        key=asset_key,
        partitions_def=daily_partitions,
        group_name="maintenance",
        kinds={"postgres"},
        description=(
            f"Stale rows removed from {rule.qualified_name} by retention policy "
            f"{policy.name}: rows with {rule.guard_sql} idle ({rule.age.name}) longer than "
            f"{policy.settings.retention_days} days, deleted in SKIP LOCKED batches. A "
            "partition is one daily run; its metadata says what was deleted and what is left."
        ),
    )
    def cleanup():
        cutoff = compute_cutoff.alias("compute_cutoff")()
        return measure_backlog.alias("measure_backlog")(cutoff,
                                                        purge.alias("purge")(cutoff))

    # @graph_asset takes no freshness policy: attach it to the spec.
    return cleanup.map_asset_specs(
        lambda spec: spec.replace_attributes(freshness_policy=FRESHNESS_POLICY))


def run_cutoff(context: dg.OpExecutionContext | dg.AssetCheckExecutionContext,
               retention_days: int) -> dt.datetime:
    """The cutoff of the run of ``context`` (see :func:`~favorites_maintenance.partitions.
    partition_cutoff`); a run of a range of days (a single-run backfill) uses its last day."""
    key = None
    if context.has_partition_key:
        key = context.partition_key
    elif getattr(context, "has_partition_key_range", False):
        key = context.partition_key_range.end
    return partition_cutoff(key, retention_days)


def run_purge_op(context: dg.OpExecutionContext, config: PurgeConfig,
                 database: FavoritesDatabase, policy: Policy, settings: PolicySettings,
                 asset_key: dg.AssetKey,
                 cutoff: dt.datetime, metrics: MetricsPush | None = None) -> RunReport:
    """The body of a policy's purge op: the batched purge, its progress in the run's log, its
    retries and its stop requests; returns the run's record for ``measure_backlog``.

    A transient database error (see :func:`~favorites_maintenance.retention.database.
    transient_error_kind`) retries the op with exponential backoff; batches committed before it
    stay deleted (recorded as an asset observation) and the retry goes on from there; the
    run's ``deletedTotal`` and ``batches`` count every attempt. The retry is requested
    explicitly rather than by a declarative ``RetryPolicy``, which would turn a termination
    into a retry.

    A termination request (UI "Terminate", SIGTERM) is captured, never raised mid-batch, and
    checked before each batch, with the run's CANCELING status (see :class:`_StopRequests`):
    the open batch commits, no batch starts after the request, and the op then raises
    Dagster's interruption so the run ends CANCELED rather than SUCCESS. What was deleted
    before the stop is recorded as an asset observation.

    A failure that ends the run (no retry left) and a stop push the run's gauges to
    ``metrics``, if given, with ``last_run_success`` 0.

    The purge is the span ``<policy>.cleanup``, parent of the batch spans, exported only when
    an OTLP endpoint is configured (:mod:`favorites_maintenance.tracing`).

    Raises:
        BatchError: a batch failed and was rolled back (not transient, or out of retries).
        RetryRequested: a transient database error, retries left.
        DagsterExecutionInterruptedError: after a stop request.
    """
    last_progress = time.monotonic()

    def on_batch(batch: BatchResult) -> None:
        nonlocal last_progress
        if batch.deleted == 0:  # not a batch in the run's metadata (`batches` counts none)
            if batch.batch_no == 1:
                _to_run_log(context, logging.INFO,
                            f"nothing to delete: no guest row older than "
                            f"{cutoff.isoformat()} that no other session holds")
            return
        now = time.monotonic()
        line = (f"batch {batch.batch_no} deleted {batch.deleted} rows "
                f"({batch.deleted_total} so far)")
        if batch.batch_no == 1 or now - last_progress >= PROGRESS_EVERY_S:
            last_progress = now
            _to_run_log(context, logging.INFO, line)

    tracing.setup()  # idempotent: the first purge of the process installs the exporter
    # capture_interrupts only works on the main thread; elsewhere nothing captures the signal.
    with capture_interrupts(), _core_logs_in_run_log(context), \
            _StopRequests(context) as stop_requests, tracing.run_span(
                policy.name, database.engine, policy.rule, run_id=context.run_id,
                partition=context.partition_key if context.has_partition_key else None,
                retry_number=context.retry_number, cutoff=cutoff,
                retention_days=settings.retention_days,
                batch_size=settings.batch_size) as span:
        try:
            report = run_purge(
                database.engine, cutoff,
                batch_size=settings.batch_size,
                max_run_duration=settings.max_run_duration,
                should_stop=stop_requests.requested,
                on_batch=on_batch,
                batch_size_max=settings.batch_size_max,
                target_batch_duration=settings.target_batch_duration,
                health=health_limits(settings),
                rule=policy.rule,
            )
        except Exception as exc:
            tracing.run_failed(span, exc)
            failed_report = getattr(exc, "report", None) if isinstance(exc, PurgeError) else None
            batch_no = exc.batch_no if isinstance(exc, BatchError) else 0
            deleted_before = failed_report.deleted_total if failed_report else 0
            earlier = _committed_by_earlier_attempts(context)  # before this attempt's record
            context.log.error(f"run failed: run_id={context.run_id} policy={policy.name} "
                              f"batch_no={batch_no} deleted_before={deleted_before} "
                              f"database={_failed_database(exc)} error={error_summary(exc)}")
            if deleted_before or (failed_report and failed_report.skipped_rows):
                # Those rows stay deleted: say so, and let a retry of this op count them.
                context.log_event(dg.AssetObservation(asset_key=asset_key, metadata={
                    **RunReport.of_purge(failed_report, settings).as_metadata(),
                    "failedBatch": batch_no, "attempt": context.retry_number + 1}))
            kind = transient_error_kind(exc)
            if kind is not None and context.retry_number < config.max_retries:
                wait = config.retry_delay_seconds * 2 ** context.retry_number
                context.log.warning(f"transient database error ({kind}); retry "
                                    f"{context.retry_number + 1}/{config.max_retries} "
                                    f"in {wait:g} s")
                raise dg.RetryRequested(max_retries=config.max_retries,
                                        seconds_to_wait=wait) from exc
            if metrics is not None:
                this = (RunReport.of_purge(failed_report, settings) if failed_report
                        else RunReport(deleted_total=0, batches=0))
                metrics.push_run(context, policy, this.after(earlier), succeeded=False)
            raise
        # A request that arrived during the last batch is still a request: the flag is only
        # visible inside capture_interrupts, which resets it on exit.
        if (report.stop_reason is not StopReason.STOP_REQUESTED
                and stop_requests.requested(read_now=True)):
            report = dataclasses.replace(report, stop_reason=StopReason.STOP_REQUESTED)
        tracing.run_done(span, report)
        summary = RunReport.of_purge(report, settings).after(
            _committed_by_earlier_attempts(context))
        if report.stop_reason is StopReason.STOP_REQUESTED:
            # Still inside capture_interrupts: a signal arriving now cannot cut this record short.
            stopped = (f"stopped on request after {report.batches} batches: "
                       f"{report.deleted_total} rows deleted and committed; the run ends CANCELED")
            context.log.warning(f"run {stopped} (Dagster shows this step as interrupted and the "
                                "steps after it as not executed)")
            context.log_event(dg.AssetObservation(asset_key=asset_key,
                                                  metadata=summary.as_metadata()))
            if metrics is not None:
                metrics.push_run(context, policy, summary, succeeded=False)
            raise DagsterExecutionInterruptedError(stopped)
    return summary


def _committed_by_earlier_attempts(context: dg.OpExecutionContext) -> RunReport | None:
    """Rows and batches that failed attempts of this op committed in this run (op retries),
    or ``None`` on the first attempt.

    Each failed attempt records its :class:`~favorites_maintenance.run_report.RunReport` as an
    observation with ``failedBatch``; the run's ``deletedTotal`` and ``batches`` are the sum
    over its attempts, not the last one alone.
    """
    if context.retry_number == 0:
        return None
    total = RunReport(deleted_total=0, batches=0)
    for entry in context.instance.all_logs(context.run_id,
                                           of_type=dg.DagsterEventType.ASSET_OBSERVATION):
        observation = entry.asset_observation
        if observation is None or "failedBatch" not in observation.metadata:
            continue
        total = RunReport.from_metadata(observation.metadata).after(total)
    return total


def _to_run_log(context: dg.OpExecutionContext, level: int, message: str) -> None:
    """Log ``message`` in the run's log; if Dagster's storage refuses the write, in the
    process's log instead. Never raises: a storage outage must not tear the batch loop."""
    try:
        context.log.log(level, message)
    except Exception as exc:  # noqa: BLE001 - Dagster's storage, not the favorites database
        _log.log(level, "%s (not in the run's log: Dagster's storage failed: %s)", message,
                 error_summary(exc))


class _RunLogHandler(logging.Handler):
    def __init__(self, context: dg.OpExecutionContext):
        super().__init__(logging.INFO)
        self.context = context

    def emit(self, record: logging.LogRecord) -> None:
        _to_run_log(self.context, record.levelno, record.getMessage())


@contextlib.contextmanager
def _core_logs_in_run_log(context: dg.OpExecutionContext):
    logger = logging.getLogger(CORE_LOGGER)
    handler = _RunLogHandler(context)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _failed_database(exc: BaseException) -> str:
    """Which database an error came from, for the log: the core wraps every error of the
    favorites database in its own exceptions, so a bare driver error here is Dagster's."""
    if not isinstance(exc, RetentionError) and is_database_error(exc):
        return "dagster_storage"
    return "favorites"


class _StopRequests:
    """Whether the run was asked to stop, known before each batch without a round trip to
    Dagster's storage per batch.

    Three ways in, the first two pushed:

    - the interrupt Dagster sends the step's process on termination, captured by
      ``capture_interrupts``;
    - the run's ``RUN_CANCELING`` event, pushed by a SQLite event log storage's watch as its
      file changes (``dagster dev`` without this repository's ``dagster.yaml``, tests);
    - the run's status, read at most every :data:`STATUS_EVERY_S` seconds, for a launcher that
      marks a run CANCELING without interrupting it, or a watch that cannot start.

    A status that cannot be read (Dagster's storage down) counts as "no stop requested" until
    the next read; the captured interrupt still stops the purge.
    """

    def __init__(self, context: dg.OpExecutionContext):
        self._context = context
        self._canceling = threading.Event()
        self._last_read = -math.inf
        self._read_failed = False
        self._watching = False

    def __enter__(self) -> "_StopRequests":
        storage = self._context.instance.event_log_storage
        # Only a storage that pushes: the PostgreSQL one's watch polls on a thread of its own
        # (every 0.25 s to 16 s), no sooner than the read below, and dies on a storage outage.
        if isinstance(storage, (SqliteEventLogStorage, ConsolidatedSqliteEventLogStorage)):
            try:
                storage.watch(self._context.run_id, None, self._on_event)
                self._watching = True
            except Exception as exc:  # noqa: BLE001 - the bounded read still sees the request
                _log.warning("no event watch on Dagster's storage (the run's status is read "
                             "every %g s): %s", STATUS_EVERY_S, error_summary(exc))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._watching:
            with contextlib.suppress(Exception):
                self._context.instance.event_log_storage.end_watch(self._context.run_id,
                                                                   self._on_event)

    def _on_event(self, entry: dg.EventLogEntry, _cursor: str) -> None:
        if entry.dagster_event_type in (dg.DagsterEventType.RUN_CANCELING,
                                        dg.DagsterEventType.RUN_CANCELED):
            self._canceling.set()

    def requested(self, read_now: bool = False) -> bool:
        """True once a stop was requested; ``read_now`` reads the run's status whatever the
        time since the last read (once, after the last batch)."""
        if check_captured_interrupt() or self._canceling.is_set():
            return True
        now = time.monotonic()
        if read_now or now - self._last_read >= STATUS_EVERY_S:
            self._last_read = now
            if self._read_status():
                self._canceling.set()
        return self._canceling.is_set()

    def _read_status(self) -> bool:
        try:
            run = self._context.instance.get_run_by_id(self._context.run_id)
        except Exception as exc:  # noqa: BLE001 - Dagster's storage, not the favorites database
            if not self._read_failed:
                _log.warning("could not read the run's status from Dagster's storage (the "
                             "purge goes on): %s", error_summary(exc))
            self._read_failed = True
            return False
        if self._read_failed:
            _log.warning("Dagster's storage answers again")
        self._read_failed = False
        return run is not None and run.status in (dg.DagsterRunStatus.CANCELING,
                                                  dg.DagsterRunStatus.CANCELED)


#: The guest-favorites cleanup asset with default settings (the code location builds its own
#: from the policy's ``defs.yaml``).
guest_favorites_cleanup = build_cleanup_asset(GUEST_POLICY)
