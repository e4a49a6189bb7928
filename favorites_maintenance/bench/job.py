"""Strategy ``J`` of ``favorites-maintenance bench``: the cleanup job as users run it.

``guest_favorites_cleanup_job`` runs through Dagster with the executor it ships with (in process:
every step in this process) on an instance whose storage is a PostgreSQL database of the
bench's own server, against the same restored data set as the other strategies. The partition and the retention days are chosen so
that the job's cutoff is the bench's cutoff. Imported only by its own purge process: the rest of
:mod:`favorites_maintenance.bench` imports no Dagster.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
import time
from pathlib import Path

import dagster as dg
import sqlalchemy as sa
from sqlalchemy.engine import URL

from favorites_maintenance.bench.server import drop_database
from favorites_maintenance.config.policy_settings import DEFAULT_BATCH_SIZE, DEFAULT_BATCH_SIZE_MAX
from favorites_maintenance.pipeline.partitions import daily_partitions_from
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR

# The guest-favorites policy's variables (defs/guest_favorites/defs.yaml).
BATCH_SIZE_VAR = "FAVORITES_GUEST_RETENTION_BATCH_SIZE"
BATCH_SIZE_MAX_VAR = "FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX"
MAX_RUN_DURATION_VAR = "FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION"
RETENTION_DAYS_VAR = "FAVORITES_GUEST_RETENTION_DAYS"
PARTITIONS_START_VAR = "FAVORITES_GUEST_RETENTION_PARTITIONS_START"

#: The guest-favorites policy's cleanup asset.
ASSET_KEY = dg.AssetKey(["favorites", "guest_favorites_cleanup"])

#: The day the bench's job run materializes, the first partition of the asset as the bench sets
#: it: the day of the data set's fixed "now".
PARTITION = "2026-01-01"


def cleanup_job() -> dg.JobDefinition:
    """The job as the code location defines it, from the environment (reconstructable, as
    ``execute_job`` wants it)."""
    from favorites_maintenance.components.policy_tree import code_location

    return code_location().resolve_job_def("guest_favorites_cleanup_job")


def run_job(url: URL, cutoff: dt.datetime, batch_size: int, max_run_s: float,
            previous_row_s: float | None = None) -> dict:
    """Run the job once on ``url``'s database and say what it did.

    Args:
        url: the favorites database (psycopg URL); Dagster's storage goes in a database named
            after it with ``_dagster`` appended, on the same server, dropped afterwards.
        cutoff: the bench's cutoff; it must fall a whole number of days before the end of
            :data:`PARTITION`.
        batch_size: rows of the first batch; the size adapts as A's does: at the default
            (1,000) neither ``FAVORITES_GUEST_RETENTION_BATCH_SIZE`` nor ``..._BATCH_SIZE_MAX``
            is set (mode ``adaptive``, as the job at its defaults), else both are (``capped``
            at the default max).
        max_run_s: the purge's time budget, in seconds.
        previous_row_s: the time per row of the run before, seconds, recorded as the
            ``msPerRow`` of an earlier materialization of the asset, where the job reads it;
            ``None``: the job's first run.

    Returns:
        ``deleted``, ``batches``, ``purge_seconds`` (the run's ``durationMs``),
        ``run_seconds`` (the run record's start to end), ``launch_seconds`` (from the launch
        to the run's success, as its caller waits for it), ``batch_max_ms``, ``stop_reason``,
        ``scan_mode``.

    Raises:
        RuntimeError: the run did not succeed.
    """
    window_end = daily_partitions_from(dt.date.fromisoformat(PARTITION)) \
        .time_window_for_partition_key(PARTITION).end
    days = (window_end - cutoff) / dt.timedelta(days=1)
    if days != int(days) or days < 1:
        raise ValueError(f"cutoff {cutoff.isoformat()} is not whole days before {window_end}")
    storage_db = f"{url.database}_dagster"
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    home = Path(tempfile.mkdtemp(prefix="favorites-bench-dagster-"))
    try:
        with admin.connect() as conn:
            drop_database(conn, storage_db)
            conn.exec_driver_sql(f'CREATE DATABASE "{storage_db}"')
        storage = url.set(drivername="postgresql+psycopg2", database=storage_db)
        (home / "dagster.yaml").write_text(
            "storage:\n  postgres:\n    postgres_url: "
            f"'{storage.render_as_string(hide_password=False)}'\n"
            # Step processes log their start through the instance's default console logger.
            "python_logs:\n  python_log_level: WARNING\n"
            "telemetry:\n  enabled: false\n")
        for name in (BATCH_SIZE_VAR, BATCH_SIZE_MAX_VAR):
            os.environ.pop(name, None)
        if batch_size != DEFAULT_BATCH_SIZE:
            # An explicit batch size alone would bound every batch: J adapts as A does.
            os.environ.update({BATCH_SIZE_VAR: str(batch_size), BATCH_SIZE_MAX_VAR: str(
                max(batch_size, DEFAULT_BATCH_SIZE_MAX))})
        os.environ.update({
            DATABASE_URL_VAR: url.render_as_string(hide_password=False),
            RETENTION_DAYS_VAR: str(int(days)),
            PARTITIONS_START_VAR: PARTITION,
            MAX_RUN_DURATION_VAR: f"PT{max_run_s:g}S",
        })
        with dg.DagsterInstance.from_config(str(home)) as instance:
            if previous_row_s is not None:
                # The previous day's record, as far as the next run reads it.
                instance.report_runless_asset_event(dg.AssetMaterialization(
                    asset_key=ASSET_KEY, metadata={"msPerRow": previous_row_s * 1000}))
            t0 = time.monotonic()
            # The console shows warnings only: the bench prints its own progress.
            quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
            with dg.execute_job(dg.reconstructable(cleanup_job), instance=instance,
                                run_config=quiet,
                                tags={"dagster/partition": PARTITION}) as result:
                t1 = time.monotonic()
                if not result.success:
                    raise RuntimeError(f"the job's run {result.run_id} did not succeed")
                [mat] = result.get_asset_materialization_events()
                meta = {k: v.value for k, v in mat.materialization.metadata.items()}
                record = instance.get_run_record_by_id(result.run_id)
        return {
            "deleted": meta["deletedTotal"],
            "batches": meta["batches"],
            "purge_seconds": meta["durationMs"] / 1000,
            "run_seconds": (record.end_time - record.start_time
                            if record and record.end_time and record.start_time else t1 - t0),
            "launch_seconds": t1 - t0,
            "batch_max_ms": meta["batchMaxMs"],
            "stop_reason": meta["stopReason"],
            "scan_mode": meta.get("scanMode", ""),
        }
    finally:
        with admin.connect() as conn:
            drop_database(conn, storage_db)
        admin.dispose()
        shutil.rmtree(home, ignore_errors=True)
