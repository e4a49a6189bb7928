"""Daily UTC partitions of the cleanup asset, and which runs of them are *current*.

A run of partition ``D`` uses ``cutoff = min(now, end of D) - Days``, so a backfill of an old
day deletes a subset of what today's run would.
"""

import datetime as dt

import dagster as dg

#: One partition per UTC day; the first is the day the pipeline went into service.
daily_partitions = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone="UTC")

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
