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
- ``A2``, ``A4``: 2 and 4 processes running ``A`` at once on the same table;
- ``J``: ``guest_favorites_cleanup_job`` run through Dagster as users run it (the default
  multiprocess executor, a PostgreSQL-backed instance; see
  :mod:`favorites_maintenance.bench.job`),
  rated by its purge's ``durationMs`` and, apart, by the run's start to end.

Each strategy's batch times are also reported per decile of the run (the p50 of the first 10 %
of its batches, ..., of the last 10 %), which shows whether a batch grows slower as the run
goes on.

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

This module imports no Dagster (``J`` imports it in its own process).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import multiprocessing as mp
import os
import random
import resource
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

from favorites_maintenance.retention.rule import compute_cutoff, delete_prunable
from favorites_maintenance.settings import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BATCH_SIZE_MAX,
    DEFAULT_MAX_RUN_DURATION,
    DEFAULT_RETENTION_DAYS,
    DEFAULT_TARGET_BATCH_DURATION,
)

UTC = dt.timezone.utc

#: The data set's "now": fixed, so the same seed gives the same rows whenever the bench runs.
BENCH_NOW = dt.datetime(2026, 1, 1, tzinfo=UTC)
STRATEGIES = ("A", "B", "C", "D", "A2", "A4", "J")
#: Not run by default, to measure what a choice of A's gives: A with ``synchronous_commit`` on;
#: A at a fixed batch size (no target time per batch); A locking every batch's rows before
#: deleting them (no optimistic batches).
EXTRA_STRATEGIES = ("A_durable", "A_fixed", "A_lock_first")
#: Workers of each strategy (A2 and A4 run A in that many processes at once).
WORKERS = {"A": 1, "B": 1, "C": 1, "D": 1, "A2": 2, "A4": 4, "A_durable": 1, "A_fixed": 1,
           "A_lock_first": 1,
           "J": 1}
#: Share of the rows, the oldest, that are all account rows; guests make 40% overall.
ACCOUNT_HEAD_SHARE = 0.25
GUEST_SHARE_OVERALL = 0.4
TOUCHED_SHARE = 0.1
DEFAULT_ROWS = 2_000_000

_GUARD = "user_id IS NULL AND updated_at < %(cutoff)s"
C_DELETE = ("DELETE FROM favorites.favorites WHERE ctid IN (SELECT favorites.ctid FROM "
            f"favorites.favorites WHERE {_GUARD} LIMIT %(limit)s)")
D_SELECT = (f"SELECT id FROM favorites.favorites WHERE {_GUARD} ORDER BY updated_at "
            "LIMIT %(limit)s FOR UPDATE SKIP LOCKED")
D_DELETE = f"DELETE FROM favorites.favorites WHERE id = ANY(%(ids)s) AND {_GUARD}"


@dataclass
class BenchConfig:
    """What to measure.

    Attributes:
        rows: size of the data set (the 10% run uses ``rows // 10``).
        strategies: which strategies to run, in order (``B`` is needed for the ratios).
        seed: ``setseed()`` value of the data set.
        idle_seconds: length of the idle window of the user workload before each purge.
        repeat: full-size runs of each strategy, in rounds; the run of median throughput is
            reported (all throughputs are kept in ``rows_per_second_runs``).
        user_ops_per_second: pace of the user workload.
        out: where the JSON goes (``None``: nowhere).
        db_prefix: prefix of the databases the bench creates (and drops) on the server.
        echo: progress lines.
    """

    rows: int = DEFAULT_ROWS
    strategies: Sequence[str] = STRATEGIES
    seed: float = 0.42
    idle_seconds: float = 5.0
    repeat: int = 1
    user_ops_per_second: float = 200.0
    out: Path | None = Path("bench-results/purge.json")
    db_prefix: str = "bench"
    retention_days: int = DEFAULT_RETENTION_DAYS
    batch_size: int = DEFAULT_BATCH_SIZE
    max_run_duration: dt.timedelta = DEFAULT_MAX_RUN_DURATION
    echo: Callable[[str], None] = print
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# statistics


