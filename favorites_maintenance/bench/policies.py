"""``favorites-maintenance bench --scenarios policies --policies N``: what N policies cost
Dagster before a single row is deleted.

N generated policies, each a plain rule (the guest rule: ``user_id IS NULL``, 365 days) on a
table of its own, are written as ``defs/<policy>/defs.yaml`` files of a host project in a
temporary folder (Dagster's stock ``definitions.py``, ``load_from_defs_folder``; never the
package's own ``defs/``). The scenario reports:

- ``build_s``: the code location's definitions built from the folder, in a fresh process
  (after the imports, reported apart as ``import_s``), and ``resolve_s``: its repository
  resolved with every job, what a code server does before it serves; ``build_cpu_s`` and
  ``resolve_cpu_s``: the CPU time of the same two steps (user and system, seconds), which
  other work on a shared machine changes much less than their elapsed time;
- ``sensors``, ``schedules``, ``jobs``: counted from those built definitions (jobs without
  Dagster's implicit asset job);
- ``sensor_tick_ms``: one evaluation of each sensor (``dg.build_sensor_context`` on the
  scenario's own SQLite instance, the definitions' resources): the median, the slowest and the
  sum, milliseconds;
- ``idle``: the CPU time what ``dagster dev`` runs spends over ``idle_seconds`` once warmed
  up: a ``dagster code-server start``, and a ``dagster-webserver`` (the UI, no browser open)
  and a ``dagster-daemon run`` (every sensor and schedule running, as they default) on it,
  read from ``/proc/<pid>/stat`` (user and system time of each process and its descendants,
  the waited-for ones included), as cores (CPU seconds per second), and the sensor ticks the
  daemon recorded in the window. The window starts ``warmup_seconds`` after the daemon's
  first sensor tick (before it, the daemon is still loading the location).

No database is needed: the policies' database variable is unset, which only refuses their runs.
This module imports no Dagster; the measuring process (:data:`_MEASURE`) and the servers do.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

#: The host project's package; its ``definitions.py`` is Dagster's stock one.
PACKAGE = "bench_policies"
#: Sensor ticks of the instance's SQLite schedule storage, relative to ``DAGSTER_HOME``.
_SCHEDULE_DB = Path("schedules") / "schedules.db"

_STOCK_DEFINITIONS = '''\
from pathlib import Path

from dagster import definitions, load_from_defs_folder


@definitions
def defs():
    return load_from_defs_folder(path_within_project=Path(__file__).parent)
'''

#: Run in a fresh process, DAGSTER_HOME set: build, count, evaluate each sensor once; prints
#: one JSON document.
_MEASURE = '''\
import json, statistics, sys, time
from pathlib import Path

started = time.perf_counter()
import dagster as dg
import favorites_maintenance.components  # noqa: F401  (the component type)
imported, imported_cpu = time.perf_counter(), time.process_time()
defs = dg.load_from_defs_folder(path_within_project=Path(sys.argv[1]))
built, built_cpu = time.perf_counter(), time.process_time()
repo = defs.get_repository_def()
jobs = [j.name for j in repo.get_all_jobs() if not j.name.startswith("__ASSET_JOB")]
resolved, resolved_cpu = time.perf_counter(), time.process_time()
ticks = {}
with dg.DagsterInstance.get() as instance:
    for sensor in repo.sensor_defs:
        # Only the sensor's own: the databases' refuse an unset URL when built.
        resources = {k: (defs.resources or {})[k] for k in sensor.required_resource_keys}
        with dg.build_sensor_context(instance=instance, resources=resources,
                                     sensor_name=sensor.name) as context:
            t = time.perf_counter()
            sensor.evaluate_tick(context)
            ticks[sensor.name] = (time.perf_counter() - t) * 1000
print(json.dumps({
    "import_s": imported - started, "build_s": built - imported,
    "resolve_s": resolved - built, "build_cpu_s": built_cpu - imported_cpu,
    "resolve_cpu_s": resolved_cpu - built_cpu, "sensors": len(repo.sensor_defs),
    "schedules": len(repo.schedule_defs), "jobs": len(jobs), "sensor_tick_ms": ticks}))
'''


def policy_yaml(number: int) -> str:
    """The ``defs.yaml`` of generated policy ``number``: the guest rule on a table of its own,
    ``bench.policy_<number>``."""
    return ("type: favorites_maintenance.RetentionPolicy\n\nattributes:\n"
            f"  name: policy_{number:05d}\n  table: bench.policy_{number:05d}\n"
            "  key_column: id\n  age_column: updated_at\n  null_columns: [user_id]\n"
            "  partitions_start: 2026-11-01\n")


def write_project(root: Path, count: int) -> Path:
    """A host project at ``root`` with ``count`` generated policies (:func:`policy_yaml`);
    returns its ``defs`` folder."""
    package = root / "src" / PACKAGE
    defs = package / "defs"
    defs.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (defs / "__init__.py").write_text("")
    (package / "definitions.py").write_text(_STOCK_DEFINITIONS)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{PACKAGE.replace("_", "-")}"\nversion = "0.1.0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n'
        f'[tool.dg.project]\nroot_module = "{PACKAGE}"\n')
    for number in range(1, count + 1):
        folder = defs / f"policy_{number:05d}"
        folder.mkdir()
        (folder / "defs.yaml").write_text(policy_yaml(number))
    return defs


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and of every live descendant, each with
    the time of its waited-for children (``/proc/<pid>/stat`` fields 14-17); 0 for a process
    gone."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        # fields[0] is the state (field 3): ppid is field 4, utime..cstime fields 14-17.
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(f) for f in fields[11:15])
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier += children
    return sum(times.get(p, 0) for p in tree) / tick


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sensor_ticks(home: Path, since: float, until: float) -> int | None:
    """Sensor ticks the instance at ``home`` recorded between two UNIX instants (seconds);
    ``None`` when its schedule storage cannot be read."""
    try:
        with sqlite3.connect(f"file:{home / _SCHEDULE_DB}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT timestamp FROM job_ticks WHERE type = 'SENSOR'").fetchall()
    except sqlite3.Error:
        return None
    stamps = []
    for (stamp,) in rows:
        if isinstance(stamp, (int, float)):
            stamps.append(float(stamp))
        else:  # a naive UTC datetime, as text
            parsed = dt.datetime.fromisoformat(str(stamp))
            stamps.append(parsed.replace(tzinfo=parsed.tzinfo or dt.UTC).timestamp())
    return sum(1 for s in stamps if since <= s <= until)


def _start(command: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    # A session of its own: stopping it stops the servers it spawned too.
    return subprocess.Popen(command, env=env, cwd=cwd, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _wait_serving(port: int, env: dict[str, str], process: subprocess.Popen,
                  timeout: float, log: Path) -> float:
    """Wait until the code server on ``port`` answers a health check; seconds it took.

    Raises:
        RuntimeError: it exited or did not answer within ``timeout`` seconds (its log's end).
    """
    started = time.monotonic()
    dagster = Path(sys.executable).parent / "dagster"
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"the code server exited ({process.returncode}): "
                               f"{log.read_text()[-2000:]}")
        checked = subprocess.run([str(dagster), "api", "grpc-health-check", "--port", str(port)],
                                 env=env, capture_output=True, check=False)
        if checked.returncode == 0:
            return time.monotonic() - started
        time.sleep(1)
    raise RuntimeError(f"the code server did not serve within {timeout:.0f} s: "
                       f"{log.read_text()[-2000:]}")


def _wait_first_tick(home: Path, daemon: subprocess.Popen, timeout: float,
                     log: Path) -> float:
    """Wait until the daemon has recorded a sensor tick; seconds it took.

    Raises:
        RuntimeError: it exited or recorded none within ``timeout`` seconds (its log's end).
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited ({daemon.returncode}): "
                               f"{log.read_text()[-2000:]}")
        if _sensor_ticks(home, 0, time.time() + 1):
            return time.monotonic() - started
        time.sleep(1)
    raise RuntimeError(f"the daemon recorded no sensor tick within {timeout:.0f} s: "
                       f"{log.read_text()[-2000:]}")


def _wait_webserver(port: int, process: subprocess.Popen, timeout: float, log: Path) -> float:
    """Wait until the webserver on ``port`` answers ``/server_info``; seconds it took.

    Raises:
        RuntimeError: it exited or did not answer within ``timeout`` seconds (its log's end).
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"the webserver exited ({process.returncode}): "
                               f"{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                return time.monotonic() - started
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"the webserver did not serve within {timeout:.0f} s: "
                       f"{log.read_text()[-2000:]}")


def measure_idle(root: Path, env: dict[str, str], idle_seconds: float,
                 warmup_seconds: float, echo: Callable[[str], None]) -> dict:
    """Start what ``dagster dev`` runs on ``root``'s project: a code server, and the webserver
    (the UI) and a daemon on it; wait until the code server and the webserver serve, the
    daemon has recorded a sensor tick and ``warmup_seconds`` more, then read the CPU the three
    spend over ``idle_seconds``; all stopped after, whatever happened.

    Returns:
        ``{"seconds", "code_server_cpu_s", "daemon_cpu_s", "webserver_cpu_s", "cores",
        "code_server_cores", "daemon_cores", "webserver_cores", "serving_after_s",
        "first_tick_after_s", "sensor_ticks"}``; ``cores`` is CPU seconds per second of the
        three together; ``first_tick_after_s`` counts from the daemon's start.

    Raises:
        RuntimeError: the code server or the webserver did not start, the daemon recorded no
            sensor tick within 15 minutes, or a process exited during the window.
    """
    bin_dir = Path(sys.executable).parent
    port, web_port = _free_port(), _free_port()
    home = Path(env["DAGSTER_HOME"])
    logs = {name: home / f"{name.replace(' ', '-')}.log"
            for name in ("code server", "webserver", "daemon")}
    started: dict[str, subprocess.Popen] = {}
    try:
        started["code server"] = _start(
            [str(bin_dir / "dagster"), "code-server", "start", "--port", str(port),
             "-m", f"{PACKAGE}.definitions", "--working-directory", str(root / "src"),
             "--location-name", PACKAGE], env, root, logs["code server"])
        serving = _wait_serving(port, env, started["code server"], 600, logs["code server"])
        grpc = ["--grpc-port", str(port), "--grpc-host", "localhost"]
        started["webserver"] = _start(
            [str(bin_dir / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(web_port), *grpc],
            env, root, logs["webserver"])
        _wait_webserver(web_port, started["webserver"], 600, logs["webserver"])
        started["daemon"] = _start([str(bin_dir / "dagster-daemon"), "run", *grpc], env, root,
                                   logs["daemon"])
        # The daemon loads the location's snapshot before its first tick: idle is after that.
        first_tick = _wait_first_tick(home, started["daemon"], 900, logs["daemon"])
        echo(f"  code server serving after {serving:.1f} s, the daemon's first sensor tick "
             f"{first_tick:.1f} s after it started; warming up {warmup_seconds:.0f} s, then "
             f"{idle_seconds:.0f} s idle ...")
        time.sleep(warmup_seconds)
        since = time.time()
        before = {name: tree_cpu_seconds(p.pid) for name, p in started.items()}
        window = time.monotonic()
        time.sleep(idle_seconds)
        after = {name: tree_cpu_seconds(p.pid) for name, p in started.items()}
        elapsed = time.monotonic() - window
        for name, process in started.items():
            if process.poll() is not None:
                raise RuntimeError(f"the {name} exited during the window: "
                                   f"{logs[name].read_text()[-2000:]}")
    finally:
        for process in reversed(list(started.values())):
            _stop(process)
    cpu = {name: after[name] - before[name] for name in started}
    figures = {"seconds": round(elapsed, 1), "serving_after_s": round(serving, 1),
               "first_tick_after_s": round(first_tick, 1),
               "cores": round(sum(cpu.values()) / elapsed, 3),
               "sensor_ticks": _sensor_ticks(home, since, since + elapsed)}
    for name, seconds in cpu.items():
        key = name.replace(" ", "_")
        figures[f"{key}_cpu_s"] = round(seconds, 2)
        figures[f"{key}_cores"] = round(seconds / elapsed, 3)
    return figures


def run_policies_bench(count: int, idle_seconds: float = 60.0, warmup_seconds: float = 30.0,
                       out: Path | None = None,
                       echo: Callable[[str], None] = print) -> dict:
    """Measure ``count`` generated policies (see the module docstring) in a temporary folder,
    removed after; write the report to ``out`` (when given) and return it.

    Args:
        count: policies, at least 1.
        idle_seconds: the window the idle CPU is read over, seconds.
        warmup_seconds: how long the daemon runs before the window, seconds.

    Raises:
        RuntimeError: the measuring process failed, or the servers did (with their output).
    """
    from favorites_maintenance.bench.report import write_json

    with tempfile.TemporaryDirectory(prefix="favorites-bench-policies-") as folder:
        root = Path(folder)
        defs = write_project(root, count)
        home = root / "dagster_home"
        home.mkdir()
        (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FAVORITES_", "DAGSTER_"))}
        env.update(DAGSTER_HOME=str(home),
                   PYTHONPATH=os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")]))
        echo(f"policies: {count:,} generated policies in {root} ...")
        measured = subprocess.run([sys.executable, "-c", _MEASURE, str(defs)], env=env,
                                  cwd=root, capture_output=True, text=True, check=False)
        if measured.returncode != 0:
            raise RuntimeError(f"building {count} policies failed: {measured.stderr[-3000:]}")
        figures = json.loads(measured.stdout.strip().splitlines()[-1])
        ticks = list(figures.pop("sensor_tick_ms").values())
        figures["sensor_tick_ms"] = {
            "sensors": len(ticks),
            "p50": round(statistics.median(ticks), 2) if ticks else None,
            "max": round(max(ticks), 2) if ticks else None,
            "sum": round(sum(ticks), 1)}
        for key in ("import_s", "build_s", "resolve_s", "build_cpu_s", "resolve_cpu_s"):
            figures[key] = round(figures[key], 2)
        echo(f"  build {figures['build_s']:.2f} s (+ resolve {figures['resolve_s']:.2f} s; CPU "
             f"{figures['build_cpu_s']:.2f} + {figures['resolve_cpu_s']:.2f} s), "
             f"{figures['sensors']:,} sensors, {figures['schedules']:,} schedules, "
             f"{figures['jobs']:,} jobs; one tick of each sensor: p50 "
             f"{figures['sensor_tick_ms']['p50']} ms, max {figures['sensor_tick_ms']['max']} "
             f"ms, {figures['sensor_tick_ms']['sum']:,} ms in all")
        load_before = os.getloadavg()
        figures["idle"] = measure_idle(root, env, idle_seconds, warmup_seconds, echo)
        idle = figures["idle"]
        echo(f"  idle over {idle['seconds']:.0f} s: {idle['cores']:.3f} cores (code server "
             f"{idle['code_server_cores']:.3f}, daemon {idle['daemon_cores']:.3f}, webserver "
             f"{idle['webserver_cores']:.3f}), {idle['sensor_ticks']} sensor ticks")
    report = {"scenario": "policies", "policies": count, **figures,
              "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before,
                          "loadavg_after": os.getloadavg()}}
    if out is not None:
        write_json(report, out)
    return report
