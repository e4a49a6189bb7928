"""The benchmark, as a quick smoke run: the JSON it writes and the rows each strategy deletes.

Timings are not asserted: they depend on the machine. What must hold at any size is that every
strategy deletes exactly the prunable rows and no account row, in both scenarios.
"""

from __future__ import annotations

import datetime as dt
import json
import os

from favorites_maintenance.bench import STRATEGIES, BenchConfig, format_table, run_bench


def test_a_small_bench_writes_every_strategy_and_deletes_exactly_the_prunable_rows(
        pg_server, tmp_path):
    # One run serves every assertion (restoring the data set before each strategy and J's runs
    # through Dagster dominate): the default strategies, A_fixed beside the adaptive A, A with
    # an archive, A_page beside A (which goes in keyset order on so small a table), and the
    # daily scenario on the same data set. A 0.2 s idle window still holds some 40 statements
    # of the user workload (200 a second), enough for its p99.
    out = tmp_path / "bench-results" / "purge.json"
    rows = 60_000  # a backlog above the largest batch: A and A_paced take several
    run_bench(pg_server, BenchConfig(rows=rows, idle_seconds=0.2, out=out, batch_size=200,
                                     strategies=(*STRATEGIES, "A_fixed", "A_archive",
                                                 "A_page"),
                                     scenarios=("backlog", "daily"), daily_rows=rows,
                                     paced_sleep_ratio=1.0,
                                     db_prefix=f"bench{os.getpid()}", echo=lambda line: None))

    report = json.loads(out.read_text())
    for key in ("rows_total", "prunable_rows", "user_p99_ms_idle", "peak_rss_mb", "strategies"):
        assert key in report, key
    assert report["rows_total"] == rows
    assert 0 < report["prunable_rows"] < report["guest_rows"]
    assert set(report["peak_rss_mb"]) == {"10%", "100%"}
    assert set(report["strategies"]) == {*STRATEGIES, "A_fixed", "A_archive", "A_page"}
    for name, strategy in report["strategies"].items():
        for key in ("rows_deleted", "rows_per_second", "ratio_to_B", "ratio_to_C",
                    "batch_p50_ms", "batch_p99_ms", "batch_max_ms", "wal_bytes", "user_p99_ms",
                    "user_p99_ms_idle", "peak_rss_mb", "peak_rss_mb_10pct",
                    "deciles_us_per_row", "scan_mode", "paced_ms"):
            assert key in strategy, (name, key)
        assert strategy["rows_deleted"] == report["prunable_rows"], name
        assert strategy["prunable_rows_left"] == 0, name
        assert strategy["account_rows_deleted"] == 0, name
        assert strategy["correct"] and strategy["correct_10pct"], name
    assert report["strategies"]["A4"]["workers"] == 4
    table = format_table(report)
    assert "A4" in table
    # J ran the job through Dagster and is rated by its purge; the overhead over A is reported.
    job = report["strategies"]["J"]
    assert job["batches"] >= 1 and job["purge_duration_s"] > 0 and job["run_duration_s"] > 0
    assert job["run_rows_per_second"] < job["rows_per_second"]
    assert isinstance(report["overhead_ms_per_batch"], float)
    # Deciles need 10 batches: D's stay at 200 rows (A's grow, and may be fewer); the time
    # per row is given for every tenth of the rows whatever the batches.
    assert len(report["strategies"]["D"]["deciles"]) == 10
    assert len(report["strategies"]["A"]["deciles_us_per_row"]) == 10
    assert all(d > 0 for d in report["strategies"]["A"]["deciles_us_per_row"])

    # A chose keyset order for this table, A_page walked it in page order; the job recorded its
    # own order; A_paced paused between its batches, A never did.
    strategies = report["strategies"]
    assert strategies["A"]["scan_mode"] == "keyset"
    assert strategies["A"]["scan_reason"].startswith("keyset order: the table has ")
    assert strategies["A_page"]["scan_mode"] == "page_order"
    assert job["scan_mode"] == "keyset"
    assert strategies["A_paced"]["paced_ms"] > 0 and strategies["A"]["paced_ms"] == 0
    assert {"A_x_B", "A_x_C", "A_paced_user_p99_x_idle"} <= set(report["targets"])

    # The daily scenario: the day's rows of the data set whose backlog was cleared, deleted
    # exactly by each strategy, in keyset order; J is timed from launch to success.
    daily = report["daily"]
    assert 0 < daily["prunable_rows"] < report["prunable_rows"] // 100
    assert set(daily["strategies"]) == {"A", "B", "B_index", "C", "J"}
    for name, strategy in daily["strategies"].items():
        assert strategy["rows_deleted"] == daily["prunable_rows"], name
        assert strategy["correct"] and strategy["duration_s"] > 0, name
    assert daily["strategies"]["A"]["scan_mode"] == "keyset"
    assert daily["one_delete_strategy"] in ("B", "B_index")
    assert daily["strategies"][daily["one_delete_strategy"]]["x_one_delete"] == 1.0
    assert daily["strategies"]["J"]["launch_to_success_s"] >= daily["strategies"]["J"][
        "duration_s"]
    assert {"daily_A_x_one_delete", "daily_J_x_one_delete"} <= set(report["targets"])
    assert "daily: " in table

    # A_fixed, the explicit batch size, never runs a batch above it (a slow one may run
    # smaller); the adaptive A grows past it.
    fixed, adaptive = report["strategies"]["A_fixed"], report["strategies"]["A"]
    assert fixed["batch_size_max"] == 200
    assert fixed["batches"] >= -(-report["prunable_rows"] // 200)
    assert adaptive["batch_size_max"] > 200 and report["target_batch_ms"] == 200
    assert "A_fixed: largest batch 200 rows" in table

    # A_archive moved every row it deleted into the archive, once.
    assert report["strategies"]["A_archive"]["archived_rows"] == report["prunable_rows"]
    assert "A_archive against A: " in table


def test_the_partitioned_bench_removes_the_same_rows_by_drops_as_by_deletes(pg_server, tmp_path):
    from favorites_maintenance.bench.partitioned import run_partitioned_bench

    out = tmp_path / "partitioned.json"
    run_partitioned_bench(pg_server, 20_000, out=out, echo=lambda line: None,
                          db_prefix=f"bench_part{os.getpid()}")
    report = json.loads(out.read_text())
    data = report["data"]
    assert (data["partitions"], data["expired_partitions"]) == (36, 24)
    assert 0 < data["prunable"] < data["rows"] and data["accounts"] > 0
    rows, drops = report["strategies"]["rows"], report["strategies"]["drops"]
    for strategy in (rows, drops):
        assert strategy["correct"], strategy
        assert strategy["rows_removed"] == data["prunable"]
        assert strategy["after"]["accounts"] == data["accounts"]
        assert strategy["wal_bytes"] > 0
    # Every prunable row lies in the 24 expired partitions: the drops leave none to batches.
    assert (drops["partitions_detached"], drops["partitions_dropped"]) == (24, 24)
    assert drops["rows_deleted_in_batches"] == 0
    assert set(report["ratios"]) == {"time_rows_over_drops", "wal_rows_over_drops"}


def test_a_held_bench_keeps_every_held_row_and_deletes_the_rest(pg_server, tmp_path):
    """``A_held``: A with a hold table holding prunable rows: every held row stays, every
    other prunable row goes."""
    from favorites_maintenance.bench.strategies import HELD_KEYS

    out = tmp_path / "bench-results" / "purge.json"
    run_bench(pg_server, BenchConfig(rows=80_000, idle_seconds=0.2, out=out, batch_size=500,
                                     strategies=("A_held",), scenarios=("backlog",),
                                     db_prefix=f"benchheld{os.getpid()}",
                                     echo=lambda line: None))
    report = json.loads(out.read_text())
    held = report["strategies"]["A_held"]
    assert held["correct"] and held["correct_10pct"]
    assert held["held_rows"] == held["held_rows_left"] == min(HELD_KEYS,
                                                               report["prunable_rows"])
    assert held["rows_deleted"] == report["prunable_rows"] - held["held_rows"] > 0


def test_the_policies_bench_counts_what_the_definitions_of_its_policies_hold(tmp_path):
    """``bench --scenarios policies --policies 2``, a short idle window: the sensors, schedules
    and jobs it reports are those of the definitions of its two policies, built here."""
    from click.testing import CliRunner
    from dagster.components.testing import create_defs_folder_sandbox

    from favorites_maintenance.bench.policies import policy_yaml
    from favorites_maintenance.cli import main

    out = tmp_path / "purge.json"
    result = CliRunner().invoke(main, [
        "bench", "--scenarios", "policies", "--policies", "2", "--policies-idle-seconds", "2",
        "--policies-warmup-seconds", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "policies.json").read_text())
    with create_defs_folder_sandbox() as sandbox:
        for number in (1, 2):
            folder = sandbox.defs_folder_path / f"policy_{number:05d}"
            folder.mkdir()
            (folder / "defs.yaml").write_text(policy_yaml(number))
        with sandbox.build_component_tree() as tree:
            repo = tree.build_defs().get_repository_def()
    jobs = [j for j in repo.get_all_jobs() if not j.name.startswith("__ASSET_JOB")]
    assert (report["policies"], report["sensors"], report["schedules"], report["jobs"]) == (
        2, len(repo.sensor_defs), len(repo.schedule_defs), len(jobs))
    assert report["sensor_tick_ms"]["sensors"] == len(repo.sensor_defs)
    idle = report["idle"]
    processes = ("code_server", "daemon", "webserver")
    assert all(idle[f"{name}_cpu_s"] >= 0 for name in processes)
    # The three processes `dagster dev` runs, together.
    assert idle["cores"] >= max(idle[f"{name}_cores"] for name in processes)
    # CPU time beside the elapsed time: no more than the machine's cores give in that time.
    cores = os.cpu_count() or 1
    assert 0 < report["build_cpu_s"] <= cores * report["build_s"] + 0.1
    assert 0 <= report["resolve_cpu_s"] <= cores * report["resolve_s"] + 0.1
    assert f"{report['sensors']} sensors, {report['schedules']} schedules" in result.output
    assert not out.exists()  # the other scenarios did not run


def test_the_launch_report_counts_the_runs_of_a_database_in_progress_at_once():
    """The ``launch`` scenario's figures from its runs: a run launched as the one before it
    ends does not overlap it, two runs of a database in progress together count 2, and the
    drain runs from the tick to the last run's end."""
    from favorites_maintenance.bench.launch import KEPT_ROWS, database_variable, launch_report

    tick = dt.datetime(2026, 12, 2, 3, 0, tzinfo=dt.timezone.utc)
    at = tick.timestamp()
    first, second = database_variable(1), database_variable(2)

    def run(database, start, end, status="SUCCESS", launched=None):
        return {"status": status, "launched": at + (start if launched is None else launched),
                "start_time": at + start, "end_time": at + end, "database": database,
                "scheduled": tick.isoformat()}

    # In progress from its launch (its run worker starting) to its end.
    report = launch_report([run(first, 1, 5, launched=0.5), run(first, 5, 9),
                            run(second, 2, 6), run(second, 4, 8, "FAILURE")], 4, 2,
                           {first: 2 * KEPT_ROWS, second: 2 * KEPT_ROWS})
    assert report["max_concurrent_per_database"] == {first: 1, second: 2}
    assert report["max_concurrent"] == 3  # from 4 to 5 s: one of the first, two of the second
    assert (report["drain_s"], report["first_launch_s"], report["longest_wait_s"]) == (9, 0.5, 5)
    assert report["runs"] == {"SUCCESS": 3, "FAILURE": 1}
    assert report["rows_left"] == report["rows_kept"] == {first: 40, second: 40}
