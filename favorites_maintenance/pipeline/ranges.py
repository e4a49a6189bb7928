"""Which daily partitions a run covers: one, or a range of them (a single-run backfill).

A backfill of the cleanup asset runs as one run over its partition range
(``BackfillPolicy.single_run()``): the run purges once, to the cutoff of the range's last day,
and materializes every day of the range. Its figures are attributed once, to the last day
(:meth:`~favorites_maintenance.pipeline.run_report.RunReport.range_metadata`).
"""

from __future__ import annotations

import dagster as dg

Context = dg.OpExecutionContext | dg.AssetExecutionContext | dg.AssetCheckExecutionContext


def is_range_run(context: Context) -> bool:
    """Whether the run of ``context`` covers a range of partitions (Dagster's
    ``dagster/asset_partition_range_start`` and ``_end`` tags, set by a single-run backfill)
    rather than one partition (``dagster/partition``)."""
    return context.has_partition_key_range and not context.has_partition_key


def run_partitions(context: Context) -> list[str]:
    """The daily partition keys the run of ``context`` covers, oldest first: one for a daily
    run, every day of the range for a range run, none for a run without a partition."""
    if context.has_partition_key:
        return [context.partition_key]
    if context.has_partition_key_range:
        return list(context.partition_keys)
    return []


def range_text(partitions: list[str]) -> str:
    """``first...last`` (Dagster's notation for a partition range), or the one key."""
    if len(partitions) == 1:
        return partitions[0]
    return f"{partitions[0]}...{partitions[-1]}"
