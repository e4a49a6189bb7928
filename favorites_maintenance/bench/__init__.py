"""``favorites-maintenance bench``: the purge side by side with the physical limit and the usual
alternatives, on the embedded PostgreSQL server.

One seeded, reproducible data set (see :func:`seed_template`) is restored before every strategy
(``CREATE DATABASE ... TEMPLATE``), then each strategy deletes every prunable row at the default
settings (retention 365 days, batch size 1000):

- ``A``: :func:`favorites_maintenance.retention.purge.purge`, called as the job's ``purge`` op
  calls it (same engine factory, batch size, time budget, a no-op stop check);
- ``B``: one ``DELETE ... WHERE user_id IS NULL AND updated_at < cutoff`` in one transaction;
- ``C``: Laravel MassPrunable on PostgreSQL: ``DELETE ... WHERE ctid IN (SELECT ctid ... LIMIT
  1000)`` in autocommit until a statement deletes nothing;
- ``D``: ``SELECT id ... ORDER BY updated_at LIMIT 1000 FOR UPDATE SKIP LOCKED`` then ``DELETE ...
  WHERE id = ANY(...)`` per transaction, no keyset, while batches come back full;
- ``A_paced``: ``A`` as an operator sharing a busy primary would run it: ``sleep_ratio`` set
  (``paced_sleep_ratio``, 3 by default: a pause of that multiple of each batch's time before the
  next) and an explicit batch size (``batch_size``, 1,000 rows: each commit's burst of WAL,
  which user commits flush, stays small);
- ``A2``, ``A4``: 2 and 4 processes running ``A`` at once on the same table;
- ``J``: ``guest_favorites_cleanup_job`` run through Dagster as users run it (the default
  multiprocess executor, a PostgreSQL-backed instance; see
  :mod:`favorites_maintenance.bench.job`),
  rated by its purge's ``durationMs`` and, apart, by the run's start to end.

Each strategy's batch times are also reported per decile of the run (the p50 of the first 10 %
of its batches, ..., of the last 10 %), and its time per row per tenth of the rows it deleted
(``deciles_us_per_row``), which show whether the run grows slower as it goes on.

The ``daily`` scenario (:mod:`~favorites_maintenance.bench.daily`) runs ``A``, ``B``,
``B_index``, ``C`` and ``J`` on the day's newly expired rows of a data set whose backlog was
cleared.

Every purge runs in a child process of its own (its peak RSS is read there), while another
process runs a paced user workload (single-row inserts and updates of account rows and fresh
guest rows, one statement per transaction) whose latencies are split into an idle window just
before the purge and the purge itself. WAL is read as the ``pg_current_wal_lsn()`` difference
over the purge (everything the server wrote, the user workload included) and, from PostgreSQL 18's
per-backend statistics, as the WAL the purging sessions themselves generated.

Autovacuum is disabled on the benchmark table so that a vacuum starting inside one strategy's
window and not another's does not decide the comparison; every strategy leaves the same dead rows
behind for the vacuum that follows. Each strategy starts right after a ``CHECKPOINT``, so each
pays the same full-page images for the pages it touches first.

The package imports no Dagster (``J`` imports it in its own process). Its modules:
:mod:`~favorites_maintenance.bench.workload` (the data set, the user workload),
:mod:`~favorites_maintenance.bench.strategies` (each strategy, the purging process),
:mod:`~favorites_maintenance.bench.timing` (one timed run),
:mod:`~favorites_maintenance.bench.report` (figures, JSON, console),
:mod:`~favorites_maintenance.bench.server` (the bench's own server),
:mod:`~favorites_maintenance.bench.job` (``J``),
:mod:`~favorites_maintenance.bench.policies` (the ``policies`` scenario: what N policies cost
Dagster, no database),
:mod:`~favorites_maintenance.bench.launch` (the ``launch`` scenario: one schedule tick starting
N policies on a few databases under the deployment's run queue).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from favorites_maintenance.bench.config import DEFAULT_ROWS, SCENARIOS, BenchConfig
from favorites_maintenance.bench.daily import ONE_DAY, prepare_daily, run_daily
from favorites_maintenance.bench.report import (
    bench_report,
    deciles,
    format_table,
    median_run,
    percentile,
    progress_line,
    write_json,
)
from favorites_maintenance.bench.server import BenchServer, start_server
from favorites_maintenance.bench.strategies import EXTRA_STRATEGIES, STRATEGIES, WORKERS
from favorites_maintenance.bench.timing import run_strategy
from favorites_maintenance.bench.workload import BENCH_NOW, count_rows, seed_template
from favorites_maintenance.retention.rule import compute_cutoff

__all__ = [
    "BENCH_NOW", "DEFAULT_ROWS", "EXTRA_STRATEGIES", "SCENARIOS", "STRATEGIES", "WORKERS",
    "BenchConfig",
    "deciles", "format_table", "percentile", "run_bench", "seed_template", "start_server",
]


#: What every purging and user-workload process has loaded before it starts: the modules of its
#: target, and with them the retention core, SQLAlchemy and psycopg (no Dagster).
PRELOAD = ["favorites_maintenance.bench.strategies", "favorites_maintenance.bench.workload"]


def worker_context() -> mp.context.BaseContext:
    """The multiprocessing context of the bench's processes: ``forkserver``, :data:`PRELOAD`
    imported once in its server process.

    Each purge and user workload then forks from that process in milliseconds rather than
    starting an interpreter and importing the bench again (a second or two each). The peak
    RSS read in a purging process stays its own: it starts from what the server process
    loaded (what a spawned child imports for its target), where a spawned child's
    ``ru_maxrss`` starts from the bench process's own peak (Linux keeps it across ``exec``).
    Strategy ``J`` imports Dagster in its own process, which the others never load. The
    preload takes effect when the server process starts: the first bench of this process
    starts it, later ones reuse it.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run_bench(server, cfg: BenchConfig) -> dict:
    """Seed, run every strategy at 100% (with the user workload) and at 10% of ``cfg.rows``
    (memory only), then the ``daily`` scenario when ``cfg.scenarios`` holds it, write
    ``cfg.out`` and return the results.

    Args:
        server: a started :class:`~favorites_maintenance.local.embedded.EmbeddedPostgres`.
        cfg: what to measure.
    """
    ctx = worker_context()
    srv = BenchServer(server)
    echo = cfg.echo
    cutoff = compute_cutoff(BENCH_NOW, cfg.retention_days)
    seed_db, seed10_db, run_db = (f"{cfg.db_prefix}_seed", f"{cfg.db_prefix}_seed10",
                                  f"{cfg.db_prefix}_run")
    daily_db = f"{cfg.db_prefix}_daily"
    small = max(1000, cfg.rows // 10)
    daily = None
    # Without the backlog scenario the data set is still seeded (the daily one may reuse it).
    strategies = cfg.strategies if "backlog" in cfg.scenarios else ()
    try:
        t = time.monotonic()
        echo(f"seeding {cfg.rows:,} rows (and {small:,} for the 10% run) ...")
        full = seed_template(srv, seed_db, cfg.rows, cfg.seed)
        tenth = seed_template(srv, seed10_db, small, cfg.seed)
        prunable = count_rows(srv.url(seed_db), cutoff)["prunable"]
        echo(f"  {full['rows']:,} rows ({full['guest_rows']:,} guest, "
             f"{full['account_rows']:,} account, {full['bytes'] / 2**20:,.0f} MB with indexes), "
             f"{prunable:,} prunable at cutoff {cutoff.isoformat()}; "
             f"{time.monotonic() - t:.1f} s")
        load_before = os.getloadavg()
        small_runs = {}
        for strategy in strategies:
            echo(f"strategy {strategy}: {small:,} rows (memory at 10%) ...")
            small_runs[strategy] = run_strategy(ctx, srv, cfg, strategy, seed10_db, run_db,
                                                cutoff, workload=False)
        runs: dict[str, list[dict]] = {strategy: [] for strategy in strategies}
        for round_no in range(1, cfg.repeat + 1):
            # Rounds go through every strategy in turn, so a change in the machine's load
            # falls on all of them rather than on one.
            for strategy in strategies:
                res = run_strategy(ctx, srv, cfg, strategy, seed_db, run_db, cutoff,
                                   workload=True)
                runs[strategy].append(res)
                echo(progress_line(strategy, res, round_no, cfg.repeat))
        # The run of median throughput stands for the strategy, with all its figures.
        results = {strategy: median_run(done, small_runs[strategy])
                   for strategy, done in runs.items()}
        if "daily" in cfg.scenarios:
            echo(f"daily: {cfg.daily_rows:,} rows, the backlog at {cutoff.isoformat()} cleared, "
                 f"purged at {(cutoff + ONE_DAY).isoformat()} ...")
            prepared = prepare_daily(srv, cfg, daily_db, cutoff,
                                     seed_db if cfg.daily_rows == cfg.rows else None)
            daily = run_daily(ctx, srv, cfg, daily_db, run_db, cutoff + ONE_DAY,
                              previous_row_s=prepared["previous_row_s"])
        load_after = os.getloadavg()
    finally:
        for db in (run_db, seed_db, seed10_db, daily_db):
            srv.drop(db)
        version = srv.scalar("SHOW server_version")
        srv.dispose()

    report = bench_report(cfg, full, tenth, prunable, cutoff, results, {
        "cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after,
        "postgres": version}, daily)
    if cfg.out is not None:
        write_json(report, cfg.out)
    return report
