"""The bench's ``daily`` scenario: the run users meet every day.

A data set of ``daily_rows`` rows (the same seed as the backlog scenario) whose backlog was
cleared the day before (every row prunable at the bench's cutoff deleted by the purge, then
``VACUUM (FREEZE, ANALYZE)``, as autovacuum would leave it), purged one day later: only the rows
that expired during that day are prunable. ``A`` and ``J`` start from the time per row of the
purge that cleared the backlog, as a daily run starts from its previous run's. Each of
``daily_strategies`` (``A``, ``B``, ``B_index``, ``C``, ``J``) deletes them on a fresh copy,
without the user workload (the runs last milliseconds, which a concurrent workload would
blur). What counts is the fixed cost of a run:
``A``'s whole purge and ``J``'s ``durationMs`` against one ``DELETE`` of the same rows, the
faster of ``B`` (which, from the table's statistics, still expects a year of guest rows and
may read the whole table) and ``B_index`` (the same ``DELETE`` through the rule's partial
index), and ``J`` from launch to success.
"""

from __future__ import annotations

import datetime as dt
import statistics

from favorites_maintenance.bench.config import BenchConfig
from favorites_maintenance.bench.server import BenchServer
from favorites_maintenance.bench.timing import run_strategy
from favorites_maintenance.bench.workload import count_rows, seed_template
from favorites_maintenance.config.policy_settings import (
    DEFAULT_BATCH_SIZE_MAX,
    DEFAULT_KEYSET_BATCH_SIZE_MAX,
    DEFAULT_TARGET_BATCH_DURATION,
)

#: How much later the daily run is than the clearing of the backlog.
ONE_DAY = dt.timedelta(days=1)


def prepare_daily(srv: BenchServer, cfg: BenchConfig, db: str, cutoff: dt.datetime,
                  seeded: str | None) -> dict:
    """Create database ``db``: the data set with its backlog at ``cutoff`` cleared (by the
    purge at A's settings) and vacuumed; ``seeded`` is a template of the same size to start
    from (``None``: seed one). Returns the data set's counts (:func:`~favorites_maintenance.
    bench.workload.seed_template`) and ``previous_row_s``, the clearing purge's time per row,
    seconds (``None`` when it deleted nothing)."""
    if seeded is not None:
        srv.restore(seeded, db)
        counts = {"rows": cfg.daily_rows}
    else:
        counts = seed_template(srv, db, cfg.daily_rows, cfg.seed)
    from favorites_maintenance.bench.server import engine_on
    from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
    from favorites_maintenance.retention.batch_loop import PurgeOptions
    from favorites_maintenance.retention.purge import purge

    with engine_on(srv.url(db)) as engine:
        cleared = purge(engine, GUEST_FAVORITES, cutoff, PurgeOptions(
            batch_size=cfg.batch_size, batch_size_max=DEFAULT_BATCH_SIZE_MAX,
            keyset_batch_size_max=DEFAULT_KEYSET_BATCH_SIZE_MAX,
            target_batch_duration=DEFAULT_TARGET_BATCH_DURATION,
            max_run_duration=cfg.max_run_duration))
        with engine.begin() as conn:  # what the time budget may have left
            conn.execute(GUEST_FAVORITES.delete_prunable(cutoff))
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM (FREEZE, ANALYZE) favorites.favorites")
    return {**counts, "previous_row_s": cleared.row_s}


def run_daily(ctx, srv: BenchServer, cfg: BenchConfig, template: str, run_db: str,
              cutoff: dt.datetime, previous_row_s: float | None = None) -> dict:
    """Run the ``daily`` scenario on ``template`` (see :func:`prepare_daily`), its day's rows
    prunable at ``cutoff``; ``cfg.repeat`` rounds, the median round by time per strategy.
    ``previous_row_s``: the time per row of the run before (:func:`prepare_daily`'s), which
    ``A`` and ``J`` size their first batch from.

    Returns:
        ``rows_total``, ``prunable_rows``, ``cutoff``, ``one_delete_s`` and
        ``one_delete_strategy`` (the faster of ``B`` and ``B_index``), and ``strategies``: per
        strategy ``rows_deleted``, ``correct``, ``duration_s`` (the purge; for ``J`` its
        ``durationMs``), ``x_one_delete``, ``scan_mode``, and for ``J`` ``run_duration_s``
        and ``launch_to_success_s``.
    """
    prunable = count_rows(srv.url(template), cutoff)["prunable"]
    rounds: dict[str, list[dict]] = {s: [] for s in cfg.daily_strategies}
    for round_no in range(1, cfg.repeat + 1):
        for strategy in cfg.daily_strategies:
            res = run_strategy(ctx, srv, cfg, strategy, template, run_db, cutoff,
                               workload=False, previous_row_s=previous_row_s)
            res["duration_s"] = res.get("purge_duration_s", res["duration_s"])
            rounds[strategy].append(res)
            cfg.echo(f"daily {strategy} (round {round_no}/{cfg.repeat}): "
                     f"{res['rows_deleted']:,} rows in {res['duration_s'] * 1000:.1f} ms"
                     + (f" (launch to success {res['launch_to_success_s']:.2f} s)"
                        if "launch_to_success_s" in res else ""))
    results = {}
    for strategy, done in rounds.items():
        ordered = sorted(done, key=lambda r: r["duration_s"])
        res = ordered[(len(ordered) - 1) // 2]
        results[strategy] = {
            "rows_deleted": res["rows_deleted"],
            "correct": all(r["correct"] for r in done),
            "duration_s": res["duration_s"],
            "duration_s_runs": [r["duration_s"] for r in done],
            "batches": res["batches"],
            "scan_mode": res.get("scan_mode"),
            "scan_reason": res.get("scan_reason"),
            **({k: res[k] for k in ("run_duration_s", "launch_to_success_s")}
               if strategy == "J" else {}),
        }
    deletes = {name: results[name]["duration_s"] for name in ("B", "B_index") if name in results}
    reference = min(deletes, key=deletes.get) if deletes else None
    one_delete = deletes.get(reference)
    for res in results.values():
        res["x_one_delete"] = (round(res["duration_s"] / one_delete, 2) if one_delete
                               else None)
    j = results.get("J")
    return {
        "rows_total": cfg.daily_rows,
        "prunable_rows": prunable,
        "cutoff": cutoff.isoformat(),
        "repeat": cfg.repeat,
        "one_delete_s": one_delete,
        "one_delete_strategy": reference,
        "launch_to_success_s": j["launch_to_success_s"] if j else None,
        "median_launch_to_success_s": (statistics.median(
            r["launch_to_success_s"] for r in rounds["J"]) if j else None),
        "strategies": results,
    }

