"""``favorites-maintenance bench --scenarios launch``: one schedule tick that starts every policy
of a code location at once, under the deployment's run queue.

N generated policies (:func:`~favorites_maintenance.bench.policies.policy_yaml`, the guest rule
on a table of their own) are spread over D databases of the bench's server in turn (policy 1 on
the first, 2 on the second, ...), each database named by a variable of its own
(``database_url_env``), each table holding :data:`OLD_ROWS` prunable guest rows and
:data:`KEPT_ROWS` rows the rule keeps. Their schedules fire once a day at one minute, set
``lead_seconds`` ahead (the daemon must have seen a schedule before its tick), so one tick
launches N runs at once. (A schedule's run key only dedupes within a tick: a cron of every
minute would launch the day's run again each minute.) The instance is the checkout's
``dagster.yaml`` as deployed (its run queue, the pools at run granularity, the tag limit of one
run per database), on a storage database of the bench's server, every pool's limit written
before the daemon starts (:func:`~favorites_maintenance.local.dev.ensure_pool_limits`, as a
deployment sets them once).
A ``dagster code-server start`` and a ``dagster-daemon run`` then run the tick and the queue
until every run has ended. The scenario reports:

- ``drain_s``: from the tick (its scheduled instant) to the end of the last run, seconds;
  ``first_launch_s``: from the tick to the queue's launch of the first run;
- ``max_concurrent_per_database``: the most runs of one database in progress at one instant,
  a run in progress from its launch (the queue took its pools and started its run worker) to
  its end, per database variable, and ``max_concurrent``: of all databases together;
- ``runs``: the runs of the tick by status (every one should be ``SUCCESS``),
  ``longest_wait_s``: from the tick to the last run's launch (the longest any run waited in
  the queue), seconds;
- ``rows_left``: per database, the rows left in its tables against the rows the rule keeps
  (every prunable row deleted, none other).

This module imports no Dagster; the servers and the short helper processes do.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import sqlalchemy as sa

from favorites_maintenance.bench.policies import (
    PACKAGE,
    _free_port,
    _start,
    _stop,
    _wait_serving,
    policy_yaml,
    write_project,
)
from favorites_maintenance.bench.server import BenchServer
from favorites_maintenance.config.policy import DATABASE_TAG

#: Prunable guest rows (older than the retention) and kept rows (fresh guests and old
#: accounts) of each policy's table.
OLD_ROWS = 50
KEPT_ROWS = 20
#: Run statuses of Dagster that end a run.
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")
#: The run tag of a scheduled run: the instant its tick was due.
SCHEDULED_TAG = ".dagster/scheduled_execution_time"

#: Run in a fresh process, DAGSTER_HOME set: write every pool's limit of the project's policies
#: into the instance, as a deployment does once.
_SET_POOLS = '''\
import sys
from pathlib import Path
import dagster as dg
from favorites_maintenance.components.policy_tree import load_policies
from favorites_maintenance.local.dev import ensure_pool_limits
tree = dg.ComponentTree.for_project(Path(sys.argv[1]))
print(len(ensure_pool_limits(load_policies(tree))))
'''

_runs = sa.table("runs", sa.column("run_id"), sa.column("status"), sa.column("start_time"),
                 sa.column("end_time"))
_tags = sa.table("run_tags", sa.column("run_id"), sa.column("key"), sa.column("value"))
_events = sa.table("event_logs", sa.column("run_id"), sa.column("dagster_event_type"),
                   sa.column("timestamp"))
#: The event the run queue writes as it hands a run to its launcher, its pools taken.
_LAUNCHED_EVENT = "PIPELINE_STARTING"


def database_variable(number: int) -> str:
    """The variable of the bench's database ``number`` (1-based)."""
    return f"BENCH_LAUNCH_DB{number}_URL"


def launch_policy_yaml(number: int, databases: int, tick: dt.datetime) -> str:
    """The ``defs.yaml`` of generated policy ``number``: the guest rule on its own table, on
    database ``(number - 1) % databases + 1``, its schedule daily at ``tick``'s UTC minute."""
    database = database_variable((number - 1) % databases + 1)
    tick = tick.astimezone(dt.timezone.utc)
    return (policy_yaml(number) + f"  database_url_env: {database}\n"
            f'  cron: "{tick.minute} {tick.hour} * * *"\n')


