"""The bench's data set (one seeded, reproducible table restored before every strategy) and the
paced user workload that runs beside each purge."""

from __future__ import annotations

import datetime as dt
import random
import time
import uuid

import sqlalchemy as sa
from sqlalchemy.engine import URL

from favorites_maintenance.bench.server import BenchServer, engine_on

UTC = dt.timezone.utc

#: The data set's "now": fixed, so the same seed gives the same rows whenever the bench runs.
BENCH_NOW = dt.datetime(2026, 1, 1, tzinfo=UTC)
#: Share of the rows, the oldest, that are all account rows; guests make 40% overall.
ACCOUNT_HEAD_SHARE = 0.25
GUEST_SHARE_OVERALL = 0.4
TOUCHED_SHARE = 0.1

_TOUCH = ("UPDATE favorites.favorites SET updated_at = now(), item_id = item_id + 1 "
          "WHERE id = %s")


def seed_template(srv: BenchServer, db: str, rows: int, seed: float) -> dict:
    """Create database ``db`` holding the seeded dev table, vacuumed, frozen and analysed."""
    from favorites_maintenance.local.guest_favorites import create_dev_schema
    from favorites_maintenance.local.seed import seed_favorites

    srv.drop(db)
    srv.execute(f'CREATE DATABASE "{db}"')
    with engine_on(srv.url(db)) as engine:
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
    return {"rows": summary.rows, "guest_rows": summary.guest_rows,
            "account_rows": summary.account_rows, "bytes": size}


def count_rows(url: URL, cutoff: dt.datetime, max_seed_id: int | None = None,
               holds: str | None = None) -> dict:
    """``prunable`` rows at ``cutoff``, ``accounts`` rows of the data set (ids up to
    ``max_seed_id``: not the user workload's), and the table's ``max_id``. With ``holds``
    (a hold table of ``A_held``), rows its active holds keep are not prunable."""
    held = ("" if holds is None else
            f" AND NOT EXISTS (SELECT 1 FROM {holds} h WHERE h.released_at IS NULL "
            "AND h.held_value = favorites.id::text)")
    with engine_on(url) as engine, engine.connect() as conn:
        row = conn.execute(sa.text(
            f"SELECT count(*) FILTER (WHERE user_id IS NULL AND updated_at < :cutoff{held}), "
            "count(*) FILTER (WHERE user_id IS NOT NULL AND id <= :max_id), max(id) "
            "FROM favorites.favorites"),
            {"cutoff": cutoff, "max_id": max_seed_id or 2**62}).one()
    return {"prunable": row[0], "accounts": row[1], "max_id": row[2]}


def count_held_left(url: URL) -> int:
    """Rows of the table that an active hold of ``A_held``'s hold table covers."""
    from favorites_maintenance.bench.strategies import HOLD_TABLE

    with engine_on(url) as engine, engine.connect() as conn:
        return conn.execute(sa.text(
            f"SELECT count(*) FROM favorites.favorites f WHERE EXISTS (SELECT 1 FROM "
            f"{HOLD_TABLE} h WHERE h.released_at IS NULL AND h.held_value = f.id::text)"
        )).scalar_one()


def sample_ids(url: URL, cutoff: dt.datetime, n: int = 2000) -> tuple[list[int], list[int]]:
    """Ids of account rows (any age) and of fresh guest rows for the user workload."""
    with engine_on(url) as engine, engine.connect() as conn:
        accounts = list(conn.execute(sa.text(
            "SELECT id FROM favorites.favorites WHERE user_id IS NOT NULL "
            "ORDER BY hashint8(id) LIMIT :n"), {"n": n}).scalars())
        guests = list(conn.execute(sa.text(
            "SELECT id FROM favorites.favorites WHERE user_id IS NULL "
            "AND updated_at > :fresh ORDER BY hashint8(id) LIMIT :n"),
            {"n": n, "fresh": cutoff + dt.timedelta(days=2)}).scalars())
    return accounts, guests


def user_workload(url: str, account_ids: list[int], guest_ids: list[int], ops_per_s: float,
                  seed: int, stop, pipe) -> None:
    """Paced single-row inserts and updates, one statement per transaction, until ``stop``.
    Sends back ``[(monotonic start, latency s), ...]``. Runs in a process of its own (see
    :func:`favorites_maintenance.bench.worker_context`)."""
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
            (_TOUCH, lambda: (rnd.choice(account_ids),)),
            (_TOUCH, lambda: (rnd.choice(guest_ids),)),
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
