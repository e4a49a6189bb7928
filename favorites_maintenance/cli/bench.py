"""``bench``: the purge against one DELETE and the usual alternatives
(:mod:`favorites_maintenance.bench`)."""

from __future__ import annotations

import click

from favorites_maintenance.cli.common import echo, fail


@click.command(short_help="Benchmark the purge against one DELETE and the usual alternatives.")
@click.option("--rows", default=2_000_000, show_default=True, type=click.IntRange(min=10_000),
              help="Size of the seeded data set (the memory check also runs at 10% of it).")
@click.option("--strategies", default="A,A_paced,B,C,D,A2,A4", show_default=True,
              help="Comma-separated subset of A, A_paced (A with sleep_ratio set and batches "
                   "of at most 1000 rows), B, C, D, A2, A4, J (the job through Dagster), A_durable (A with synchronous_commit on), "
                   "A_fixed (A with an explicit batch size: no batch above it), A_lock_first "
                   "(A locking every batch's rows before deleting them), A_archive (A moving "
                   "every row into an archive table), A_keyset and A_page (A in keyset order, "
                   "in page order, whatever the backlog) and B_index (B through the rule's "
                   "index), run in that order.")
@click.option("--scenarios", default="backlog", show_default=True,
              help="Comma-separated subset of backlog (every prunable row of the data set), "
                   "daily (A, B, B_index, C and J on one day's newly expired rows of a "
                   "data set whose backlog was cleared) and partitioned (the table "
                   "partitioned by month over 36 months, two thirds wholly expired, --rows "
                   "rows: dropping the expired partitions against deleting their rows; its "
                   "JSON goes to partitioned.json beside --out) and policies (--policies "
                   "generated policies: the code location's build time, its sensors, schedules "
                   "and jobs, one tick of each sensor, the idle CPU of a code server and a "
                   "daemon; no database; its JSON goes to policies.json beside --out) and "
                   "launch (--policies generated policies on --launch-databases databases, one "
                   "schedule tick starting them all under dagster.yaml's run queue: the time "
                   "the queue takes to drain and the most runs of one database at once; its "
                   "JSON goes to launch.json beside --out).")
@click.option("--policies", "policy_count", default=100, show_default=True,
              type=click.IntRange(min=1), help="Generated policies of the policies scenario.")
@click.option("--launch-databases", default=3, show_default=True, type=click.IntRange(min=1),
              help="Databases the launch scenario spreads its policies over.")
@click.option("--launch-lead-seconds", default=240.0, show_default=True,
              type=click.FloatRange(min=60),
              help="How far ahead the launch scenario sets its tick: the code server must serve "
                   "and the daemon see the schedules before it.")
@click.option("--policies-idle-seconds", default=60.0, show_default=True,
              type=click.FloatRange(min=1),
              help="Window over which the policies scenario reads the idle CPU.")
@click.option("--policies-warmup-seconds", default=30.0, show_default=True,
              type=click.FloatRange(min=0),
              help="How long the daemon runs before that window.")
@click.option("--daily-rows", default=10_000_000, show_default=True,
              type=click.IntRange(min=10_000),
              help="Size of the daily scenario's data set (the backlog's, reused, when equal "
                   "to --rows).")
@click.option("--paced-sleep-ratio", default=3.0, show_default=True,
              type=click.FloatRange(min=0, max=100), help="sleep_ratio of A_paced.")
@click.option("--idle-seconds", default=5.0, show_default=True, type=click.FloatRange(min=0.5),
              help="Idle window of the user workload before each purge.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help="Full-size runs per strategy, in rounds; the median-throughput run is "
                   "reported (use 3 on a busy machine).")
@click.option("--out", default="bench-results/purge.json", show_default=True,
              type=click.Path(dir_okay=False), help="Where the JSON results go.")
@click.option("--pgdata", default=None, type=click.Path(file_okay=False),
              help="Data folder of the bench's own server "
                   "[default: .favorites-maintenance/bench/pgdata in the checkout].")