def create_policy_table(engine: sa.Engine, table: str, now: dt.datetime) -> None:
    """``table`` (``schema.name``) with :data:`OLD_ROWS` guest rows 400 days old, and
    :data:`KEPT_ROWS` rows the guest rule keeps: half fresh guest rows, half old account
    rows."""
    schema, name = table.split(".")
    metadata = sa.MetaData()
    target = sa.Table(name, metadata,
                      sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
                      sa.Column("user_id", sa.BigInteger),
                      sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
                      schema=schema)
    old = now - dt.timedelta(days=400)
    fresh = now - dt.timedelta(days=10)
    rows = ([{"user_id": None, "updated_at": old}] * OLD_ROWS
            + [{"user_id": None, "updated_at": fresh}] * (KEPT_ROWS // 2)
            + [{"user_id": 7, "updated_at": old}] * (KEPT_ROWS - KEPT_ROWS // 2))
    with engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
        metadata.create_all(conn)
        conn.execute(target.insert(), rows)


def max_overlap(intervals: Sequence[tuple[float, float]]) -> int:
    """The most of ``intervals`` (start, end; seconds) open at one instant; one ending when
    another starts does not overlap it."""
    events = sorted([(end, -1) for _, end in intervals] + [(start, 1) for start, _ in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _rows_in(url, numbers: Iterable[int]) -> int:
    """Rows left in the tables of generated policies ``numbers`` on the database at ``url``."""
    from favorites_maintenance.bench.server import engine_on

    with engine_on(url) as engine, engine.connect() as conn:
        return sum(conn.execute(sa.select(sa.func.count()).select_from(
            sa.table(f"policy_{n:05d}", schema="bench"))).scalar() for n in numbers)


def _tag(key: str):
    return sa.select(_tags.c.value).where(_tags.c.run_id == _runs.c.run_id,
                                          _tags.c.key == key).scalar_subquery()


def _tick_runs(storage: sa.Engine) -> list[dict]:
    """Every run of the storage: its status; when the queue launched it, when it started and
    ended (UNIX seconds, ``None`` until then); its database tag and the instant its
    schedule's tick was due (ISO 8601)."""
    launched = sa.select(sa.func.min(_events.c.timestamp)).where(
        _events.c.run_id == _runs.c.run_id,
        _events.c.dagster_event_type == _LAUNCHED_EVENT).scalar_subquery()
    with storage.connect() as conn:
        rows = conn.execute(sa.select(
            _runs.c.run_id, _runs.c.status, launched.label("launched"), _runs.c.start_time,
            _runs.c.end_time, _tag(DATABASE_TAG).label("database"),
            _tag(SCHEDULED_TAG).label("scheduled"))).mappings().all()
    # Dagster writes an event's instant as a naive UTC datetime.
    return [{**r, "launched": r["launched"].replace(tzinfo=dt.timezone.utc).timestamp()
             if r["launched"] is not None else None} for r in rows]


def _wait_drained(storage: sa.Engine, count: int, processes: list[subprocess.Popen],
                  tick: dt.datetime, timeout: float, logs: list[Path]) -> list[dict]:
    """Wait until ``count`` runs exist and every one has ended; the runs.

    Raises:
        RuntimeError: a server exited, no run came within two minutes of ``tick`` (the daemon
            saw the schedules after it), or the runs had not ended within ``timeout`` seconds.
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        late = dt.datetime.now(dt.timezone.utc) - tick > dt.timedelta(minutes=2)
        for process, log in zip(processes, logs):
            if process.poll() is not None:
                raise RuntimeError(f"{log.stem} exited ({process.returncode}): "
                                   f"{log.read_text()[-2000:]}")
        try:
            runs = _tick_runs(storage)
        except sa.exc.ProgrammingError:  # the daemon has not created Dagster's tables yet
            runs = []
        if len(runs) >= count and all(r["status"] in FINISHED for r in runs):
            return runs
        if late and not runs:
            raise RuntimeError(f"no run came of the tick at {tick.isoformat()}: the daemon "
                               "saw the schedules after it; give a longer --launch-lead-seconds")
        time.sleep(2)
    raise RuntimeError(f"the runs of the tick had not ended after {timeout:.0f} s")


def run_launch_bench(server, count: int, databases: int, instance_yaml: Path,
                     out: Path | None = None, echo: Callable[[str], None] = print,
                     lead_seconds: float = 240.0, timeout: float = 3600.0) -> dict:
    """Measure one tick launching ``count`` generated policies on ``databases`` databases (see
    the module docstring), on the bench's server; write the report to ``out`` (when given)
    and return it. The databases and the temporary project are removed after.

    Args:
        server: the bench's started :class:`~favorites_maintenance.local.embedded.EmbeddedPostgres`.
        count: policies, at least 1.
        databases: databases the policies are spread over, at least 1.
        instance_yaml: the deployment's ``dagster.yaml`` (the checkout's).
        lead_seconds: how far ahead the tick is set, seconds: the code server must serve and
            the daemon see the schedules before it (a schedule fires only after the daemon
            first saw it).
        timeout: how long the runs may take to drain, seconds.

    Raises:
        RuntimeError: setting the pools failed, a server failed or exited, or the runs did not
            drain within ``timeout`` (with the servers' output).
    """
    from favorites_maintenance.bench.report import write_json

    srv = BenchServer(server)
    names = [f"bench_launch_{n}" for n in range(1, databases + 1)]
    storage_db = "bench_launch_dagster"
    root = Path(tempfile.mkdtemp(prefix="favorites-bench-launch-"))
    now = dt.datetime.now(dt.timezone.utc)
    # The first whole minute at least lead_seconds ahead.
    tick = (now + dt.timedelta(seconds=lead_seconds + 59)).replace(second=0, microsecond=0)
    processes: list[subprocess.Popen] = []
    try:
        for db in [*names, storage_db]:
            srv.drop(db)
            srv.execute(f'CREATE DATABASE "{db}"')
        defs = write_project(root, 0)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FAVORITES_", "DAGSTER_", "BENCH_LAUNCH_"))}
        home = root / "dagster_home"
        home.mkdir()
        shutil.copyfile(instance_yaml, home / "dagster.yaml")
        storage_url = srv.url(storage_db).set(drivername="postgresql+psycopg2")
        env.update(DAGSTER_HOME=str(home),
                   DAGSTER_POSTGRES_URL=storage_url.render_as_string(hide_password=False),
                   PYTHONPATH=os.pathsep.join([str(root / "src"), env.get("PYTHONPATH", "")]))
        for number, db in enumerate(names, start=1):
            env[database_variable(number)] = srv.url(db).render_as_string(hide_password=False)
        echo(f"launch: {count:,} policies on {databases} databases in {root} ...")
        _write_policies(srv, names, defs, count, tick, now)
        pools = subprocess.run([sys.executable, "-c", _SET_POOLS, str(root)], env=env, cwd=root,
                               capture_output=True, text=True, check=False)
        if pools.returncode != 0:
            raise RuntimeError(f"setting the pools' limits failed: {pools.stderr[-3000:]}")
        load_before = os.getloadavg()
        bin_dir = Path(sys.executable).parent
        port = _free_port()
        server_log, daemon_log = home / "code-server.log", home / "daemon.log"
        processes.append(_start(
            [str(bin_dir / "dagster"), "code-server", "start", "--port", str(port),
             "-m", f"{PACKAGE}.definitions", "--working-directory", str(root / "src"),
             "--location-name", PACKAGE], env, root, server_log))
        serving = _wait_serving(port, env, processes[0], 600, server_log)
        processes.append(_start([str(bin_dir / "dagster-daemon"), "run", "--grpc-port",
                                 str(port), "--grpc-host", "localhost"], env, root, daemon_log))
        echo(f"  code server serving after {serving:.1f} s; the daemon started, waiting for "
             f"the tick at {tick:%H:%M} UTC and the queue to drain ...")
        storage = sa.create_engine(srv.url(storage_db))  # Dagster's tables, read as they are
        try:
            runs = _wait_drained(storage, count, processes, tick, timeout,
                                 [server_log, daemon_log])
        finally:
            storage.dispose()
    finally:
        for process in reversed(processes):
            _stop(process)
        counts = {}
        for number, db in enumerate(names, start=1):
            try:
                counts[database_variable(number)] = _rows_in(
                    srv.url(db), range(number, count + 1, databases))
            except sa.exc.SQLAlchemyError:  # a database not made
                counts[database_variable(number)] = None
        for db in [*names, storage_db]:
            srv.drop(db)
        srv.dispose()
        shutil.rmtree(root, ignore_errors=True)
    report = launch_report(runs, count, databases, counts)
    report["serving_after_s"] = round(serving, 1)
    report["machine"] = {"cpus": os.cpu_count(), "loadavg_before": load_before,
                         "loadavg_after": os.getloadavg()}
    echo(_summary(report))
    if out is not None:
        write_json(report, out)
    return report


def _write_policies(srv: BenchServer, names: list[str], defs: Path, count: int,
                    tick: dt.datetime, now: dt.datetime) -> None:
    """Write ``count`` policy files under ``defs``, all firing at ``tick``, and create each
    policy's table on its database (database ``n`` of ``names`` takes policies ``n``,
    ``n + len(names)``, ...), its rows laid out around ``now``."""
    engines = [sa.create_engine(srv.url(db)) for db in names]
    try:
        for number in range(1, count + 1):
            folder = defs / f"policy_{number:05d}"
            folder.mkdir()
            (folder / "defs.yaml").write_text(launch_policy_yaml(number, len(names), tick))
            create_policy_table(engines[(number - 1) % len(names)],
                                f"bench.policy_{number:05d}", now)
    finally:
        for engine in engines:
            engine.dispose()


def _summary(report: dict) -> str:
    """The console line of a launch report (:func:`launch_report`)."""
    per_database = report["max_concurrent_per_database"]
    return (f"  {report['runs']} runs; the tick drained in {report['drain_s']:.1f} s (the "
            f"first run launched {report['first_launch_s']:.1f} s after it, the last "
            f"{report['longest_wait_s']:.1f} s after it); most runs at once per database "
            f"{max(per_database.values(), default=0)} ({per_database}), of all "
            f"{report['max_concurrent']}; rows left {report['rows_left']} "
            f"(kept by the rule: {report['rows_kept']})")


def launch_report(runs: list[dict], count: int, databases: int,
                  rows_left: dict[str, int | None]) -> dict:
    """The scenario's figures from the tick's ``runs`` (:func:`_tick_runs`) and the rows left
    per database variable (see the module docstring)."""
    statuses: dict[str, int] = {}
    for run in runs:
        statuses[run["status"]] = statuses.get(run["status"], 0) + 1
    ran = [r for r in runs if r["start_time"] is not None and r["end_time"] is not None]
    per_database: dict[str, list[tuple[float, float]]] = {}
    for run in ran:
        # In progress from its launch (its pools taken, its run worker starting) to its end.
        per_database.setdefault(run["database"] or "(no tag)", []).append(
            (run.get("launched") or run["start_time"], run["end_time"]))
    due = [dt.datetime.fromisoformat(r["scheduled"]).timestamp() for r in runs
           if r["scheduled"]]
    tick = min(due, default=0.0)
    kept_per_database = {
        database_variable(n): KEPT_ROWS * len(range(n, count + 1, databases))
        for n in range(1, databases + 1)}
    return {
        "scenario": "launch", "policies": count, "databases": databases,
        "runs": statuses,
        "drain_s": round(max((r["end_time"] for r in ran), default=tick) - tick, 1),
        "first_launch_s": round(min((r.get("launched") or r["start_time"] for r in ran),
                                    default=tick) - tick, 1),
        # The last run to leave the queue waited longest: the tick queued them together.
        "longest_wait_s": round(max((r.get("launched") or r["start_time"] for r in ran),
                                    default=tick) - tick, 1),
        "max_concurrent_per_database": {db: max_overlap(spans)
                                        for db, spans in sorted(per_database.items())},
        "max_concurrent": max_overlap([s for spans in per_database.values() for s in spans]),
        "rows_left": rows_left, "rows_kept": kept_per_database,
    }
