"""Daily UTC partitions of a policy's cleanup asset, and which runs of them are *current*.

Each policy's partitions start on its ``partitions_start`` (README, "Configuration"). A run's
cutoff is :func:`partition_cutoff`'s, ``now`` by the database server's clock (:func:`read_now`),
whatever this host's says.
"""

import datetime as dt
import functools

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.config.policy_settings import default_partitions_start
from favorites_maintenance.pipeline.dagster_internals import get_current_datetime
from favorites_maintenance.retention.clock import ClockReading, read_clock
from favorites_maintenance.retention.rule import compute_cutoff


@functools.cache
def daily_partitions_from(start: dt.date) -> dg.DailyPartitionsDefinition:
    """One partition per UTC day from ``start`` to the last complete day."""
    return dg.DailyPartitionsDefinition(start_date=start.isoformat(), timezone="UTC")


def policy_partitions(policy: Policy) -> dg.DailyPartitionsDefinition:
    """The daily partitions of ``policy``'s cleanup asset, its checks and its schedule."""
    return daily_partitions_from(policy.settings.partitions_start)


#: The partitions of a policy that sets no ``partitions_start``, as of the process's start.
daily_partitions = daily_partitions_from(default_partitions_start())

#: A materialization is *current* when its day ended at most this long before it: the schedule
#: runs the latest complete day, which ended at most 24 h before the tick, plus one more day of
#: slack for a late or retried run. Anything older is a backfill of a past day.
CURRENT_PARTITION_LAG = dt.timedelta(days=2)


def is_current(partition_key: str | None, at: float) -> bool:
    """Whether a run of daily partition ``partition_key`` at ``at`` (epoch seconds) is a
    current run, not a backfill of a past day. An unpartitioned run (``None``) is not."""
    if partition_key is None:
        return False
    try:
        day = dt.date.fromisoformat(partition_key)
    except ValueError:
        return False
    window_end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.timezone.utc)
    return window_end.timestamp() >= at - CURRENT_PARTITION_LAG.total_seconds()


def read_now(database: sa.Engine | sa.Connection) -> ClockReading:
    """The run's "now": the database server's clock (``database``: an engine, or a connection
    read in its current transaction), read with this host's clock as Dagster reads it (the
    clock that picks a schedule's partition) for comparison. The one source of "now" of the
    job's ``compute_cutoff`` op, its checks, ``demo``, ``dry-run`` and
    :mod:`favorites_maintenance.testing`; the reading's ``warning`` says when the two clocks
    disagree (see :mod:`~favorites_maintenance.retention.clock`).

    Raises:
        ConnectError: the database could not be read.
    """
    return read_clock(database, process_clock=get_current_datetime)


def partition_cutoff(partition_key: str | None, retention_days: int, *,
                     now: dt.datetime,
                     partitions: dg.DailyPartitionsDefinition | None = None) -> dt.datetime:
    """The cutoff of a run of daily partition ``partition_key`` (``None``: a run without a
    partition) at ``now`` (the database server's instant, :func:`read_now`): ``min(now, end of
    the day) - retention_days``, a UTC datetime, so a backfill of an old day deletes a subset
    of what today's run would. The one computation of a run's cutoff: the job's
    ``compute_cutoff`` op, its checks, ``demo`` and ``dry-run`` all come here (see
    :func:`~favorites_maintenance.retention.rule.compute_cutoff`).

    Args:
        partitions: the policy's partitions, which ``partition_key`` must be one of (a run's
            own key, from Dagster, needs no check: leave it out).

    Raises:
        ValueError: ``partition_key`` is not a day ``YYYY-MM-DD``, or not one of
            ``partitions``.
    """
    window_end = None
    if partition_key is not None:
        if partitions is not None and not partitions.has_partition_key(partition_key):
            raise ValueError(f"{partition_key!r} is not a daily partition key (YYYY-MM-DD, "
                             f"from {partitions.get_first_partition_key()} to yesterday)")
        try:
            day = dt.date.fromisoformat(partition_key)
        except ValueError:
            raise ValueError(f"{partition_key!r} is not a daily partition key "
                             "(YYYY-MM-DD)") from None
        window_end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.timezone.utc)
    return compute_cutoff(now, retention_days, window_end)


def run_now(context: dg.OpExecutionContext | dg.AssetCheckExecutionContext,
            engine: sa.Engine) -> dt.datetime:
    """The database's "now" for the run of ``context`` (:func:`read_now` on ``engine``), with a
    warning in the run's log when this host's clock disagrees.

    Raises:
        ConnectError: the database could not be read.
    """
    reading = read_now(engine)
    if reading.warning:
        context.log.warning(reading.warning)
    return reading.database


def partitions_text(policy: Policy) -> str:
    """The days of ``policy``'s partitions, for a message: ``2026-01-01 to 2026-06-14``, or
    why there is none yet."""
    partitions = policy_partitions(policy)
    first, last = partitions.get_first_partition_key(), partitions.get_last_partition_key()
    if first is None or last is None:
        return (f"none yet: they start on {policy.settings.partitions_start.isoformat()} "
                f"({policy.label('partitions_start')}), and a day is one once it has ended, "
                "UTC")
    return f"{first} to {last}, each UTC day once it has ended"


def require_run_partitions(context: dg.OpExecutionContext, policy: Policy) -> None:
    """Refuse, before anything is read or deleted, a run of ``policy``'s cleanup that is not
    of one or more of its days: the run records its materialization and its checks on its day,
    so without one it would delete rows and then fail, and a day outside the partitions (today,
    not ended; one before ``partitions_start``), which Dagster does not check on a launch's
    ``dagster/partition`` tag, has no materialization to hold what it deleted.

    Raises:
        dagster.Failure: no partition (naming the run and the policy's days), or a day outside
            the policy's partitions (naming it and the policy's days); nothing deleted.
    """
    if context.has_partition_key:
        keys = [context.partition_key]
    elif getattr(context, "has_partition_key_range", False):
        keys = [context.partition_key_range.start, context.partition_key_range.end]
    else:
        raise dg.Failure(
            f"run {context.run_id} has no partition: a run of {policy.cleanup} records what it "
            f"deleted, and its checks, on one day of {policy.name}'s partitions "
            f"({partitions_text(policy)}); nothing was deleted. Launch it for a day, or "
            "backfill a range of days.")
    partitions = policy_partitions(policy)
    outside = [key for key in keys if not partitions.has_partition_key(key)]
    if outside:
        shown = (f"partition {keys[0]}" if len(keys) == 1
                 else f"partitions {keys[0]}...{keys[1]}")
        raise dg.Failure(
            f"{shown} refused: {', '.join(dict.fromkeys(outside))} is not one of "
            f"{policy.name}'s partitions ({partitions_text(policy)}); nothing was deleted. "
            "Launch a day of that range.")


def run_cutoff(context: dg.OpExecutionContext | dg.AssetCheckExecutionContext,
               retention_days: int, now: dt.datetime) -> dt.datetime:
    """The cutoff of the run of ``context`` at ``now`` (the database's, :func:`run_now`; see
    :func:`partition_cutoff`); a run of a range of days (a single-run backfill) uses its last
    day."""
    key = None
    if context.has_partition_key:
        key = context.partition_key
    elif getattr(context, "has_partition_key_range", False):
        key = context.partition_key_range.end
    return partition_cutoff(key, retention_days, now=now)
