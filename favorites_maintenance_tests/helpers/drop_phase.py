"""A policy with ``drop_expired_partitions`` on ``favorites.favorites`` partitioned by month,
for the drop phase's tests: the table's months, the policy's code location and run, and what
the catalogs and the run's log say afterwards. The table itself is the ``table`` fixture of
``reliability/conftest.py``.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES, month_starts
from favorites_maintenance.retention import table_partitions
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.retention.least_privilege import apply_partition_functions
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.clock import PARTITION
from favorites_maintenance_tests.helpers.jobs import run_partition
from favorites_maintenance_tests.helpers.partitioned import ASSET_KEY, JOB, NODE, POLICY
from favorites_maintenance_tests.helpers.policies import favorites_policy, location

# Re-exported: the drop phase's tests import the policy's names from here.
__all__ = ["ASSET_KEY", "JOB", "NODE"]

UTC = dt.UTC
#: Monthly partitions from January 2025 to December 2026; the cutoff of PARTITION is
#: 2025-06-16, so January to May 2025 lie wholly before it.
BOUNDS = month_starts(dt.datetime(2025, 1, 1, tzinfo=UTC), 24)
JAN, FEB, MAR, APR, MAY = (f"favorites.favorites_2025{m:02d}01" for m in range(1, 6))


def defs(**attributes) -> dg.Definitions:
    """The code location of the policy (batches of 7 rows), ``attributes`` on top."""
    policy = favorites_policy(POLICY, drop_expired_partitions=True, batch_size=7, **attributes)
    return location(policy)


def run(instance, **attributes) -> dg.ExecuteInProcessResult:
    """A run of the policy's job for ``PARTITION`` on ``instance``, failures returned."""
    return run_partition(defs(**attributes), instance, PARTITION, job=JOB,
                         raise_on_error=False)


def log_lines(instance, result) -> str:
    """The user messages of ``result``'s run, one a line."""
    return "\n".join(e.user_message or "" for e in instance.all_logs(result.run_id))


def month(m: int, day: int = 10) -> dt.datetime:
    """``day`` of month ``m`` of 2025, UTC midnight."""
    return dt.datetime(2025, m, day, tzinfo=UTC)


def partitions_of(engine) -> set[str]:
    """The table's leaf partitions, ``schema.name``."""
    with engine.connect() as conn:
        return {p.qualified_name for p in table_partitions.leaf_partitions(
            conn, "favorites", "favorites", age_column="updated_at")}


def tables(engine) -> set[str]:
    """Every table of the ``favorites`` schema, ``schema.name``."""
    with engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT format('%s.%s', schemaname, tablename) FROM pg_tables "
            "WHERE schemaname = 'favorites'")).scalars())


def fill(rows: Rows) -> dict[str, list[int]]:
    """Guest rows in January (30), February (20, with one account row), April (5) and June
    2025 (5 before the cutoff, 5 after), and in 2026 (10, fresh)."""
    made = {
        "jan": rows.add_many(30, updated_at=month(1)),
        "feb": rows.add_many(20, updated_at=month(2)),
        "feb_account": [rows.add(updated_at=month(2, 20), user_id=7)],
        "apr": rows.add_many(5, updated_at=month(4)),
        "jun_old": rows.add_many(5, updated_at=month(6, 1)),
        "jun_fresh": rows.add_many(5, updated_at=month(6, 20)),
        "fresh": rows.add_many(10, updated_at=dt.datetime(2026, 3, 1, tzinfo=UTC)),
    }
    return made


def cleanup_role_with_functions(table, roles, monkeypatch) -> sa.URL:
    """The job runs as the least-privilege role (its URL returned), the owner's partition
    functions installed."""
    url = roles.create("cleanup", least_privilege=True)
    apply_partition_functions(table, url.username, GUEST_FAVORITES)
    monkeypatch.setenv(DATABASE_URL_VAR, url.render_as_string(hide_password=False))
    return url