def deciles(durations: Sequence[float]) -> list[float] | None:
    """The p50 batch time of each tenth of a run, in ms, in run order (``None`` below 10
    batches)."""
    if len(durations) < 10:
        return None
    n = len(durations)
    return [_ms(percentile(durations[i * n // 10:(i + 1) * n // 10], 50)) for i in range(10)]


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in [0, 100]); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


# --------------------------------------------------------------------------------------------
# the purging child processes


def _engine(url: str, **kwargs) -> sa.Engine:
    from favorites_maintenance.retention.database import create_engine

    return create_engine(url, **kwargs)


_BACKEND_WAL = sa.text("SELECT pg_backend_pid(), wal_bytes::bigint "
                       "FROM pg_stat_get_backend_wal(pg_backend_pid())")


def _backend_wal(conn: sa.Connection) -> tuple[int, int | None]:
    """(pid, WAL bytes this backend generated so far), flushing its pending statistics first."""
    try:
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
        conn.commit()  # the flush happens when the backend goes idle
        conn.execute(sa.text("SELECT 1"))
        conn.commit()
        pid, wal = conn.execute(_BACKEND_WAL).one()
        conn.commit()
        return pid, wal
    except sa.exc.DBAPIError:  # PostgreSQL before 18
        conn.rollback()
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        conn.commit()
        return pid, None


def _purge_child(strategy: str, url: str, cutoff: dt.datetime, batch_size: int,
                 max_run_s: float, start, pipe) -> None:
    """Run one purge worker; send back what it did. Runs in a spawned process."""
    try:
        result = _run_worker(strategy, url, cutoff, batch_size, max_run_s, start, pipe)
    except BaseException as exc:  # report, never hang the parent
        result = {"error": f"{type(exc).__name__}: {exc}"}
    pipe.send(result)
    pipe.close()


def _run_worker(strategy, url, cutoff, batch_size, max_run_s, start, pipe) -> dict:
    from favorites_maintenance.retention.purge import purge

    engine = _engine(url)
    durations: list[float] = []
    rss_before = _rss_mb()
    with engine.connect() as conn:  # the connection the purge then takes from the pool
        pid0, wal0 = _backend_wal(conn)
    pipe.send("ready")
    start.wait()
    t0 = time.monotonic()
    extra: dict[str, Any] = {}
    if strategy == "J":
        from favorites_maintenance.bench.job import run_job

        job = run_job(sa.make_url(url), cutoff, batch_size, max_run_s)
        deleted, stop_reason = job["deleted"], job["stop_reason"]
        extra = {"purge_seconds": job["purge_seconds"], "run_seconds": job["run_seconds"],
                 "job_batches": job["batches"], "job_batch_max_ms": job["batch_max_ms"]}
    elif strategy in ("A", "A_durable", "A_fixed", "A_lock_first"):
        from favorites_maintenance.retention.health import HealthLimits

        # As the job calls it at the default settings; A_fixed as it does with
        # FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION=PT0S (every batch 1000 rows).
        adaptive = {"health": HealthLimits()} if strategy == "A_fixed" else {
            "batch_size_max": DEFAULT_BATCH_SIZE_MAX,
            "target_batch_duration": DEFAULT_TARGET_BATCH_DURATION, "health": HealthLimits()}
        report = purge(engine, cutoff, batch_size=batch_size,
                       max_run_duration=dt.timedelta(seconds=max_run_s),
                       should_stop=lambda: False,
                       on_batch=lambda b: durations.append(b.duration_s),
                       **({"synchronous_commit": True} if strategy == "A_durable" else {}),
                       **({"optimistic": False} if strategy == "A_lock_first" else {}),
                       **adaptive)
        deleted = report.deleted_total
        stop_reason = report.stop_reason.value
        extra = {"batch_size_max": report.batch_size_max, "paused_ms": report.paused_ms}
    elif strategy == "B":
        with engine.begin() as conn:
            deleted = conn.execute(delete_prunable(cutoff)).rowcount
        durations.append(time.monotonic() - t0)
        stop_reason = "done"
    elif strategy == "C":
        deleted = 0
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            raw = conn.connection.driver_connection
            while True:
                t = time.monotonic()
                n = raw.execute(C_DELETE, {"cutoff": cutoff, "limit": batch_size}).rowcount
                durations.append(time.monotonic() - t)
                deleted += n
                if n == 0:
                    break
        stop_reason = "deleted nothing"
    elif strategy == "D":
        deleted = 0
        with engine.connect() as conn:
            raw = conn.connection.driver_connection
            raw.autocommit = True  # transaction() below then issues BEGIN ... COMMIT
            while True:
                t = time.monotonic()
                with raw.transaction():
                    ids = [r[0] for r in raw.execute(D_SELECT,
                                                     {"cutoff": cutoff, "limit": batch_size})]
                    n = raw.execute(D_DELETE, {"ids": ids, "cutoff": cutoff}).rowcount if ids \
                        else 0
                durations.append(time.monotonic() - t)
                deleted += n
                if len(ids) < batch_size:
                    break
        stop_reason = "batch not full"
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    t1 = time.monotonic()
    with engine.connect() as conn:
        pid1, wal1 = _backend_wal(conn)
    engine.dispose()
    return {
        "deleted": deleted, "durations": durations, "t0": t0, "t1": t1,
        "stop_reason": stop_reason, "rss_mb": _rss_mb(), "rss_before_mb": rss_before,
        # J's purge runs in a step process of its own: only the server's total tells its WAL.
        "wal_bytes": (wal1 - wal0) if (wal0 is not None and wal1 is not None and pid0 == pid1
                                       and strategy != "J") else None,
        **extra,
    }


# --------------------------------------------------------------------------------------------
# the user workload


def _user_workload(url: str, account_ids: list[int], guest_ids: list[int], ops_per_s: float,
                   seed: int, stop, pipe) -> None:
    """Paced single-row inserts and updates, one statement per transaction, until ``stop``.
    Sends back ``[(monotonic start, latency s), ...]``. Runs in a spawned process."""
    import psycopg

    samples: list[tuple[float, float]] = []
    try:
        params = sa.engine.make_url(url)
        conn = psycopg.connect(dbname=params.database, user=params.username,
                               host=params.query["host"], autocommit=True,
                               application_name="bench-user-workload")
        pipe.send("ready")
        rnd = random.Random(seed)
        ops = [
            ("INSERT INTO favorites.favorites (user_id, item_id) VALUES (%s, %s)",
             lambda: (rnd.randint(1, 50_000), rnd.randint(1, 100_000))),
            ("INSERT INTO favorites.favorites (anonymous_id, item_id) VALUES (%s, %s)",
             lambda: (uuid.UUID(int=rnd.getrandbits(128)), rnd.randint(1, 100_000))),
            ("UPDATE favorites.favorites SET updated_at = now(), item_id = item_id + 1 "
             "WHERE id = %s", lambda: (rnd.choice(account_ids),)),
            ("UPDATE favorites.favorites SET updated_at = now(), item_id = item_id + 1 "
             "WHERE id = %s", lambda: (rnd.choice(guest_ids),)),
        ]
        interval = 1.0 / ops_per_s
        next_t = time.monotonic()
        i = 0
        while not stop.is_set():
            sql, args = ops[i % len(ops)]
            i += 1
            t = time.monotonic()
            conn.execute(sql, args())
            samples.append((t, time.monotonic() - t))
            next_t += interval
            pause = next_t - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                next_t = time.monotonic()  # behind: go on at once, do not burst to catch up
        conn.close()
        pipe.send({"samples": samples})
    except BaseException as exc:
        pipe.send({"error": f"{type(exc).__name__}: {exc}", "samples": samples})
    pipe.close()


# --------------------------------------------------------------------------------------------
# the server side


class _Server:
    """Admin helpers on the embedded server (``postgres`` database, autocommit)."""

    def __init__(self, server):
        self.server = server
        self.admin = sa.create_engine(server.url("postgres"), isolation_level="AUTOCOMMIT")

    def url(self, db: str) -> URL:
        return self.server.url(db)

    def scalar(self, sql: str, **params):
        with self.admin.connect() as conn:
            return conn.execute(sa.text(sql), params).scalar()

    def execute(self, sql: str, **params) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(sql), params)

    def drop(self, db: str) -> None:
        self.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    def restore(self, template: str, db: str) -> None:
        self.drop(db)
        self.execute(f'CREATE DATABASE "{db}" TEMPLATE "{template}" STRATEGY FILE_COPY')
        self.execute("CHECKPOINT")

    def lsn(self) -> str:
        return self.scalar("SELECT pg_current_wal_lsn()::text")

    def wal_diff(self, a: str, b: str) -> int:
        return int(self.scalar("SELECT pg_wal_lsn_diff(CAST(:b AS pg_lsn), CAST(:a AS pg_lsn))",
                               a=a, b=b))

    def has_pg_stat_statements(self) -> bool:
        loaded = self.scalar("SELECT current_setting('shared_preload_libraries')") or ""
        if "pg_stat_statements" not in loaded:
            return False
        self.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return True

    def top_statements(self, db: str, limit: int = 4) -> list[dict]:
        with self.admin.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query, calls, "
                "round(total_exec_time::numeric, 1) AS total_ms, "
                "round(mean_exec_time::numeric, 3) AS mean_ms, rows, "
                "shared_blks_hit, shared_blks_read, shared_blks_dirtied, wal_bytes::bigint "
                "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                "WHERE d.datname = :db AND query NOT LIKE 'INSERT INTO favorites.favorites (%' "
                "AND query NOT LIKE 'UPDATE favorites.favorites SET updated_at = now()%' "
                "ORDER BY total_exec_time DESC LIMIT :limit"), {"db": db, "limit": limit})
            return [{k: (float(v) if hasattr(v, "as_tuple") else v)
                     for k, v in r._mapping.items()} for r in rows]

    def dispose(self) -> None:
        self.admin.dispose()


