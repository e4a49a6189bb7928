"""The SQL a retention rule builds: its predicates and its one DELETE.

:class:`RulePredicates` is mixed into :class:`~favorites_maintenance.retention.rule.
RetentionRule`, whose fields it reads. Every statement of the project that selects, counts or
deletes prunable rows is built from :meth:`RulePredicates.prunable` (or, for the rows a hold
keeps, :meth:`RulePredicates.held`); the guard and the ranges of the age column are rendered
literally, the cutoff is a bound parameter.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP

from favorites_maintenance.retention.errors import InvalidArgumentError
from favorites_maintenance.retention.holds import HoldTable

_MICROSECOND = dt.timedelta(microseconds=1)

#: A range of the age column, ``[lower, upper)``, as UTC instants; ``None`` for an open end.
AgeRange = tuple[dt.datetime | None, dt.datetime | None]


class RulePredicates:
    """The predicates and the DELETE of a :class:`~favorites_maintenance.retention.rule.
    RetentionRule`, built from its fields (declared here, set by the rule): the age
    comparison, the guard columns' ``IS NULL``, the narrowing to :attr:`ages` and the hold
    test."""

    age: sa.Column
    guards: tuple[sa.Column, ...]
    cutoff_inclusive: bool
    ages: tuple[AgeRange, ...] | None
    hold: HoldTable | None
    hold_column: sa.Column | None
    key: sa.Column
    table: sa.Table

    def prunable_before(self, cutoff: dt.datetime) -> dt.datetime:
        """The instant every prunable age lies strictly before: ``cutoff`` itself, or one
        microsecond (the resolution of ``timestamptz``) after it for a rule with
        ``cutoff_inclusive``. A range of ages that starts at or after it holds no prunable
        row.

        Raises:
            InvalidArgumentError: ``cutoff`` is naive.
        """
        require_aware(cutoff, "cutoff")
        return cutoff + _MICROSECOND if self.cutoff_inclusive else cutoff

    def prunable(self, cutoff: dt.datetime) -> sa.ColumnElement[bool]:
        """The prunable predicate ``<guards> IS NULL AND <age> < :cutoff`` (``<=`` with
        ``cutoff_inclusive``), and, with holds, ``AND NOT EXISTS (<an active hold of the
        row>)``: every statement of the project that selects, counts or deletes prunable rows
        is built from it.

        Args:
            cutoff: timezone-aware instant; rows aged strictly before it are prunable (or at
                it too, with ``cutoff_inclusive``).

        Raises:
            InvalidArgumentError: ``cutoff`` is naive.
        """
        require_aware(cutoff, "cutoff")
        eligible = self.eligible(cutoff)
        if self.hold is None:
            return eligible
        return sa.and_(eligible, self.hold.uncovered(
            self.hold_column, nullable=self.hold_column is not self.key))

    def eligible(self, cutoff: dt.datetime) -> sa.ColumnElement[bool]:
        """The guard and the age alone, ``<guards> IS NULL AND <age> < :cutoff``: the rows
        the rule would prune were it not for holds (what :meth:`prunable` is without holds).

        Raises:
            InvalidArgumentError: ``cutoff`` is naive.
        """
        require_aware(cutoff, "cutoff")
        bound = sa.bindparam("cutoff", cutoff, type_=TIMESTAMP(timezone=True))
        return sa.and_(
            *(c.is_(None) for c in self.guards),
            self.age <= bound if self.cutoff_inclusive else self.age < bound,
            *self._in_ages(),
        )

    def _in_ages(self) -> list[sa.ColumnElement[bool]]:
        """The narrowing to :attr:`ages`, as one condition (none for the whole table)."""
        if self.ages is None:
            return []
        ts = TIMESTAMP(timezone=True)
        ranges = []
        for lower, upper in self.ages:
            ends = ([self.age >= sa.literal(lower, ts)] if lower is not None else []) + (
                [self.age < sa.literal(upper, ts)] if upper is not None else [])
            if not ends:
                return []  # an unbounded range admits every row
            ranges.append(sa.and_(*ends))
        return [sa.or_(*ranges) if ranges else sa.false()]

    def held(self, cutoff: dt.datetime) -> sa.ColumnElement[bool]:
        """The rows :meth:`eligible` admits that an active hold covers (``false`` without
        holds): what a run counts as held, never deletes.

        Raises:
            InvalidArgumentError: ``cutoff`` is naive.
        """
        eligible = self.eligible(cutoff)
        if self.hold is None:
            return sa.and_(eligible, sa.false())
        return sa.and_(eligible, self.hold.covers(self.hold_column))

    def delete_prunable(self, cutoff: dt.datetime, *where: sa.ColumnElement[bool]) -> sa.Delete:
        """``DELETE FROM <table> WHERE <prunable(cutoff)> AND <where...>``.

        The only DELETE constructor of the project: callers narrow it (to a batch's keys) but
        cannot drop the guard or the hold test, which are repeated here as defence in depth
        even when the rows were selected with the same predicate (a hold committed since then
        keeps its row).

        Raises:
            InvalidArgumentError: ``cutoff`` is naive.
        """
        return sa.delete(self.table).where(self.prunable(cutoff), *where)


def require_aware(value: dt.datetime, name: str) -> None:
    """Raise :class:`~favorites_maintenance.retention.errors.InvalidArgumentError` when
    ``value`` (named ``name`` in the message) is a naive datetime."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgumentError(f"{name} must be a timezone-aware datetime, got naive {value!r}")
