"""The retention rule: which guest favorites are prunable, and the cutoff.

This is the one place the rule lives (the rule is declared with the data it governs;
the schedule only says *when* it runs). A row is prunable iff::

    user_id IS NULL AND updated_at < :cutoff

``user_id IS NULL`` is rendered literally, never as a bound parameter, so the planner can prove
the partial index ``(updated_at, id) WHERE user_id IS NULL`` serves the query. Every DELETE the
project issues is built by :func:`delete_prunable`, which always carries this predicate.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP

from favorites_maintenance.retention.errors import InvalidArgumentError

SCHEMA = "favorites"
TABLE = "favorites"

#: The favorites table as the job sees it: only the three columns it may read. The id
#: type is left open (bigint or uuid): values are only ever read back and rebound.
favorites = sa.Table(
    TABLE,
    sa.MetaData(schema=SCHEMA),
    sa.Column("id", sa.types.NullType(), primary_key=True),
    sa.Column("user_id", sa.types.NullType(), nullable=True),
    sa.Column("updated_at", TIMESTAMP(timezone=True), nullable=False),
    # PostgreSQL's row address: the purge reaches rows it has locked by it (never read before
    # they are locked, never kept across transactions).
    sa.Column("ctid", sa.types.NullType(), system=True),
)

_UTC = dt.timezone.utc


def prunable(cutoff: dt.datetime) -> sa.ColumnElement[bool]:
    """The prunable predicate ``user_id IS NULL AND updated_at < :cutoff``.

    Args:
        cutoff: timezone-aware instant; rows with ``updated_at`` strictly before it are prunable.

    Raises:
        InvalidArgumentError: ``cutoff`` is naive.
    """
    _require_aware(cutoff, "cutoff")
    return sa.and_(
        favorites.c.user_id.is_(None),
        favorites.c.updated_at < sa.bindparam("cutoff", cutoff, type_=TIMESTAMP(timezone=True)),
    )


def delete_prunable(cutoff: dt.datetime, *where: sa.ColumnElement[bool]) -> sa.Delete:
    """``DELETE FROM favorites.favorites WHERE <prunable(cutoff)> AND <where...>``.

    The only DELETE constructor of the project: callers narrow it (to a batch's ids) but cannot
    drop the guard, which is repeated here as defence in depth even when the rows were selected
    with the same predicate.
    """
    return sa.delete(favorites).where(prunable(cutoff), *where)


def compute_cutoff(now: dt.datetime, retention_days: int,
                   window_end: dt.datetime | None = None) -> dt.datetime:
    """The cutoff instant for a run: ``min(now, window_end) - retention_days`` in UTC.

    ``window_end`` is the end of the daily partition being run (a backfill of an old day then
    deletes a subset of what today's run would); a cutoff later than ``now - retention_days`` is
    impossible. Days are exact 24-hour periods on the UTC time line, so neither daylight saving
    nor the session's time zone moves the cutoff.

    Args:
        now: timezone-aware current instant.
        retention_days: retention period in days, > 0.
        window_end: optional timezone-aware end of the partition window.

    Returns:
        A timezone-aware UTC datetime.

    Raises:
        InvalidArgumentError: a naive datetime, or ``retention_days`` not > 0.
    """
    _require_aware(now, "now")
    if retention_days <= 0:
        raise InvalidArgumentError(f"retention_days must be > 0, got {retention_days!r}")
    anchor = now
    if window_end is not None:
        _require_aware(window_end, "window_end")
        anchor = min(now, window_end)
    return anchor.astimezone(_UTC) - dt.timedelta(days=retention_days)


def _require_aware(value: dt.datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgumentError(f"{name} must be a timezone-aware datetime, got naive {value!r}")