def seed_template(srv: _Server, db: str, rows: int, seed: float) -> dict:
    """Create database ``db`` holding the seeded dev table, vacuumed, frozen and analysed."""
    from favorites_maintenance.retention.schema import create_dev_schema
    from favorites_maintenance.seed import seed_favorites

    srv.drop(db)
    srv.execute(f'CREATE DATABASE "{db}"')
    engine = _engine(srv.url(db))
    try:
        create_dev_schema(engine)
        summary = seed_favorites(
            engine, rows, now=BENCH_NOW, seed=seed,
            guest_share=GUEST_SHARE_OVERALL / (1 - ACCOUNT_HEAD_SHARE),
            touched_share=TOUCHED_SHARE, account_head_share=ACCOUNT_HEAD_SHARE)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(
                "ALTER TABLE favorites.favorites SET (autovacuum_enabled = false)"))
            conn.execute(sa.text("VACUUM (FREEZE, ANALYZE) favorites.favorites"))
            size = conn.execute(sa.text(
                "SELECT pg_total_relation_size('favorites.favorites')")).scalar_one()
    finally:
        engine.dispose()
    return {"rows": summary.rows, "guest_rows": summary.guest_rows,
            "account_rows": summary.account_rows, "bytes": size}


def _counts(url: URL, cutoff: dt.datetime, max_seed_id: int | None = None) -> dict:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(sa.text(
                "SELECT count(*) FILTER (WHERE user_id IS NULL AND updated_at < :cutoff), "
                "count(*) FILTER (WHERE user_id IS NOT NULL AND id <= :max_id), max(id) "
                "FROM favorites.favorites"),
                {"cutoff": cutoff, "max_id": max_seed_id or 2**62}).one()
    finally:
        engine.dispose()
    return {"prunable": row[0], "accounts": row[1], "max_id": row[2]}


