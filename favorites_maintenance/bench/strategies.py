"""The bench's strategies, each deleting every prunable row its own way, and the purging child
process that runs one worker of a strategy and reports what it did (rows, batch times, WAL,
peak RSS)."""

from __future__ import annotations

import datetime as dt
import resource
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from favorites_maintenance.bench.server import engine_on
from favorites_maintenance.config.policy_settings import (
    DEFAULT_BATCH_SIZE_MAX,
    DEFAULT_KEYSET_BATCH_SIZE_MAX,
    DEFAULT_TARGET_BATCH_DURATION,
)
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES

#: ``A_paced``: A with ``sleep_ratio`` set (the bench's ``paced_sleep_ratio``) and an explicit
#: batch size.
STRATEGIES = ("A", "A_paced", "B", "C", "D", "A2", "A4", "J")
#: Not run by default, to measure what a choice of A's gives: A with ``synchronous_commit`` on;
#: A with an explicit batch size (no batch above it); A locking every batch's rows before
#: deleting them (no optimistic batches); A moving every row into an archive (a policy's
#: ``archive_table``) instead of only deleting it; A in keyset order, and in page order,
#: whatever the backlog; B with sequential scans off, so the planner takes the rule's partial
#: index whatever its estimates (after a backlog is cleared it still expects a year of guest
#: rows, and B then reads the whole table for a day's worth). ``A_held``: A for a policy with
#: a hold table holding :data:`HELD_KEYS` active holds on prunable rows (what the hold test
#: costs; those rows stay). ``A_capped``: A with ``batch_size_max`` set to the default max
#: (mode ``capped``): no batch above 10,000 rows in either order, as keyset order's were
#: before they could grow further.
EXTRA_STRATEGIES = ("A_durable", "A_fixed", "A_lock_first", "A_archive", "A_keyset", "A_page",
                    "B_index", "A_held", "A_capped")
#: The hold table of ``A_held``, its policy name, and how many prunable rows it holds.
HOLD_TABLE = "favorites.bench_holds"
HOLD_POLICY = "bench"
HELD_KEYS = 10_000
#: Where ``A_archive`` moves the rows (created by its first batch's check, as a run creates it).
ARCHIVE_TABLE = "favorites.favorites_archive"
#: The strategies of the ``daily`` scenario.
DAILY_STRATEGIES = ("A", "B", "B_index", "C", "J")
#: Workers of each strategy (A2 and A4 run A in that many processes at once).
WORKERS = {"A": 1, "A_paced": 1, "B": 1, "C": 1, "D": 1, "A2": 2, "A4": 4, "A_durable": 1,
           "A_fixed": 1, "A_lock_first": 1, "A_archive": 1, "A_keyset": 1, "A_page": 1,
           "B_index": 1, "J": 1, "A_held": 1, "A_capped": 1}

_GUARD = "user_id IS NULL AND updated_at < %(cutoff)s"
C_DELETE = ("DELETE FROM favorites.favorites WHERE ctid IN (SELECT favorites.ctid FROM "
            f"favorites.favorites WHERE {_GUARD} LIMIT %(limit)s)")
D_SELECT = (f"SELECT id FROM favorites.favorites WHERE {_GUARD} ORDER BY updated_at "
            "LIMIT %(limit)s FOR UPDATE SKIP LOCKED")
D_DELETE = f"DELETE FROM favorites.favorites WHERE id = ANY(%(ids)s) AND {_GUARD}"

#: What a strategy's worker did: rows deleted, why it stopped, figures of its own.
_Outcome = tuple[int, str, dict[str, Any]]


class Batches:
    """Each batch of a worker, in order: its time (seconds) and the rows it deleted."""

    def __init__(self):
        self.durations: list[float] = []
        self.rows: list[int] = []

    def add(self, seconds: float, rows: int) -> None:
        self.durations.append(seconds)
        self.rows.append(rows)


def worker_kind(strategy: str) -> str:
    """The strategy each worker of ``strategy`` runs (A2 and A4 run A)."""
    return "A" if strategy in ("A2", "A4") else strategy