def bench(rows: int, strategies: str, scenarios: str, policy_count: int, launch_databases: int,
          launch_lead_seconds: float, policies_idle_seconds: float, policies_warmup_seconds: float, daily_rows: int,
          paced_sleep_ratio: float, idle_seconds: float, repeat: int, out: str,
          pgdata: str | None) -> None:
    """Benchmark the purge (A) against one DELETE (B), Laravel's ctid loop (C), naive SKIP
    LOCKED batches (D) and A in 2 and 4 processes, on the embedded PostgreSQL."""
    from pathlib import Path

    from favorites_maintenance import bench as bench_mod
    from favorites_maintenance.local.environment import (
        STATE_DIR,
        NotACheckoutError,
        project_root,
    )

    chosen = [s.strip().upper() for s in strategies.split(",") if s.strip()]
    known = {s.upper(): s for s in bench_mod.STRATEGIES + bench_mod.EXTRA_STRATEGIES}
    unknown = [s for s in chosen if s not in known]
    chosen = [known.get(s, s) for s in chosen]
    if unknown or not chosen:
        fail(f"--strategies: unknown {unknown or strategies!r}; choose from "
              f"{', '.join(bench_mod.STRATEGIES + bench_mod.EXTRA_STRATEGIES)}")
    chosen_scenarios = [s.strip().lower() for s in scenarios.split(",") if s.strip()]
    known_scenarios = (*bench_mod.SCENARIOS, "partitioned", "policies", "launch")
    if not chosen_scenarios or set(chosen_scenarios) - set(known_scenarios):
        fail(f"--scenarios: unknown {scenarios!r}; choose from {', '.join(known_scenarios)}")
    if "policies" in chosen_scenarios:  # needs no database server
        chosen_scenarios.remove("policies")
        _bench_policies(policy_count, policies_idle_seconds, policies_warmup_seconds,
                        Path(out).with_name("policies.json"))
        if not chosen_scenarios:
            return
    try:
        folder = Path(pgdata) if pgdata else project_root() / STATE_DIR / "bench" / "pgdata"
    except NotACheckoutError as exc:
        fail(f"{exc}; or give --pgdata")
    echo(f"starting the bench's embedded PostgreSQL server ({folder})")
    server = bench_mod.start_server(folder)
    if "launch" in chosen_scenarios:
        chosen_scenarios.remove("launch")
        try:
            _bench_launch(server, policy_count, launch_databases, launch_lead_seconds,
                          Path(out).with_name("launch.json"))
        finally:
            if not chosen_scenarios:
                server.stop()
        if not chosen_scenarios:
            return
    if "partitioned" in chosen_scenarios:
        chosen_scenarios.remove("partitioned")
        try:
            _bench_partitioned(server, rows, Path(out).with_name("partitioned.json"))
        finally:
            if not chosen_scenarios:
                server.stop()
        if not chosen_scenarios:
            return
    try:
        report = bench_mod.run_bench(server, bench_mod.BenchConfig(
            rows=rows, strategies=chosen, idle_seconds=idle_seconds, repeat=repeat, out=Path(out),
            echo=echo, scenarios=chosen_scenarios, daily_rows=daily_rows,
            paced_sleep_ratio=paced_sleep_ratio))
    finally:
        server.stop()
    echo("")
    echo(bench_mod.format_table(report))
    echo(f"results written to {out}")
    wrong = [name for name, r in report["strategies"].items()
             if not (r["correct"] and r["correct_10pct"])]
    wrong += [f"daily {name}" for name, r in (report.get("daily") or {}).get("strategies",
                                                                          {}).items()
              if not r["correct"]]
    if wrong:
        fail(f"strategies {', '.join(wrong)} did not delete exactly the prunable rows")


def _bench_partitioned(server, rows: int, out) -> None:
    """The ``partitioned`` scenario of ``bench``: its figures on the console, its JSON in
    ``out``; fails when a strategy did not remove exactly the prunable rows."""
    from favorites_maintenance.bench.partitioned import run_partitioned_bench

    report = run_partitioned_bench(server, rows, out=out, echo=echo)
    rows_run, drops = report["strategies"]["rows"], report["strategies"]["drops"]
    echo(f"drops against row deletes: "
          f"{_times(rows_run['seconds'], drops['seconds'], 'faster', 'slower', 'as fast')}, "
          f"{_times(rows_run['wal_bytes'], drops['wal_bytes'], 'less WAL', 'more WAL', 'as much WAL')}; "
          f"results written to {out}")
    if not all(r["correct"] for r in report["strategies"].values()):
        fail("partitioned: a strategy did not remove exactly the prunable rows")


def _bench_policies(count: int, idle_seconds: float, warmup_seconds: float, out) -> None:
    """The ``policies`` scenario of ``bench``: its figures on the console, its JSON in
    ``out``."""
    from favorites_maintenance.bench.policies import run_policies_bench

    try:
        run_policies_bench(count, idle_seconds=idle_seconds, warmup_seconds=warmup_seconds,
                           out=out, echo=echo)
    except RuntimeError as exc:
        fail(f"policies: {exc}")
    echo(f"results written to {out}")


def _bench_launch(server, count: int, databases: int, lead_seconds: float, out) -> None:
    """The ``launch`` scenario of ``bench``: its figures on the console, its JSON in ``out``;
    fails when a run did not succeed, when two runs of one database overlapped or when a
    table was left with other rows than the rule keeps."""
    from favorites_maintenance.bench.launch import run_launch_bench
    from favorites_maintenance.local.environment import NotACheckoutError, project_root

    try:
        instance_yaml = project_root() / "dagster.yaml"
    except NotACheckoutError as exc:
        fail(f"launch: {exc}; the scenario runs the checkout's dagster.yaml, run it there")
    try:
        report = run_launch_bench(server, count, databases, instance_yaml, out=out, echo=echo,
                                  lead_seconds=lead_seconds)
    except RuntimeError as exc:
        fail(f"launch: {exc}")
    echo(f"results written to {out}")
    if set(report["runs"]) != {"SUCCESS"}:
        fail(f"launch: not every run succeeded: {report['runs']}")
    if max(report["max_concurrent_per_database"].values(), default=0) > 1:
        fail("launch: two runs of one database were in progress at once: "
             f"{report['max_concurrent_per_database']}")
    if report["rows_left"] != report["rows_kept"]:
        fail(f"launch: rows left {report['rows_left']}, the rule keeps {report['rows_kept']}")


def _times(deletes: float, drops: float, better: str, worse: str, same: str) -> str:
    """``11.7x faster``, ``10.8x slower`` or ``about as fast``: the drops' figure against the
    row deletes', worded so that the ratio is never below 1 (a small data set's drops cost more
    than its deletes, and "0.1x faster" read as a gain)."""
    deletes, drops = max(deletes, 1e-9), max(drops, 1e-9)
    if max(deletes, drops) / min(deletes, drops) < 1.05:
        return f"about {same}"
    if deletes > drops:
        return f"{deletes / drops:.1f}x {better}"
    return f"{drops / deletes:.1f}x {worse}"
