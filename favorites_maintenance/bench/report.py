"""What ``favorites-maintenance bench`` reports: each run's figures, the run that stands for a
strategy, the JSON report, and the console's progress line and table."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from pathlib import Path

from favorites_maintenance.bench.config import BenchConfig
from favorites_maintenance.config.policy_settings import (
    DEFAULT_BATCH_SIZE_MAX,
    DEFAULT_TARGET_BATCH_DURATION,
)

UTC = dt.timezone.utc


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in [0, 100]); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def deciles(durations: Sequence[float]) -> list[float] | None:
    """The p50 batch time of each tenth of a run, in ms, in run order (``None`` below 10
    batches)."""
    if len(durations) < 10:
        return None
    n = len(durations)
    return [_p_ms(durations[i * n // 10:(i + 1) * n // 10], 50) for i in range(10)]


def deciles_per_row(durations: Sequence[float], rows: Sequence[int]) -> list[float] | None:
    """The time per row of each tenth of a run's rows, in microseconds, in run order (``None``
    below 10 rows): a batch's time is spread over its rows, and a batch that deleted none (a
    range of pages without prunable rows) counts toward the tenth of the row that follows it.
    Batches differ in size, so this compares the start and the end of a run where the batch
    times (:func:`deciles`) cannot."""
    total = sum(rows)
    if total < 10:
        return None
    spent, counted, done = [0.0] * 10, [0.0] * 10, 0
    for seconds, n in zip(durations, rows):
        if not n:
            spent[min(9, done * 10 // total)] += seconds
            continue
        for tenth in range(done * 10 // total, min(9, (done + n - 1) * 10 // total) + 1):
            share = (min(done + n, (tenth + 1) * total / 10) - max(done, tenth * total / 10))
            spent[tenth] += seconds * share / n
            counted[tenth] += share
        done += n
    return [round(spent[i] / counted[i] * 1e6, 3) if counted[i] else None for i in range(10)]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _p_ms(seconds: Sequence[float], p: float) -> float | None:
    return _ms(percentile(seconds, p))


def _rate(rows: int, seconds: float) -> float:
    return round(rows / max(seconds, 1e-9), 1)


def run_figures(results: list[dict], before: dict, after: dict,
                samples: list[tuple[float, float]], idle_from: float, wal_cluster: int,
                workload: bool) -> dict:
    """The figures of one run of a strategy.

    Args:
        results: what each purging worker sent back (see
            :func:`~favorites_maintenance.bench.strategies.purge_child`).
        before, after: :func:`~favorites_maintenance.bench.workload.count_rows` before and
            after the purge.
        samples: the user workload's ``(monotonic start, latency s)``.
        idle_from: monotonic start of the idle window; the purge starts at the workers' ``t0``.
        wal_cluster: the server's WAL over the purge, in bytes.
        workload: whether the user workload ran (its figures are left out otherwise).

    Returns:
        The JSON's fields of one strategy (times in ms or s as named, WAL in bytes), with
        ``_idle_samples`` (the idle window's latencies, s) to pool before writing.
    """
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    deleted = sum(r["deleted"] for r in results)
    durations = [d for r in results for d in r["durations"]]
    batch_rows = [n for r in results for n in r.get("batch_rows", [0] * len(r["durations"]))]
    seconds = max(t1 - t0, 1e-9)
    idle = [lat for t, lat in samples if idle_from <= t < t0]
    during = [lat for t, lat in samples if t0 <= t <= t1]
    backend_wal = [r["wal_bytes"] for r in results]
    job = results[0] if "purge_seconds" in results[0] else None
    out = {
        "workers": len(results),
        "rows_deleted": deleted,
        "prunable_rows_before": before["prunable"],
        "prunable_rows_left": after["prunable"],
        "account_rows_deleted": before["accounts"] - after["accounts"],
        "correct": (deleted == before["prunable"] and after["prunable"] == 0
                    and after["accounts"] == before["accounts"]
                    # A_archive: every deleted row is in the archive, once.
                    and all(r.get("archived_rows", r["deleted"]) == r["deleted"]
                            for r in results)),
        "duration_s": round(seconds, 3),
        "rows_per_second": _rate(deleted, seconds),
        "batches": len(durations),
        "batch_p50_ms": _p_ms(durations, 50),
        "batch_p99_ms": _p_ms(durations, 99),
        "batch_max_ms": _ms(max(durations) if durations else None),
        "wal_bytes": sum(backend_wal) if None not in backend_wal else wal_cluster,
        "wal_bytes_cluster": wal_cluster,
        "peak_rss_mb": max(r["rss_mb"] for r in results),
        "rss_after_start_mb": max(r["rss_before_mb"] for r in results),
        "stop_reasons": sorted({r["stop_reason"] for r in results}),
        "deciles": deciles(durations),
        "deciles_us_per_row": deciles_per_row(durations, batch_rows),
        # The order A's batches took, and how long A_paced paused between them.
        "scan_mode": results[0].get("scan_mode"),
        "scan_reason": results[0].get("scan_reason"),
        "paced_ms": sum(r.get("paced_ms") or 0 for r in results),
        # The largest batch of A (adaptive), and how long it paused on database health.
        "batch_size_max": max((r.get("batch_size_max") or 0 for r in results), default=0)
        or None,
        "paused_ms": sum(r.get("paused_ms") or 0 for r in results),
    }
    if any("archived_rows" in r for r in results):
        out["archived_rows"] = sum(r.get("archived_rows", 0) for r in results)
    if job is not None:
        # The job's purge runs in a step process: rate it by its own durationMs, and the run
        # from start to end apart.
        out.update({
            "rows_per_second": _rate(deleted, job["purge_seconds"]),
            "purge_duration_s": round(job["purge_seconds"], 3),
            "run_duration_s": round(job["run_seconds"], 3),
            "run_rows_per_second": _rate(deleted, job["run_seconds"]),
            "launch_to_success_s": round(job["launch_seconds"], 3),
            "batches": job["job_batches"],
            "batch_max_ms": job["job_batch_max_ms"],
        })
    if workload:
        out.update({
            "user_ops_idle": len(idle), "user_ops": len(during),
            "user_p50_ms_idle": _p_ms(idle, 50),
            "user_p99_ms_idle": _p_ms(idle, 99),
            "user_p50_ms": _p_ms(during, 50),
            "user_p99_ms": _p_ms(during, 99),
            "user_max_ms": _ms(max(during) if during else None),
            "_idle_samples": idle,
        })
    return out


def median_run(runs: list[dict], small_run: dict) -> dict:
    """The run of median throughput among ``runs`` (one strategy's full-size rounds), with all
    its figures, and what holds over every round and the 10% run ``small_run``."""
    ordered = sorted(runs, key=lambda r: r["rows_per_second"])
    res = dict(ordered[(len(ordered) - 1) // 2])
    res["rows_per_second_runs"] = [r["rows_per_second"] for r in runs]
    res["correct"] = all(r["correct"] for r in runs)
    res["account_rows_deleted"] = max(r["account_rows_deleted"] for r in runs)
    res["_idle_samples"] = [x for r in runs for x in r["_idle_samples"]]
    res["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    res["peak_rss_mb_10pct"] = small_run["peak_rss_mb"]
    res["correct_10pct"] = small_run["correct"]
    return res


def bench_report(cfg: BenchConfig, full: dict, tenth: dict, prunable: int, cutoff: dt.datetime,
                 results: dict[str, dict], machine: dict, daily: dict | None = None) -> dict:
    """The whole JSON report from each strategy's :func:`median_run` (``results``, changed in
    place: ``ratio_to_B`` added, ``_idle_samples`` pooled into the top-level idle figures).

    ``full`` and ``tenth`` are the data sets (:func:`~favorites_maintenance.bench.workload.
    seed_template`), ``machine`` what the machine and the server were, ``daily`` the
    ``daily`` scenario (:func:`~favorites_maintenance.bench.daily.run_daily`, ``None`` when not
    run). ``targets`` says, for what ran, whether each target of the bench was met.
    """
    b_rate = results.get("B", {}).get("rows_per_second")
    overhead = None
    if "A" in results and "J" in results and results["J"]["batches"]:
        # What one batch costs more in the job than in the core: the job's purge time per batch
        # less A's wall time per batch.
        a, j = results["A"], results["J"]
        overhead = round(1000 * (j["purge_duration_s"] / j["batches"]
                                 - a["duration_s"] / max(a["batches"], 1)), 3)
    idle_all: list[float] = []
    for res in results.values():
        idle_all.extend(res.pop("_idle_samples", []))
        res["ratio_to_B"] = round(res["rows_per_second"] / b_rate, 3) if b_rate else None
        res["ratio_to_C"] = (round(res["rows_per_second"] / results["C"]["rows_per_second"], 3)
                             if "C" in results else None)
    return {
        "rows_total": full["rows"],
        "prunable_rows": prunable,
        "guest_rows": full["guest_rows"],
        "account_rows": full["account_rows"],
        "rows_total_10pct": tenth["rows"],
        "table_bytes": full["bytes"],
        "cutoff": cutoff.isoformat(),
        "seed": cfg.seed,
        "retention_days": cfg.retention_days,
        "batch_size": cfg.batch_size,
        "batch_size_max": DEFAULT_BATCH_SIZE_MAX,
        "target_batch_ms": DEFAULT_TARGET_BATCH_DURATION.total_seconds() * 1000,
        "user_ops_per_second": cfg.user_ops_per_second,
        "repeat": cfg.repeat,
        "user_p50_ms_idle": _p_ms(idle_all, 50),
        "user_p99_ms_idle": _p_ms(idle_all, 99),
        "peak_rss_mb": {
            "10%": results["A"]["peak_rss_mb_10pct"] if "A" in results else None,
            "100%": results["A"]["peak_rss_mb"] if "A" in results else None,
        },
        "machine": {**machine,
                    "finished_at": dt.datetime.now(UTC).isoformat(timespec="seconds")},
        **cfg.extra,
        "overhead_ms_per_batch": overhead,
        "strategies": results,
        "daily": daily,
        "targets": targets(results, daily),
    }


def targets(results: dict[str, dict], daily: dict | None) -> dict[str, dict]:
    """Each target of the bench that its strategies allow judging: the figure, the bound and
    whether it was met (``met``)."""
    out: dict[str, dict] = {}

    def judge(name: str, value: float | None, bound: float, at_most: bool = False) -> None:
        if value is not None:
            out[name] = {"value": round(value, 3), "bound": bound, "at_most": at_most,
                         "met": value <= bound if at_most else value >= bound}

    a = results.get("A")
    if a:
        judge("A_x_B", a.get("ratio_to_B"), 0.5)
        judge("A_x_C", a.get("ratio_to_C"), 2.0)
        per_row = a.get("deciles_us_per_row") or []
        if len(per_row) == 10 and per_row[0] and per_row[9]:
            judge("A_last_over_first_decile_per_row", per_row[9] / per_row[0], 1.2,
                  at_most=True)
    paced = results.get("A_paced")
    if paced and paced.get("user_p99_ms") and paced.get("user_p99_ms_idle"):
        judge("A_paced_user_p99_x_idle", paced["user_p99_ms"] / paced["user_p99_ms_idle"], 1.3,
              at_most=True)
    if daily:
        for name in ("A", "J"):
            res = daily["strategies"].get(name)
            if res:
                judge(f"daily_{name}_x_one_delete", res.get("x_one_delete"), 5.0, at_most=True)
    return out


def write_json(report: dict, out: Path) -> None:
    """Write ``report`` to ``out`` (its folder created), indented."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def progress_line(strategy: str, res: dict, round_no: int, repeat: int) -> str:
    """The console line of one full-size run."""
    return (f"strategy {strategy} (round {round_no}/{repeat}): "
            f"{res['rows_deleted']:,} rows in "
            + (f"{res['purge_duration_s']:.2f} s of purge (run start to end "
               f"{res['run_duration_s']:.2f} s) " if strategy == "J"
               else f"{res['duration_s']:.2f} s ")
            + f"({res['rows_per_second']:,.0f} rows/s), "
            + (f"batch p99 {res['batch_p99_ms']} ms, "
               if res['batch_p99_ms'] is not None else "")
            + f"user p99 {res['user_p99_ms_idle']} -> {res['user_p99_ms']} ms"
            + (f", largest batch {res['batch_size_max']:,}"
               if res.get("batch_size_max") else "")
            + ("" if res["correct"] else "  WRONG ROW COUNTS"))


def format_table(report: dict) -> str:
    """The results as a fixed-width text table."""
    head = (f"{'':12} {'rows deleted':>12} {'rows/s':>9} {'x B':>6} {'batch p50/p99/max ms':>24} "
            f"{'WAL MB':>8} {'user p99 idle->during ms':>25} {'RSS MB 10%/100%':>16}  ok")
    lines = [head, "-" * len(head)]
    for name, r in report["strategies"].items():
        batch = "/".join(f"{r[k]:.1f}" if r[k] is not None else "-"
                         for k in ("batch_p50_ms", "batch_p99_ms", "batch_max_ms"))
        ratio = f"{r['ratio_to_B']:.2f}" if r.get("ratio_to_B") is not None else "-"
        user = f"{r.get('user_p99_ms_idle') or 0:.2f} -> {r.get('user_p99_ms') or 0:.2f}"
        rss = f"{r['peak_rss_mb_10pct']:.0f}/{r['peak_rss_mb']:.0f}"
        ok = "yes" if r["correct"] and r["correct_10pct"] else "NO"
        lines.append(f"{name:12} {r['rows_deleted']:>12,} {r['rows_per_second']:>9,.0f} "
                     f"{ratio:>6} {batch:>24} {r['wal_bytes'] / 2**20:>8.1f} {user:>25} "
                     f"{rss:>16}  {ok}")
    lines.append(f"{report['rows_total']:,} rows, {report['prunable_rows']:,} prunable; "
                 f"median-throughput run of {report['repeat']} per strategy; user "
                 f"workload {report['user_ops_per_second']:.0f} ops/s, p99 idle (all windows) "
                 f"{report['user_p99_ms_idle']} ms; x B is shown when B ran")
    for name, r in report["strategies"].items():
        if r.get("scan_mode"):
            lines.append(f"{name}: {r['scan_reason'] or r['scan_mode']}"
                         + (f"; paused {r['paced_ms']:,} ms for sleep_ratio" if r.get("paced_ms")
                            else ""))
    if "J" in report["strategies"]:
        j = report["strategies"]["J"]
        lines.append(f"J (the job through Dagster): purge {j['rows_per_second']:,.0f} rows/s "
                     f"({j['purge_duration_s']:.2f} s), run start to end "
                     f"{j['run_rows_per_second']:,.0f} rows/s ({j['run_duration_s']:.2f} s); "
                     f"per-batch overhead over A: {report.get('overhead_ms_per_batch')} ms"
                     + (" (J's batches ran faster than A's)"
                        if (report.get("overhead_ms_per_batch") or 0) < 0 else "")
                     + "; its WAL is the whole server's, Dagster's storage included")
    if "A" in report["strategies"] and "A_archive" in report["strategies"]:
        a, moved = report["strategies"]["A"], report["strategies"]["A_archive"]
        lines.append(f"A_archive against A: {a['rows_per_second'] / moved['rows_per_second']:.2f} "
                     f"x the time per row, {moved['wal_bytes'] / max(a['wal_bytes'], 1):.2f} x "
                     f"the WAL ({moved.get('archived_rows', 0):,} rows archived)")
    target = report.get("target_batch_ms")
    for name, r in report["strategies"].items():
        if r.get("batch_size_max") and target:
            p99 = r["batch_p99_ms"] or 0
            lines.append(f"{name}: largest batch {r['batch_size_max']:,} rows; batch p99 "
                         f"{p99:.1f} ms = {p99 / target:.2f} x the {target:g} ms target; "
                         f"paused {r['paused_ms']:,} ms")
    for name, r in report["strategies"].items():
        if r.get("deciles"):
            lines.append(f"batch p50 per decile, {name:>2} (ms): "
                         + " ".join(f"{d:.1f}" for d in r["deciles"]))
        elif r.get("batch_p50_ms") is not None:
            lines.append(f"batch p50 per decile, {name:>2}: fewer than 10 batches")
        if r.get("deciles_us_per_row"):
            lines.append(f"us per row per tenth of the rows, {name:>2}: "
                         + " ".join(f"{d:.2f}" if d is not None else "-"
                                    for d in r["deciles_us_per_row"]))
    if report.get("daily"):
        lines.append(format_daily(report["daily"]))
    for name, t in report.get("targets", {}).items():
        lines.append(f"target {name}: {t['value']} ({'<=' if t['at_most'] else '>='} "
                     f"{t['bound']}): {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


def format_daily(daily: dict) -> str:
    """The ``daily`` scenario's lines of the console table."""
    head = (f"daily: {daily['rows_total']:,} rows, {daily['prunable_rows']:,} prunable "
            f"(one day's worth after the backlog was cleared); median of {daily['repeat']}; "
            f"one DELETE: {daily.get('one_delete_strategy')}")
    lines = [head]
    for name, r in daily["strategies"].items():
        ratio = (f"{r['x_one_delete']:.1f} x one DELETE" if r.get("x_one_delete") is not None
                 else "-")
        extra = (f"; run start to end {r['run_duration_s']:.2f} s, launch to success "
                 f"{r['launch_to_success_s']:.2f} s" if name == "J" else "")
        scan = f", {r['scan_mode']}" if r.get("scan_mode") else ""
        wrong = "" if r["correct"] else "  WRONG ROW COUNTS"
        lines.append(f"  {name:7} {r['rows_deleted']:>8,} rows in {r['duration_s'] * 1000:8.1f} "
                     f"ms ({ratio}{scan}){extra}{wrong}")
    return "\n".join(lines)
