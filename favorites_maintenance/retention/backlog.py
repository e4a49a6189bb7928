"""The backlog: prunable rows still present for a cutoff.

Also the dry run (Laravel's ``model:prune --pretend``): how many rows the rule matches now,
deleting nothing.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.errors import BacklogError, describe
from favorites_maintenance.retention.rule import GUEST_FAVORITES, RetentionRule
from favorites_maintenance.retention.unreadable import count_around_unreadable


@dataclass(frozen=True)
class Backlog:
    """Prunable rows left for a cutoff.

    Attributes:
        cutoff: the UTC instant the rows are older than.
        remaining: how many rows the rule matches (exact count).
        oldest_age: the rule's age column (``updated_at`` for the guest-favorites rule) of the
            oldest of them, a timezone-aware instant, or ``None`` when there is none.
    """

    cutoff: dt.datetime
    remaining: int
    oldest_age: dt.datetime | None


def measure_backlog(engine: sa.Engine, cutoff: dt.datetime,
                    rule: RetentionRule = GUEST_FAVORITES) -> Backlog:
    """Count the prunable rows for ``cutoff`` in one read-only statement, bounded like a batch
    (``lock_timeout`` 2 s, ``statement_timeout`` 30 s, or the session's shorter limits).

    Served by the rule's partial index (``(updated_at, id) WHERE user_id IS NULL`` for the
    guest-favorites rule) when it exists. When the count fails on a row this role cannot read
    (a row-level security policy raising for it, a row the purge skips), it is counted around
    such rows (:func:`~favorites_maintenance.retention.unreadable.count_around_unreadable`),
    each counted as one.

    Raises:
        BacklogError: the database failed (described without private data).
        InvalidArgumentError: ``cutoff`` is naive.
    """
    stmt = sa.select(sa.func.count(), sa.func.min(rule.age)).where(rule.prunable(cutoff))
    try:
        with engine.connect() as conn:
            try:
                with conn.begin():
                    limit_transaction(conn)  # never queue without limit behind a migration
                    remaining, oldest = conn.execute(stmt).one()
            except sa.exc.DBAPIError as exc:
                error = describe(exc)
                counted = (count_around_unreadable(conn, rule, cutoff) if error.row_level
                           else None)
                if counted is None:
                    raise BacklogError(error) from None
                remaining, oldest = counted
    except sa.exc.DBAPIError as exc:
        raise BacklogError(describe(exc)) from None
    return Backlog(cutoff=cutoff, remaining=remaining, oldest_age=oldest)

