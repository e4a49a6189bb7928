"""``favorites-maintenance bench --scenarios partitioned``: the same expired rows removed by
detaching and dropping whole partitions, against deleting them row by row.

The data set: ``favorites.favorites`` partitioned by month over 36 months up to
:data:`~favorites_maintenance.bench.workload.BENCH_NOW`, its rows spread evenly over time; with
the 365-day retention the 24 oldest months (two thirds) lie wholly before the cutoff and hold
guest rows only, the 12 recent ones hold account rows (30 %) and fresh guest rows. It is seeded
once into a template database and restored before each strategy:

- ``rows``: :func:`~favorites_maintenance.retention.purge.purge` at the job's default settings
  (batches adapting from 1,000 to 10,000 rows) deletes every prunable row;
- ``drops``: :func:`~favorites_maintenance.retention.partitioned.drop_expired_partitions`
  detaches the expired partitions (``DETACH ... CONCURRENTLY``, every check run), a second call
  drops them (``detached_retention`` zero: a run a week later), then the purge deletes the
  prunable rows left (none here: the cutoff falls on a month's first instant).

Each strategy starts right after a ``CHECKPOINT``; its wall time and the WAL the server wrote
(``pg_current_wal_lsn()`` difference) are reported, and each must leave no prunable row and
every account row.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from favorites_maintenance.bench.server import BenchServer, engine_on
from favorites_maintenance.bench.workload import BENCH_NOW

MONTHS = 36
RETENTION_DAYS = 365
#: Share of the rows of the recent months that belong to an account.
ACCOUNT_SHARE = 0.3
STRATEGIES = ("rows", "drops")

_SEED = sa.text("""
    INSERT INTO favorites.favorites (user_id, anonymous_id, item_id, created_at, updated_at)
    SELECT CASE WHEN ts >= :cutoff AND hashint8(g) % 1000 < :account_per_mille
                THEN 1 + g % 100000 END,
           CASE WHEN ts < :cutoff OR hashint8(g) % 1000 >= :account_per_mille
                THEN '00000000-0000-4000-8000-000000000001'::uuid END,
           g, ts, ts
      FROM generate_series(1, :rows) AS g,
           LATERAL (SELECT CAST(:start AS timestamptz)
                           + (CAST(:end AS timestamptz) - CAST(:start AS timestamptz))
                           * ((g - 1)::float8 / :rows) AS ts) AS t
