"""Asset checks for the SLOs of SPEC 8; they run in every run of the cleanup job.

- ``no_guest_row_older_than_retention_plus_one_day`` (ERROR): the freshness SLO of the table.
  No guest row may have an ``updated_at`` older than ``Days + 1 day``: the day of slack covers a
  run's backlog and rows skipped because a user held them.
- ``deleted_total_spike`` (WARN): a run deleted far more than usual, which is what an
  over-deletion or a changed upstream would look like. The run's ``deletedTotal`` is compared
  with the median of up to :data:`SPIKE_HISTORY` earlier materializations; it is a spike when it
  exceeds both ``SPIKE_FACTOR`` times that median and the median plus :data:`SPIKE_MIN_ROWS`
  (so a quiet table going from 3 to 40 rows is no spike). Fewer than
  :data:`SPIKE_MIN_HISTORY` earlier runs: passes, saying so.
"""


import datetime as dt
import statistics

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.assets import ASSET_KEY
from favorites_maintenance.resources import FavoritesDatabase, GuestRetention
from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.rule import favorites

SPIKE_HISTORY = 14
SPIKE_MIN_HISTORY = 3
SPIKE_FACTOR = 5.0
SPIKE_MIN_ROWS = 10_000


@dg.asset_check(
    asset=ASSET_KEY,
    name="no_guest_row_older_than_retention_plus_one_day",
    description="SLO: no guest row idle longer than the retention period plus one day.",
)
def no_guest_row_older_than_retention_plus_one_day(
        database: FavoritesDatabase, retention: GuestRetention) -> dg.AssetCheckResult:
    """Count guest rows with ``updated_at < now - (Days + 1 day)``; any such row fails (ERROR)."""
    limit = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=retention.retention_days + 1)
    t = favorites
    stmt = sa.select(sa.func.count(), sa.func.min(t.c.updated_at)).where(
        t.c.user_id.is_(None), t.c.updated_at < limit)
    with database.engine.begin() as conn:
        limit_transaction(conn)  # never queue without limit behind a migration's lock
        overdue, oldest = conn.execute(stmt).one()
    return dg.AssetCheckResult(
        passed=overdue == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "overdueGuestRows": overdue,
            "oldestOverdueUpdatedAt": oldest.isoformat() if oldest else "none",
            "limit": limit.isoformat(),
        },
        description=(f"{overdue} guest rows are older than {retention.retention_days} + 1 days"
                     if overdue else None),
    )


@dg.asset_check(
    asset=ASSET_KEY,
    name="deleted_total_spike",
    description=(f"WARN when deletedTotal exceeds {SPIKE_FACTOR:g}x the median of the last "
                 f"{SPIKE_HISTORY} runs and that median + {SPIKE_MIN_ROWS:,} rows."),
)
def deleted_total_spike(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    """Compare this run's ``deletedTotal`` with the median of earlier materializations."""
    records = context.instance.fetch_materializations(ASSET_KEY, limit=SPIKE_HISTORY + 1).records
    values = []  # newest first; the first one of this run is the value under test
    current = None
    for record in records:
        mat = record.asset_materialization
        if mat is None or "deletedTotal" not in mat.metadata:
            continue
        value = mat.metadata["deletedTotal"].value
        if current is None and record.run_id == context.run.run_id:
            current = value
        else:
            values.append(value)
    if current is None:
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN,
                                   description="no materialization in this run to check")
    history = values[:SPIKE_HISTORY]
    if len(history) < SPIKE_MIN_HISTORY:
        return dg.AssetCheckResult(
            passed=True, severity=dg.AssetCheckSeverity.WARN,
            metadata={"deletedTotal": current, "history": len(history)},
            description=f"only {len(history)} earlier runs; a spike needs {SPIKE_MIN_HISTORY}")
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


@dg.asset_check(
    asset=ASSET_KEY,
    name="no_rows_skipped",
    description="WARN when the run left prunable rows in place because deleting them failed "
                "(a foreign key, a trigger) or had no effect.",
)
def no_rows_skipped(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    """Read this run's ``skippedRows`` and ``skippedCauses``; any skipped row fails (WARN).

    Skipped rows are retried by every run; they stay until the reference or trigger that
    blocks them is dealt with (README, runbook: "rows are skipped").
    """
    metadata = _this_runs_materialization(context)
    if metadata is None:
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN,
                                   description="no materialization in this run to check")
    skipped = metadata["skippedRows"].value if "skippedRows" in metadata else 0
    causes = metadata["skippedCauses"].value if "skippedCauses" in metadata else "none"
    return dg.AssetCheckResult(
        passed=skipped == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"skippedRows": skipped, "skippedCauses": causes},
        description=(f"{skipped} prunable rows could not be deleted: {causes}"
                     if skipped else None),
    )


def _this_runs_materialization(context: dg.AssetCheckExecutionContext):
    """Metadata of the asset's materialization in this run, or ``None``."""
    records = context.instance.fetch_materializations(ASSET_KEY, limit=SPIKE_HISTORY + 1).records
    for record in records:
        mat = record.asset_materialization
        if mat is not None and record.run_id == context.run.run_id:
            return mat.metadata
    return None


asset_checks = [no_guest_row_older_than_retention_plus_one_day, deleted_total_spike,
                no_rows_skipped]