def _sample_ids(url: URL, cutoff: dt.datetime, n: int = 2000) -> tuple[list[int], list[int]]:
    """Ids of account rows (any age) and of fresh guest rows for the user workload."""
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            accounts = list(conn.execute(sa.text(
                "SELECT id FROM favorites.favorites WHERE user_id IS NOT NULL "
                "ORDER BY hashint8(id) LIMIT :n"), {"n": n}).scalars())
            guests = list(conn.execute(sa.text(
                "SELECT id FROM favorites.favorites WHERE user_id IS NULL "
                "AND updated_at > :fresh ORDER BY hashint8(id) LIMIT :n"),
                {"n": n, "fresh": cutoff + dt.timedelta(days=2)}).scalars())
    finally:
        engine.dispose()
    return accounts, guests


# --------------------------------------------------------------------------------------------
# one strategy


def _run_strategy(ctx, srv: _Server, cfg: BenchConfig, strategy: str, template: str, db: str,
                  cutoff: dt.datetime, workload: bool) -> dict:
    srv.restore(template, db)
    url = srv.url(db)
    url_s = url.render_as_string(hide_password=False)
    before = _counts(url, cutoff)
    user = None
    stop = ctx.Event()
    procs: list = []
    try:
        if workload:
            accounts, guests = _sample_ids(url, cutoff)
            user_recv, user_send = ctx.Pipe(duplex=False)
            user = ctx.Process(target=_user_workload, name="bench-user-workload",
                               args=(url_s, accounts, guests or accounts, cfg.user_ops_per_second,
                                     17, stop, user_send))
            user.start()
            user_send.close()

        workers = WORKERS[strategy]
        kind = "A" if strategy in ("A2", "A4") else strategy
        start = ctx.Event()
        pipes = []
        for _ in range(workers):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_purge_child, name=f"bench-purge-{strategy}",
                            args=(kind, url_s, cutoff, cfg.batch_size,
                                  cfg.max_run_duration.total_seconds(), start, send))
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

    after = _counts(url, cutoff, before["max_id"])
    t0 = min(r["t0"] for r in results)
    t1 = max(r["t1"] for r in results)
    deleted = sum(r["deleted"] for r in results)
    durations = [d for r in results for d in r["durations"]]
    seconds = max(t1 - t0, 1e-9)
    idle = [lat for t, lat in samples if idle_from <= t < t0]
    during = [lat for t, lat in samples if t0 <= t <= t1]
    backend_wal = [r["wal_bytes"] for r in results]
    job = results[0] if "purge_seconds" in results[0] else None
    out = {
        "workers": workers,
        "rows_deleted": deleted,
        "prunable_rows_before": before["prunable"],
        "prunable_rows_left": after["prunable"],
        "account_rows_deleted": before["accounts"] - after["accounts"],
        "correct": (deleted == before["prunable"] and after["prunable"] == 0
                    and after["accounts"] == before["accounts"]),
        "duration_s": round(seconds, 3),
        "rows_per_second": round(deleted / seconds, 1),
        "batches": len(durations),
        "batch_p50_ms": _ms(percentile(durations, 50)),
        "batch_p99_ms": _ms(percentile(durations, 99)),
        "batch_max_ms": _ms(max(durations) if durations else None),
        "wal_bytes": (sum(backend_wal) if None not in backend_wal
                      else srv.wal_diff(lsn0, lsn1)),
        "wal_bytes_cluster": srv.wal_diff(lsn0, lsn1),
        "peak_rss_mb": max(r["rss_mb"] for r in results),
        "rss_after_start_mb": max(r["rss_before_mb"] for r in results),
        "stop_reasons": sorted({r["stop_reason"] for r in results}),
        "deciles": deciles(durations),
        # The largest batch of A (adaptive), and how long it paused on database health.
        "batch_size_max": max((r.get("batch_size_max") or 0 for r in results), default=0)
        or None,
        "paused_ms": sum(r.get("paused_ms") or 0 for r in results),
    }
    if job is not None:
        # The job's purge runs in a step process: rate it by its own durationMs, and the run
        # from start to end apart.
        out.update({
            "rows_per_second": round(deleted / max(job["purge_seconds"], 1e-9), 1),
            "purge_duration_s": round(job["purge_seconds"], 3),
            "run_duration_s": round(job["run_seconds"], 3),
            "run_rows_per_second": round(deleted / max(job["run_seconds"], 1e-9), 1),
            "batches": job["job_batches"],
            "batch_max_ms": job["job_batch_max_ms"],
        })
    if workload:
        out.update({
            "user_ops_idle": len(idle), "user_ops": len(during),
            "user_p50_ms_idle": _ms(percentile(idle, 50)),
            "user_p99_ms_idle": _ms(percentile(idle, 99)),
            "user_p50_ms": _ms(percentile(during, 50)),
            "user_p99_ms": _ms(percentile(during, 99)),
            "user_max_ms": _ms(max(during) if during else None),
            "_idle_samples": idle,
        })
    if statements:
        out["statements"] = srv.top_statements(db)
    return out


