"""The days and instants the tests run the daily job for, named once.

:data:`PARTITION` is a fixed past day, so a test's figures never move with the calendar;
:data:`YESTERDAY` is the day the schedule would run now, for the tests of what a run of today
sees (the daemon, the sensors, a partitioned table built around today).
"""

from __future__ import annotations

import datetime as dt

UTC = dt.UTC
#: The day most tests run the job for (a partition key, ``YYYY-MM-DD``).
PARTITION = "2026-06-15"
#: The cutoff of :data:`PARTITION` under the default 365 days: min(now, end of the day) minus
#: 365 days, a UTC instant.
CUTOFF = dt.datetime(2026, 6, 16, tzinfo=UTC) - dt.timedelta(days=365)
#: Rows this old are prunable for :data:`PARTITION` (30 days before the cutoff).
OLD = CUTOFF - dt.timedelta(days=30)
#: Rows this recent are kept for :data:`PARTITION` (30 days after the cutoff).
FRESH = CUTOFF + dt.timedelta(days=30)
#: Yesterday in UTC when the tests started (a partition key): the day the schedule runs now.
YESTERDAY = (dt.datetime.now(UTC) - dt.timedelta(days=1)).date().isoformat()