def _purge_a(strategy: str, engine: sa.Engine, url: str, cutoff: dt.datetime, batch_size: int,
             max_run_s: float, batches: Batches, options: dict) -> _Outcome:
    from favorites_maintenance.retention.archive import ArchiveTarget
    from favorites_maintenance.retention.health import HealthLimits
    from favorites_maintenance.retention.holds import HoldTable
    from favorites_maintenance.retention.batch_loop import PurgeOptions
    from favorites_maintenance.retention.purge import purge
    from favorites_maintenance.retention.scan import ScanMode

    # As the job calls it at the default settings (batch size mode adaptive: from batch_size
    # up to the default max); A_fixed as it does with FAVORITES_GUEST_RETENTION_BATCH_SIZE set
    # (mode fixed: no batch above batch_size, smaller ones when a batch is slow); A_paced as it
    # does with ..._BATCH_SIZE and ..._SLEEP_RATIO set.
    largest = batch_size if strategy in ("A_fixed", "A_paced") else DEFAULT_BATCH_SIZE_MAX
    adaptive = {"batch_size_max": largest, "target_batch_duration": DEFAULT_TARGET_BATCH_DURATION,
                "health": HealthLimits(),
                "keyset_batch_size_max": (None if strategy in ("A_fixed", "A_paced", "A_capped")
                                          else DEFAULT_KEYSET_BATCH_SIZE_MAX)}
    rule = (GUEST_FAVORITES.with_hold(HoldTable.define(HOLD_TABLE, "id", HOLD_POLICY))
            if strategy == "A_held" else GUEST_FAVORITES)
    settings = PurgeOptions(
        batch_size=batch_size, max_run_duration=dt.timedelta(seconds=max_run_s),
        **({"synchronous_commit": True} if strategy == "A_durable" else {}),
        **({"optimistic": False} if strategy == "A_lock_first" else {}),
        **({"scan": ScanMode.KEYSET} if strategy == "A_keyset" else {}),
        **({"scan": ScanMode.PAGE_ORDER} if strategy == "A_page" else {}),
        **({"sleep_ratio": options["sleep_ratio"]} if strategy == "A_paced" else {}),
        previous_row_s=options.get("previous_row_s"), **adaptive)
    report = purge(engine, rule, cutoff, settings,
                   on_batch=lambda b: batches.add(b.duration_s, b.deleted),
                   archive=(ArchiveTarget(ARCHIVE_TABLE, "bench", "bench-run")
                            if strategy == "A_archive" else None))
    extra = {"batch_size_max": report.batch_size_max, "paused_ms": report.paused_ms,
             "paced_ms": report.paced_ms, "scan_mode": report.scan_mode,
             "scan_reason": report.scan_reason}
    if strategy == "A_archive":
        with engine.connect() as conn:  # after the timed window: what reached the archive
            extra["archived_rows"] = conn.exec_driver_sql(
                f"SELECT count(*) FROM {ARCHIVE_TABLE}").scalar_one()
    return report.deleted_total, report.stop_reason.value, extra


def place_bench_holds(engine: sa.Engine, cutoff: dt.datetime) -> int:
    """Create :data:`HOLD_TABLE` and hold :data:`HELD_KEYS` prunable rows spread over the
    table (by a hash of the id), for ``A_held``; returns the holds placed."""
    from favorites_maintenance.retention.holds import create_hold_table

    create_hold_table(engine, HOLD_TABLE)
    with engine.begin() as conn:
        placed = conn.execute(sa.text(
            f"INSERT INTO {HOLD_TABLE} (policy, held_value, placed_by, reason) "
            "SELECT :policy, id::text, 'bench', 'bench' FROM favorites.favorites "
            "WHERE user_id IS NULL AND updated_at < :cutoff ORDER BY hashint8(id) LIMIT :n"),
            {"policy": HOLD_POLICY, "cutoff": cutoff, "n": HELD_KEYS}).rowcount
        conn.exec_driver_sql(f"ANALYZE {HOLD_TABLE}")
    return placed


def _one_delete_b(strategy, engine, url, cutoff, batch_size, max_run_s, batches,
                  options) -> _Outcome:
    t = time.monotonic()
    with engine.begin() as conn:
        if strategy == "B_index":
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        deleted = conn.execute(GUEST_FAVORITES.delete_prunable(cutoff)).rowcount
    batches.add(time.monotonic() - t, deleted)
    return deleted, "done", {}