""")


def _months_back(end: dt.datetime, months: int) -> dt.datetime:
    year, month = end.year, end.month - months
    while month < 1:
        year, month = year - 1, month + 12
    return dt.datetime(year, month, 1, tzinfo=dt.UTC)


def seed_partitioned(srv: BenchServer, db: str, rows: int, cutoff: dt.datetime) -> dict:
    """Create database ``db`` holding the partitioned data set (see the module), vacuumed,
    frozen and analysed; returns its figures (rows, prunable, accounts, partitions, bytes)."""
    from favorites_maintenance.local.guest_favorites import (
        create_partitioned_dev_schema,
        month_starts,
    )

    start = _months_back(BENCH_NOW, MONTHS)
    srv.drop(db)
    srv.execute(f'CREATE DATABASE "{db}"')
    with engine_on(srv.url(db)) as engine:
        names = create_partitioned_dev_schema(engine, month_starts(start, MONTHS))
        with engine.begin() as conn:
            conn.execute(_SEED, {"rows": rows, "start": start, "end": BENCH_NOW,
                                 "cutoff": cutoff,
                                 "account_per_mille": round(ACCOUNT_SHARE * 1000)})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for name in names:
                conn.execute(sa.text(f"ALTER TABLE favorites.{name} "
                                     "SET (autovacuum_enabled = false)"))
            conn.execute(sa.text("VACUUM (FREEZE, ANALYZE) favorites.favorites"))
            size = conn.execute(sa.text(
                "SELECT sum(pg_total_relation_size(relid)) "
                "FROM pg_partition_tree('favorites.favorites')")).scalar_one()
    return {**count(srv.url(db), cutoff), "partitions": len(names),
            "expired_partitions": sum(1 for lower in month_starts(start, MONTHS)[1:]
                                      if lower <= cutoff),
            "bytes": int(size)}


def count(url, cutoff: dt.datetime) -> dict:
    """``rows``, ``prunable`` rows at ``cutoff`` and ``accounts`` rows of the table."""
    with engine_on(url) as engine, engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT count(*), count(*) FILTER (WHERE user_id IS NULL AND updated_at < :c), "
            "count(*) FILTER (WHERE user_id IS NOT NULL) FROM favorites.favorites"),
            {"c": cutoff}).one()
    return {"rows": row[0], "prunable": row[1], "accounts": row[2]}


def _run(srv: BenchServer, db: str, strategy: str, cutoff: dt.datetime) -> dict:
    from favorites_maintenance.config.policy_settings import (
        DEFAULT_BATCH_SIZE,
        DEFAULT_BATCH_SIZE_MAX,
        DEFAULT_TARGET_BATCH_DURATION,
    )
    from favorites_maintenance.retention.partitioned import drop_expired_partitions
    from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
    from favorites_maintenance.retention.batch_loop import PurgeOptions
    from favorites_maintenance.retention.purge import purge

    srv.execute("CHECKPOINT")
    figures: dict = {"strategy": strategy}
    with engine_on(srv.url(db)) as engine:
        lsn, t = srv.lsn(), time.monotonic()
        removed = 0
        if strategy == "drops":
            detached = drop_expired_partitions(engine, GUEST_FAVORITES, cutoff,
                                               detached_retention=dt.timedelta(0))
            figures["detach_s"] = round(time.monotonic() - t, 2)
            figures["detach_wal_bytes"] = srv.wal_diff(lsn, srv.lsn())
            t_drop = time.monotonic()
            dropped = drop_expired_partitions(engine, GUEST_FAVORITES, cutoff,
                                              detached_retention=dt.timedelta(0))
            figures["drop_s"] = round(time.monotonic() - t_drop, 2)
            figures["partitions_detached"] = len(detached.detached)
            figures["partitions_dropped"] = len(dropped.dropped)
            removed += detached.rows_removed
        report = purge(engine, GUEST_FAVORITES, cutoff, PurgeOptions(
            batch_size=DEFAULT_BATCH_SIZE, max_run_duration=dt.timedelta(hours=4),
            batch_size_max=DEFAULT_BATCH_SIZE_MAX,
            target_batch_duration=DEFAULT_TARGET_BATCH_DURATION))
        figures["seconds"] = round(time.monotonic() - t, 2)
        figures["wal_bytes"] = srv.wal_diff(lsn, srv.lsn())
        figures["rows_removed"] = removed + report.deleted_total
        figures["rows_deleted_in_batches"] = report.deleted_total
        figures["batches"] = report.batches
    figures["after"] = count(srv.url(db), cutoff)
    return figures


def run_partitioned_bench(server, rows: int, *, out: Path | None = None,
                          echo: Callable[[str], None] = print,
                          db_prefix: str = "bench_part") -> dict:
    """Seed the partitioned data set of ``rows`` rows, run each strategy on a fresh copy and
    return (and write to ``out`` as JSON) the figures: seconds, WAL bytes, rows removed, and
    whether each left no prunable row and every account row (``correct``).

    Args:
        server: a started :class:`~favorites_maintenance.local.embedded.EmbeddedPostgres`.
        rows: size of the data set.
    """
    from favorites_maintenance.retention.rule import compute_cutoff

    srv = BenchServer(server)
    cutoff = compute_cutoff(BENCH_NOW, RETENTION_DAYS)
    seed_db, run_db = f"{db_prefix}_seed", f"{db_prefix}_run"
    try:
        t = time.monotonic()
        echo(f"seeding {rows:,} rows over {MONTHS} monthly partitions ...")
        data = seed_partitioned(srv, seed_db, rows, cutoff)
        echo(f"  {data['rows']:,} rows, {data['prunable']:,} prunable at cutoff "
             f"{cutoff.isoformat()}, {data['accounts']:,} account rows, "
             f"{data['expired_partitions']} of {data['partitions']} partitions wholly "
             f"expired, {data['bytes'] / 2**20:,.0f} MB; {time.monotonic() - t:.1f} s")
        results = {}
        for strategy in STRATEGIES:
            srv.restore(seed_db, run_db)
            res = _run(srv, run_db, strategy, cutoff)
            res["correct"] = (res["after"]["prunable"] == 0
                              and res["after"]["accounts"] == data["accounts"]
                              and res["rows_removed"] == data["prunable"])
            results[strategy] = res
            echo(f"  {strategy}: {res['rows_removed']:,} rows removed in {res['seconds']} s, "
                 f"WAL {res['wal_bytes'] / 2**20:,.1f} MB"
                 + ("" if res["correct"] else "  (WRONG: rows left or lost)"))
        version = srv.scalar("SHOW server_version")
    finally:
        for db in (run_db, seed_db):
            srv.drop(db)
        srv.dispose()
    report = {"scenario": "partitioned", "data": data, "cutoff": cutoff.isoformat(),
              "postgres": version, "strategies": results}
    rows_run, drops = results["rows"], results["drops"]
    report["ratios"] = {
        "time_rows_over_drops": round(rows_run["seconds"] / max(drops["seconds"], 1e-3), 1),
        "wal_rows_over_drops": round(rows_run["wal_bytes"] / max(drops["wal_bytes"], 1), 1)}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    return report
