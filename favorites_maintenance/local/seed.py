"""A realistic, reproducible data set for the dev table (demo, ``dev``, benchmark).

The rows are generated inside PostgreSQL (``generate_series`` with a seeded ``random()``), so a
few million rows take seconds and the same seed gives the same rows. The shape follows a real
favorites table: rows inserted in time order over ``years``, a share of guest rows (the rest
belong to accounts, many of them old), a share "touched" later (``updated_at`` moved forward
towards now), and runs of 25 rows sharing one ``updated_at`` (imports, retries). Optionally the
oldest share of the rows are all account rows (favorites existed before guests could save any),
so a scan of all rows in ``updated_at`` order meets many account rows before the first guest.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import dev_favorites

_INSERT = sa.text(
    """
    INSERT INTO favorites.favorites (user_id, anonymous_id, item_id, note, created_at, updated_at)
    SELECT CASE WHEN guest THEN NULL ELSE 1 + floor(r_user * 50000)::bigint END,
           CASE WHEN guest THEN md5(r_anon::text)::uuid END,
           1 + floor(r_item * 100000)::bigint,
           CASE WHEN r_note < 0.2 THEN 'note ' || i END,
           created_at,
           CASE WHEN touched THEN created_at + r_touch * (CAST(:now AS timestamptz) - created_at)
                ELSE created_at END
      FROM (SELECT i,
                   random() < CASE WHEN i < :account_head_rows THEN 0 ELSE :guest_share END
                     AS guest,
                   random() < :touched_share AS touched,
                   random() AS r_user, random() AS r_anon, random() AS r_item,
                   random() AS r_note, random() AS r_touch,
                   CAST(:start AS timestamptz)
                     + ((CASE WHEN i % 250 < 25 THEN i - i % 25 ELSE i END)::float8 / :rows)
                       * (CAST(:now AS timestamptz) - CAST(:start AS timestamptz)) AS created_at
              FROM generate_series(CAST(:first AS integer), CAST(:last AS integer)) AS i) AS g
    """
)


@dataclass(frozen=True)
class SeedSummary:
    """Counts of the seeded table.

    Attributes:
        rows: all rows; guest_rows: ``user_id IS NULL``; account_rows: ``user_id IS NOT NULL``.
    """

    rows: int
    guest_rows: int
    account_rows: int


#: Rows per INSERT statement: the unit of progress reports.
CHUNK_ROWS = 100_000


def seed_favorites(engine: sa.Engine, rows: int, *, now: dt.datetime, years: float = 3.0,
                   seed: float = 0.42, guest_share: float = 0.4,
                   touched_share: float = 0.1, account_head_share: float = 0.0,
                   on_progress: Callable[[int], None] | None = None) -> SeedSummary:
    """Append ``rows`` generated rows to the dev table and ``ANALYZE`` it.

    Args:
        engine: engine on a dev/test database whose table exists
            (:func:`~favorites_maintenance.local.guest_favorites.create_dev_schema`).
        rows: how many rows to insert, > 0.
        now: timezone-aware end of the time span; rows span ``years`` before it.
        seed: ``setseed()`` value in [-1, 1]; the same seed gives the same rows.
        guest_share, touched_share: probabilities in [0, 1].
        account_head_share: share in [0, 1) of the rows, the oldest ones, that are all account
            rows; ``guest_share`` then applies to the others only (0: guests from the start).
        on_progress: called with the number of rows inserted so far after each statement of
            :data:`CHUNK_ROWS` rows (the statements run in one transaction and one session, so
            the rows are the same as in one statement).

    Returns:
        The :class:`SeedSummary` of the whole table after the insert.
    """
    if rows <= 0:
        raise ValueError(f"rows must be > 0, got {rows!r}")
    if not 0.0 <= account_head_share < 1.0:
        raise ValueError(f"account_head_share must be in [0, 1), got {account_head_share!r}")
    start = now - dt.timedelta(days=365.25 * years)
    with engine.begin() as conn:
        # One backend, no parallel workers: random() is then a single seeded sequence.
        conn.execute(sa.text("SET LOCAL max_parallel_workers_per_gather = 0"))
        conn.execute(sa.select(sa.func.setseed(seed)))
        for first in range(0, rows, CHUNK_ROWS):
            last = min(first + CHUNK_ROWS, rows) - 1
            conn.execute(_INSERT, {"rows": rows, "now": now, "start": start, "first": first,
                                   "last": last, "guest_share": guest_share,
                                   "touched_share": touched_share,
                                   "account_head_rows": int(rows * account_head_share)})
            if on_progress is not None:
                on_progress(last + 1)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("ANALYZE favorites.favorites"))
    return summarize(engine)


def summarize(engine: sa.Engine) -> SeedSummary:
    """Count all, guest and account rows of the dev table."""
    t = dev_favorites
    stmt = sa.select(
        sa.func.count(),
        sa.func.count().filter(t.c.user_id.is_(None)),
        sa.func.count().filter(t.c.user_id.is_not(None)),
    )
    with engine.connect() as conn:
        total, guests, accounts = conn.execute(stmt).one()
    return SeedSummary(rows=total, guest_rows=guests, account_rows=accounts)
