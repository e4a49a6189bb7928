"""The purge of a range-partitioned table, one step per partition (a policy with
``max_parallel_partitions``): what the plan hands to each step and to the step that sums them.

The graph is ``compute_cutoff -> plan_partitions -> purge_partition[<partition>] (one per
partition with prunable rows) -> collect_partitions -> measure_backlog``
(:func:`~favorites_maintenance.pipeline.assets.build_cleanup_asset`). The partition steps are
Dagster's dynamic outputs, their mapping key the partition's name: each is a step of its own in
the UI, retried on its own, run by whichever process or worker the executor gives it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.resources import PolicyDatabase
from favorites_maintenance.retention.partition_plan import prunable_partitions
from favorites_maintenance.retention.table_partitions import TablePartition

_UTC = dt.UTC
#: What Dagster accepts in a mapping key.
_NOT_IN_KEY = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class PartitionWork:
    """What one partition step purges, and until when.

    Attributes:
        partition: the table partition (its name, schema and range).
        deadline: the end of the run's time budget, a UTC instant: the plan's start plus the
            policy's ``max_run_duration``. Every step of the run, a retry included, stops
            there, so the run as a whole keeps the budget one purge has.
    """

    partition: TablePartition
    deadline: dt.datetime


@dataclass(frozen=True)
class PartitionPlan:
    """The plan of one run, for the step that sums the partition steps.

    Attributes:
        started_at: when the plan was made, a UTC instant (the start of the run's wall time).
        partitions: the names (``schema.table``) of the partitions given a step, oldest first.
        dropped: with ``drop_expired_partitions``, what the plan's drop phase did before the
            steps: (partitions detached, detached tables dropped, rows of the detached
            partitions); ``None`` without it.
    """

    started_at: dt.datetime
    partitions: tuple[str, ...]
    dropped: tuple[int, int, int] | None = None

    def duration_ms(self, now: dt.datetime | None = None) -> int:
        """Milliseconds from the plan to ``now`` (default: this host's clock)."""
        now = now or dt.datetime.now(_UTC)
        return max(0, round((now - self.started_at).total_seconds() * 1000))


def partitions_to_purge(context: dg.OpExecutionContext, database: PolicyDatabase,
                        policy: Policy, cutoff: dt.datetime) -> list[TablePartition]:
    """The partitions of the policy's table that hold prunable rows at ``cutoff``, oldest
    first; the one place the run decides, before any partition step starts, what the steps
    are (so any work on whole partitions belongs here, before the probe).

    Raises:
        TableShapeError: the table is not range-partitioned by the age column.
        PartitionPlanError: the database failed.
    """
    found = prunable_partitions(database.engine, policy.rule, cutoff)
    context.log.info(
        f"{len(found)} partitions of {policy.rule.qualified_name} hold rows "
        f"{policy.rule.older_than} {cutoff.isoformat()}: "
        + (", ".join(f"{p.name} {p.describe_range()}" for p in found) or "none"))
    return found


def mapping_keys(partitions: Sequence[TablePartition]) -> list[str]:
    """One Dagster mapping key per partition, in order: its name, with any character Dagster
    refuses in a key replaced by ``_`` and a suffix where two would then be equal."""
    keys, seen = [], set()
    for partition in partitions:
        key = _NOT_IN_KEY.sub("_", partition.name)
        base, n = key, 2
        while key in seen:
            key, n = f"{base}_{n}", n + 1
        seen.add(key)
        keys.append(key)
    return keys
