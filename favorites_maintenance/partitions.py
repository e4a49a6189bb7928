"""Daily UTC partitions of the cleanup asset.

A run of partition ``D`` uses ``cutoff = min(now, end of D) - Days``, so a backfill of
an old day deletes a subset of what today's run would.
"""

import dagster as dg

#: One partition per UTC day; the first is the day the pipeline went into service.
daily_partitions = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone="UTC")
