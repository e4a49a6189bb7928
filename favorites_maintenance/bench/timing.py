"""One timed run of a strategy: the data set restored, the purging workers and the user
workload started in processes of their own, the purge's window and WAL measured."""

from __future__ import annotations

import datetime as dt
import time

from favorites_maintenance.bench.config import BenchConfig
from favorites_maintenance.bench.report import run_figures
from favorites_maintenance.bench.server import BenchServer, engine_on
from favorites_maintenance.bench.strategies import (
    HOLD_TABLE,
    WORKERS,
    place_bench_holds,
    purge_child,
    worker_kind,
)
from favorites_maintenance.bench.workload import (
    count_held_left,
    count_rows,
    sample_ids,
    user_workload,
)


def run_strategy(ctx, srv: BenchServer, cfg: BenchConfig, strategy: str, template: str,
                 db: str, cutoff: dt.datetime, workload: bool,
                 previous_row_s: float | None = None) -> dict:
    """Restore ``template`` as ``db``, run ``strategy`` on it (beside the user workload when
    ``workload``) and return its :func:`~favorites_maintenance.bench.report.run_figures`, with
    ``statements`` where ``pg_stat_statements`` is loaded. ``previous_row_s``: the time per
    row of the run before, seconds, which ``A`` and ``J`` size their first batch from
    (``None``: a first run).

    Raises:
        RuntimeError: a worker or the user workload failed.
    """
    srv.restore(template, db)
    url = srv.url(db)
    url_s = url.render_as_string(hide_password=False)
    holds = held = None
    if strategy == "A_held":
        with engine_on(url) as engine:
            held = place_bench_holds(engine, cutoff)
        holds = HOLD_TABLE
    before = count_rows(url, cutoff, holds=holds)
    user = None
    stop = ctx.Event()
    procs: list = []
    try:
        if workload:
            accounts, guests = sample_ids(url, cutoff)
            user_recv, user_send = ctx.Pipe(duplex=False)
            user = ctx.Process(target=user_workload, name="bench-user-workload",
                               args=(url_s, accounts, guests or accounts, cfg.user_ops_per_second,
                                     17, stop, user_send))
            user.start()
            user_send.close()

        start = ctx.Event()
        pipes = []
        for _ in range(WORKERS[strategy]):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=purge_child, name=f"bench-purge-{strategy}",
                            args=(worker_kind(strategy), url_s, cutoff, cfg.batch_size,
                                  cfg.max_run_duration.total_seconds(), start, send,
                                  {"sleep_ratio": cfg.paced_sleep_ratio,
                                   "previous_row_s": previous_row_s}))
            p.start()
            send.close()
            pipes.append(recv)
            procs.append(p)
        for pipe in pipes:
            _expect_ready(pipe, f"strategy {strategy}")
        if workload:
            _expect_ready(user_recv, "user workload")
        idle_from = time.monotonic()
        if workload:
            time.sleep(cfg.idle_seconds)
        if statements := srv.has_pg_stat_statements():
            srv.execute("SELECT pg_stat_statements_reset()")
        lsn0 = srv.lsn()
        start.set()
        results = [pipe.recv() for pipe in pipes]
        lsn1 = srv.lsn()
        for p in procs:
            p.join()
        samples: list[tuple[float, float]] = []
        if user is not None:
            stop.set()
            got = user_recv.recv()
            user.join()
            if "error" in got:
                raise RuntimeError(f"user workload failed: {got['error']}")
            samples = got["samples"]
    finally:
        # On an error, end the processes this strategy started (and only those).
        stop.set()
        for proc in [*procs, *([user] if user is not None else [])]:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join()

    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"strategy {strategy} failed: {errors}")

    after = count_rows(url, cutoff, before["max_id"], holds=holds)
    out = run_figures(results, before, after, samples, idle_from, srv.wal_diff(lsn0, lsn1),
                      workload)
    if held is not None:
        # Every held row is still there.
        out["held_rows"] = held
        out["held_rows_left"] = count_held_left(url)
        out["correct"] = out["correct"] and out["held_rows_left"] == held
    if statements:
        out["statements"] = srv.top_statements(db)
    return out


def _expect_ready(pipe, who: str) -> None:
    got = pipe.recv()
    if got != "ready":
        raise RuntimeError(f"{who} failed to start: {got.get('error', got)}")