def _ctid_loop_c(strategy, engine, url, cutoff, batch_size, max_run_s, batches,
                 options) -> _Outcome:
    deleted = 0
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        raw = conn.connection.driver_connection
        while True:
            t = time.monotonic()
            n = raw.execute(C_DELETE, {"cutoff": cutoff, "limit": batch_size}).rowcount
            batches.add(time.monotonic() - t, n)
            deleted += n
            if n == 0:
                break
    return deleted, "deleted nothing", {}


def _skip_locked_d(strategy, engine, url, cutoff, batch_size, max_run_s, batches,
                   options) -> _Outcome:
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
            batches.add(time.monotonic() - t, n)
            deleted += n
            if len(ids) < batch_size:
                break
    return deleted, "batch not full", {}


def _job_j(strategy, engine, url, cutoff, batch_size, max_run_s, batches,
           options) -> _Outcome:
    from favorites_maintenance.bench.job import run_job

    job = run_job(sa.make_url(url), cutoff, batch_size, max_run_s,
                  previous_row_s=options.get("previous_row_s"))
    return job["deleted"], job["stop_reason"], {
        "purge_seconds": job["purge_seconds"], "run_seconds": job["run_seconds"],
        "launch_seconds": job["launch_seconds"], "scan_mode": job["scan_mode"],
        "job_batches": job["batches"], "job_batch_max_ms": job["batch_max_ms"]}


_WORKER: dict[str, Callable[..., _Outcome]] = {
    "A": _purge_a, "A_paced": _purge_a, "A_durable": _purge_a, "A_fixed": _purge_a,
    "A_lock_first": _purge_a, "A_archive": _purge_a, "A_keyset": _purge_a, "A_page": _purge_a,
    "A_held": _purge_a, "A_capped": _purge_a,
    "B": _one_delete_b, "B_index": _one_delete_b, "C": _ctid_loop_c, "D": _skip_locked_d,
    "J": _job_j,
}


def _rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # KiB on Linux


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


def purge_child(strategy: str, url: str, cutoff: dt.datetime, batch_size: int,
                max_run_s: float, start, pipe, options: dict | None = None) -> None:
    """Run one purge worker; send back what it did. Runs in a process of its own (see
    :func:`favorites_maintenance.bench.worker_context`).

    Sends ``"ready"`` once connected, waits for ``start``, then sends ``deleted``, ``durations``
    (each batch, s) and ``batch_rows`` (each batch's rows), ``t0``/``t1`` (monotonic),
    ``stop_reason``, ``rss_mb``/``rss_before_mb``, ``wal_bytes`` (the worker's own, ``None``
    where the server cannot tell) and the strategy's own figures; or ``{"error": ...}``.
    ``options``: ``sleep_ratio`` of ``A_paced``; ``previous_row_s``, the time per row of the
    run before (seconds, or ``None``), of ``A`` and ``J``.
    """
    try:
        result = _run_worker(strategy, url, cutoff, batch_size, max_run_s, start, pipe,
                             options or {})
    except BaseException as exc:  # report, never hang the parent
        result = {"error": f"{type(exc).__name__}: {exc}"}
    pipe.send(result)
    pipe.close()


def _run_worker(strategy, url, cutoff, batch_size, max_run_s, start, pipe, options) -> dict:
    if strategy not in _WORKER:
        raise ValueError(f"unknown strategy {strategy!r}")
    batches = Batches()
    rss_before = _rss_mb()
    with engine_on(url) as engine:
        with engine.connect() as conn:  # the connection the purge then takes from the pool
            pid0, wal0 = _backend_wal(conn)
        pipe.send("ready")
        start.wait()
        t0 = time.monotonic()
        deleted, stop_reason, extra = _WORKER[strategy](strategy, engine, url, cutoff,
                                                        batch_size, max_run_s, batches, options)
        t1 = time.monotonic()
        with engine.connect() as conn:
            pid1, wal1 = _backend_wal(conn)
    return {
        "deleted": deleted, "durations": batches.durations, "batch_rows": batches.rows,
        "t0": t0, "t1": t1,
        "stop_reason": stop_reason, "rss_mb": _rss_mb(), "rss_before_mb": rss_before,
        # J's purge runs on the job's own connections: only the server's total tells its WAL.
        "wal_bytes": (wal1 - wal0) if (wal0 is not None and wal1 is not None and pid0 == pid1
                                       and strategy != "J") else None,
        **extra,
    }
