"""Finding the row a one-row batch cannot even read.

A failed batch is split down to one row, and a one-row batch names its row (the next-key
lookup, :func:`~favorites_maintenance.retention.statements.next_key_statement`) before it tries
to delete it, so the row can be skipped. When reading the row is what fails (a row-level
security policy whose expression raises for that row, say a cast or a division in ``USING``),
the lookup fails too and names nothing. :func:`locate_unreadable_row` then finds the row's
keyset position without reading it: the lookup bounded by ``<age> < :bound`` fails exactly
when the bound is past the row (every row between the keyset position and it is filtered out,
or the unbounded lookup would have returned one), so a bisection over the age, then over the
key among rows of that age, ends on its ``(age, key)``. Each probe is one indexed ``LIMIT 1``
read in a savepoint of one rolled-back transaction; about 64 probes for the age and 64 for a
bigint key (128 for a uuid).

Keys are bisected when they are integers or uuids; a row whose key is of another type cannot
be located this way, and the batch fails as any other.

Counting the backlog meets the same row: :func:`count_around_unreadable` counts the rows on
either side of each such row, by ranges of the keyset index that leave it out, and counts it as
one.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.dialects.postgresql import UUID as PG_UUID

from favorites_maintenance.retention.database import MIN_UTC, limit_transaction
from favorites_maintenance.retention.errors import describe
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.statements import keyset_position

# The purge's log lines keep the purge's logger name, whichever module writes them.
log = logging.getLogger("favorites_maintenance.retention.purge")

_MICRO = dt.timedelta(microseconds=1)

#: Rows this role cannot read that one count goes around before it gives up (the most a run
#: may skip).
MAX_UNREADABLE = 100

#: Key types that can be bisected: the range of values and the type to bind them as.
_INTEGER_KEYS = {"smallint": 15, "integer": 31, "bigint": 63}

_KEY_TYPE = sa.text(
    "SELECT format_type(atttypid, NULL) FROM pg_attribute "
    "WHERE attrelid = to_regclass(:t) AND attname = :k AND NOT attisdropped")


class _Moved(Exception):
    """A probe returned a row: the table changed under the search (a row unlocked or
    inserted); the next batch takes it from there."""


def locate_unreadable_row(conn: sa.Connection, rule: RetentionRule, cutoff: dt.datetime,
                          after: dict | None) -> tuple[dt.datetime, object] | None:
    """The ``(age, key)`` of the first candidate past ``after`` (the keyset position
    ``{"after_age", "after_key"}``, ``None`` at the start) that this role cannot read, found
    without reading it (see the module docstring), or ``None`` when it cannot be found (a key
    type that cannot be bisected, a probe failing for another reason, a table changing under
    the search).

    Args:
        conn: the purge's connection, no transaction open; one transaction is opened and
            rolled back.
        cutoff: the run's cutoff, a timezone-aware UTC instant.
    """
    try:
        with conn.begin() as tx:
            limit_transaction(conn)
            key_type = conn.execute(_KEY_TYPE, {"t": rule.qualified_name,
                                                "k": rule.key.name}).scalar()
            keys = _key_range(key_type)
            if keys is None:
                return None
            search = _Search(conn, rule, cutoff, after)
            age = search.age()
            found = (age, search.key(age, *keys)) if age is not None else None
            tx.rollback()
            return found
    except _Moved:
        return None
    except sa.exc.DBAPIError as exc:
        log.warning("could not locate the row the purge cannot read: %s", describe(exc))
        return None


def _key_range(key_type: str | None):
    """``(lowest, highest, to_value, bind_type)`` of a key type that can be bisected, else
    ``None``."""
    if key_type in _INTEGER_KEYS:
        bits = _INTEGER_KEYS[key_type]
        return -2**bits, 2**bits - 1, int, sa.BigInteger()
    if key_type == "uuid":
        return 0, 2**128 - 1, lambda n: uuid.UUID(int=n), PG_UUID(as_uuid=True)
    return None


class _Search:
    """The probes of one search, each in a savepoint of the open transaction."""

    def __init__(self, conn: sa.Connection, rule: RetentionRule, cutoff: dt.datetime,
                 after: dict | None):
        self.conn, self.rule, self.cutoff, self.after = conn, rule, cutoff, after
        where = [rule.prunable(cutoff)] + (keyset_position(rule) if after else [])
        self.base = (sa.select(sa.literal(1)).where(*where).order_by(rule.age, rule.key)
                     .limit(1).with_for_update(skip_locked=True))

    def fails(self, *bounds: sa.ColumnElement[bool], **params) -> bool:
        """Whether the lookup within ``bounds`` fails on a row-level error (the row is in
        them); raises :class:`_Moved` when it returns a row instead."""
        savepoint = self.conn.begin_nested()
        try:
            row = self.conn.execute(self.base.where(*bounds),
                                    {**(self.after or {}), **params}).first()
        except sa.exc.DBAPIError as exc:
            savepoint.rollback()
            if describe(exc).row_level:
                return True
            raise
        savepoint.rollback()
        if row is not None:
            raise _Moved()
        return False

    def age(self) -> dt.datetime | None:
        """The row's age: the last bound ``b`` with no failure for ``<age> < b``, in
        microseconds from the keyset position (or the earliest instant) to the end of the
        prunable ages (the cutoff, or just past it for a rule that prunes the row at it)."""
        bound = sa.bindparam("bound", type_=TIMESTAMP(timezone=True))
        start = self.after["after_age"] if self.after else MIN_UTC
        lo, hi = 0, _micros(self.rule.prunable_before(self.cutoff) - start)
        if not self.fails(self.rule.age < bound, bound=start + hi * _MICRO):
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fails(self.rule.age < bound, bound=start + mid * _MICRO):
                hi = mid
            else:
                lo = mid
        return start + lo * _MICRO

    def key(self, age: dt.datetime, lowest: int, highest: int, to_value, bind_type):
        """The row's key among the rows of ``age``: the first bound ``k`` for which
        ``<key> <= k`` fails."""
        at = sa.bindparam("at", type_=TIMESTAMP(timezone=True))
        bound = sa.bindparam("key_bound", type_=bind_type)
        lo = lowest - 1
        if self.after and self.after["after_age"] == age:
            lo = _as_int(self.after["after_key"])
        hi = highest
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.fails(self.rule.age == at, self.rule.key <= bound, at=age,
                          key_bound=to_value(mid)):
                hi = mid
            else:
                lo = mid
        return to_value(hi)


def _micros(value: dt.timedelta) -> int:
    return value.days * 86_400_000_000 + value.seconds * 1_000_000 + value.microseconds


def _as_int(key) -> int:
    return key.int if isinstance(key, uuid.UUID) else int(key)


def count_around_unreadable(conn: sa.Connection, rule: RetentionRule, cutoff: dt.datetime
                            ) -> tuple[int, dt.datetime | None] | None:
    """Count the rows the rule matches for ``cutoff`` and the oldest age among them, when a
    plain count fails on rows this role cannot read: each such row is located
    (:func:`locate_unreadable_row`) and counted as one, the rows before it are counted by
    ranges of the keyset index that leave it out. ``None`` when a row cannot be located, more
    than :data:`MAX_UNREADABLE` are met, or a count fails otherwise.

    Args:
        conn: a connection with no transaction open; each step runs in its own.
    """
    total, oldest, after = 0, None, None
    at = sa.bindparam("at", type_=TIMESTAMP(timezone=True))
    for _ in range(MAX_UNREADABLE + 1):
        whole = _count(conn, rule, cutoff, after)
        if whole is not None:
            return total + whole[0], oldest or whole[1]
        found = locate_unreadable_row(conn, rule, cutoff, after)
        if found is None:
            return None
        age, key = found
        for bound, params in ((rule.age < at, {"at": age}),
                              (sa.and_(rule.age == at, rule.key < sa.bindparam("key")),
                               {"at": age, "key": key})):
            part = _count(conn, rule, cutoff, after, bound, **params)
            if part is None:
                return None
            total += part[0]
            oldest = oldest or part[1]
        total += 1
        oldest = oldest or age
        after = {"after_age": age, "after_key": key}
    return None


def _count(conn: sa.Connection, rule: RetentionRule, cutoff: dt.datetime, after: dict | None,
           *bounds: sa.ColumnElement[bool], **params) -> tuple[int, dt.datetime | None] | None:
    """``count(*)`` and ``min(<age>)`` of the candidates past ``after`` within ``bounds``, or
    ``None`` when the count fails on a row-level error."""
    where = [rule.prunable(cutoff), *(keyset_position(rule) if after else []), *bounds]
    statement = sa.select(sa.func.count(), sa.func.min(rule.age)).where(*where)
    try:
        with conn.begin():
            limit_transaction(conn)
            count, first = conn.execute(statement, {**(after or {}), **params}).one()
    except sa.exc.DBAPIError as exc:
        if describe(exc).row_level:
            return None
        raise
    return count, first