def _expect_ready(pipe, who: str) -> None:
    got = pipe.recv()
    if got != "ready":
        raise RuntimeError(f"{who} failed to start: {got.get('error', got)}")


# --------------------------------------------------------------------------------------------
# the whole benchmark


def start_server(pgdata: Path):
    """Start the bench's own embedded server on ``pgdata`` with ``pg_stat_statements`` loaded
    (a restart on first use), and return it."""
    from favorites_maintenance.embedded import EmbeddedPostgres

    pgdata = Path(pgdata).resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # The server runs as an unprivileged user when we are root: it must reach pgdata. Only add
    # read and search bits: the parent may be a shared folder such as /tmp (sticky, writable).
    os.chmod(pgdata.parent, pgdata.parent.stat().st_mode & 0o7777 | 0o055)
    server = EmbeddedPostgres(pgdata).start()
    srv = _Server(server)
    try:
        loaded = srv.scalar("SELECT current_setting('shared_preload_libraries')") or ""
        if "pg_stat_statements" not in loaded:
            srv.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            srv.dispose()
            server.stop()
            server = EmbeddedPostgres(pgdata).start()
    finally:
        srv.dispose()
    return server


def run_bench(server, cfg: BenchConfig) -> dict:
    """Seed, run every strategy at 100% (with the user workload) and at 10% of ``cfg.rows``
    (memory only), write ``cfg.out`` and return the results.

    Args:
        server: a started :class:`~favorites_maintenance.embedded.EmbeddedPostgres`.
        cfg: what to measure.
    """
    ctx = mp.get_context("spawn")
    srv = _Server(server)
    echo = cfg.echo
    cutoff = compute_cutoff(BENCH_NOW, cfg.retention_days)
    seed_db, seed10_db, run_db = (f"{cfg.db_prefix}_seed", f"{cfg.db_prefix}_seed10",
                                  f"{cfg.db_prefix}_run")
    small = max(1000, cfg.rows // 10)
    try:
        t = time.monotonic()
        echo(f"seeding {cfg.rows:,} rows (and {small:,} for the 10% run) ...")
        full = seed_template(srv, seed_db, cfg.rows, cfg.seed)
        tenth = seed_template(srv, seed10_db, small, cfg.seed)
        prunable = _counts(srv.url(seed_db), cutoff)["prunable"]
        echo(f"  {full['rows']:,} rows ({full['guest_rows']:,} guest, "
             f"{full['account_rows']:,} account, {full['bytes'] / 2**20:,.0f} MB with indexes), "
             f"{prunable:,} prunable at cutoff {cutoff.isoformat()}; "
             f"{time.monotonic() - t:.1f} s")
        results: dict[str, dict] = {}
        load_before = os.getloadavg()
        small_runs = {}
        for strategy in cfg.strategies:
            echo(f"strategy {strategy}: {small:,} rows (memory at 10%) ...")
            small_runs[strategy] = _run_strategy(ctx, srv, cfg, strategy, seed10_db, run_db,
                                                 cutoff, workload=False)
        runs: dict[str, list[dict]] = {strategy: [] for strategy in cfg.strategies}
        for round_no in range(1, cfg.repeat + 1):
            # Rounds go through every strategy in turn, so a change in the machine's load
            # falls on all of them rather than on one.
            for strategy in cfg.strategies:
                res = _run_strategy(ctx, srv, cfg, strategy, seed_db, run_db, cutoff,
                                    workload=True)
                runs[strategy].append(res)
                echo(f"strategy {strategy} (round {round_no}/{cfg.repeat}): "
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
        results: dict[str, dict] = {}
        for strategy, done in runs.items():
            # The run of median throughput stands for the strategy, with all its figures.
            ordered = sorted(done, key=lambda r: r["rows_per_second"])
            res = dict(ordered[(len(ordered) - 1) // 2])
            res["rows_per_second_runs"] = [r["rows_per_second"] for r in done]
            res["correct"] = all(r["correct"] for r in done)
            res["account_rows_deleted"] = max(r["account_rows_deleted"] for r in done)
            res["_idle_samples"] = [x for r in done for x in r["_idle_samples"]]
            res["peak_rss_mb"] = max(r["peak_rss_mb"] for r in done)
            res["peak_rss_mb_10pct"] = small_runs[strategy]["peak_rss_mb"]
            res["correct_10pct"] = small_runs[strategy]["correct"]
            results[strategy] = res
        load_after = os.getloadavg()
    finally:
        for db in (run_db, seed_db, seed10_db):
            srv.drop(db)
        version = srv.scalar("SHOW server_version")
        srv.dispose()

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
    report = {
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
        "user_p50_ms_idle": _ms(percentile(idle_all, 50)),
        "user_p99_ms_idle": _ms(percentile(idle_all, 99)),
        "peak_rss_mb": {
            "10%": results["A"]["peak_rss_mb_10pct"] if "A" in results else None,
            "100%": results["A"]["peak_rss_mb"] if "A" in results else None,
        },
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before,
                    "loadavg_after": load_after, "postgres": version,
                    "finished_at": dt.datetime.now(UTC).isoformat(timespec="seconds")},
        **cfg.extra,
        "overhead_ms_per_batch": overhead,
        "strategies": results,
    }
    if cfg.out is not None:
        cfg.out.parent.mkdir(parents=True, exist_ok=True)
        cfg.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


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
    if "J" in report["strategies"]:
        j = report["strategies"]["J"]
        lines.append(f"J (the job through Dagster): purge {j['rows_per_second']:,.0f} rows/s "
                     f"({j['purge_duration_s']:.2f} s), run start to end "
                     f"{j['run_rows_per_second']:,.0f} rows/s ({j['run_duration_s']:.2f} s); "
                     f"per-batch overhead over A: {report.get('overhead_ms_per_batch')} ms"
                     + (" (J's batches ran faster than A's)"
                        if (report.get("overhead_ms_per_batch") or 0) < 0 else "")
                     + "; its WAL is the whole server's, Dagster's storage included")
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
    return "\n".join(lines)
