"""The backlog: prunable rows still present for a cutoff.

Also the dry run (Laravel's ``model:prune --pretend``): how many rows the rule matches now,
deleting nothing.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.errors import BacklogError, InvalidArgumentError, describe
from favorites_maintenance.retention.holds import HoldTable, typed_holds
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.rule_predicates import require_aware
from favorites_maintenance.retention.unreadable import count_around_unreadable


@dataclass(frozen=True)
class Backlog:
    """Prunable rows left for a cutoff.

    Attributes:
        cutoff: the UTC instant the rows are older than.
        remaining: how many rows the rule matches (exact count).
        oldest_age: the rule's age column (``updated_at`` for the guest-favorites rule) of the
            oldest of them, a timezone-aware instant, or ``None`` when there is none.
        held: rows the guard and the age admit that an active hold covers, so no run deletes
            them (0 for a rule without holds); not in ``remaining``.
    """

    cutoff: dt.datetime
    remaining: int
    oldest_age: dt.datetime | None
    held: int = 0


def measure_backlog(engine: sa.Engine, rule: RetentionRule, cutoff: dt.datetime) -> Backlog:
    """Count the prunable rows for ``cutoff`` in one read-only statement, bounded like a batch
    (``lock_timeout`` 2 s, ``statement_timeout`` 30 s, or the session's shorter limits).

    Served by the rule's partial index (``(updated_at, id) WHERE user_id IS NULL`` for the
    guest-favorites rule) when it exists. When the count fails on a row this role cannot read
    (a row-level security policy raising for it, a row the purge skips), it is counted around
    such rows (:func:`~favorites_maintenance.retention.unreadable.count_around_unreadable`),
    each counted as one.

    With holds, the rows they keep are counted apart (:attr:`Backlog.held`), by a second
    statement in the same transaction, both comparing the holds as a run's batches do
    (:func:`compared_as_batches`).

    Raises:
        BacklogError: the database failed (described without private data).
        InvalidArgumentError: ``cutoff`` is naive.
    """
    require_aware(cutoff, "cutoff")  # refused before any connection
    held = 0
    try:
        with engine.connect() as conn:
            try:
                with conn.begin():
                    limit_transaction(conn)  # never queue without limit behind a migration
                    rule = compared_as_batches(conn, rule)
                    remaining, oldest = conn.execute(sa.select(
                        sa.func.count(), sa.func.min(rule.age)).where(
                        rule.prunable(cutoff))).one()
                    if rule.hold is not None:
                        held = conn.execute(count_held(rule, cutoff)).scalar_one()
            except sa.exc.DBAPIError as exc:
                error = describe(exc)
                counted = (count_around_unreadable(conn, rule, cutoff) if error.row_level
                           else None)
                if counted is None:
                    raise BacklogError(error) from None
                remaining, oldest = counted
    except sa.exc.DBAPIError as exc:
        raise BacklogError(describe(exc)) from None
    return Backlog(cutoff=cutoff, remaining=remaining, oldest_age=oldest, held=held)


def count_held(rule: RetentionRule, cutoff: dt.datetime) -> sa.Select:
    """``SELECT count(*)`` of the rows the rule's guard and age admit at ``cutoff`` that an
    active hold covers (``0`` rows counted for a rule without holds)."""
    return sa.select(sa.func.count()).select_from(rule.table).where(rule.held(cutoff))


def compared_as_batches(conn: sa.Connection, rule: RetentionRule) -> RetentionRule:
    """``rule`` with its holds compared as a run's batches compare them: read as the hold
    column's type when every active hold reads as it
    (:func:`~favorites_maintenance.retention.holds.typed_holds`), so that a count keeps the
    rows a run keeps (a hold written ``042`` for the bigint 42, one on a ``citext`` column
    cased otherwise than its row), else as text. ``rule`` itself when it has no holds, or when
    its hold column is not a column of its table (the count then fails, naming it). Reads in
    the connection's transaction, in a savepoint.

    Raises:
        sqlalchemy.exc.DBAPIError: the table or the hold table cannot be read.
    """
    if rule.hold is None:
        return rule
    return rule.with_hold(holds_as_batches_read(conn, rule.hold, rule.qualified_name))


def holds_as_batches_read(conn: sa.Connection, hold: HoldTable, table: str) -> HoldTable:
    """``hold`` read as the batches read it on ``table`` (``schema.table``): in the type of
    ``table``'s column of its name when every active hold reads as it
    (:func:`~favorites_maintenance.retention.holds.typed_holds`), else as text; ``hold`` as
    given when ``table`` has no such column. Reads in the connection's transaction, in a
    savepoint.

    Raises:
        sqlalchemy.exc.DBAPIError: the table or the hold table cannot be read.
    """
    try:
        return typed_holds(conn, hold, table)[0]
    except InvalidArgumentError:
        return hold
