"""Retention rules: which rows of a table are prunable, and the cutoff.

This is the one place a rule is declared. A policy (``defs/<policy>/defs.yaml``)
names its table and columns; :class:`RetentionRule` turns them into SQLAlchemy objects. The
guest-favorites policy's rule prunes a row iff::

    user_id IS NULL AND updated_at < :cutoff

A rule may have no guard column (every row older than the cutoff is prunable, whoever owns it),
e.g. ``expires_at < :cutoff``. A rule may also take the row exactly at the cutoff (a policy's
``cutoff_inclusive: true``, as Laravel writes ``expires_at <= now() - 30 days``): its comparison
is then ``<=`` in every statement built from it.

:class:`RetentionRule` holds the rule's fields and their checks; the SQL built from them (the
predicates, the one DELETE) is :mod:`~favorites_maintenance.retention.rule_predicates`', the
text its messages and index are written with :mod:`~favorites_maintenance.retention.rule_text`'.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP

from favorites_maintenance.retention.errors import InvalidArgumentError
from favorites_maintenance.retention.holds import HoldTable
from favorites_maintenance.retention.identifiers import (
    IDENTIFIER as _IDENTIFIER,
    RuleError,
    split_table_name,
)
from favorites_maintenance.retention.rule_predicates import AgeRange, RulePredicates, require_aware
from favorites_maintenance.retention.rule_text import RuleText

__all__ = ["AgeRange", "RetentionRule", "compute_cutoff"]

_UTC = dt.timezone.utc


@dataclass(frozen=True, eq=False)
class RetentionRule(RuleText, RulePredicates):
    """Which rows of one table are prunable: every guard column NULL and the age column older
    than the cutoff::

        <guard_1> IS NULL AND ... AND <age> < :cutoff

    or, with ``cutoff_inclusive``, at or before it (``<age> <= :cutoff``).

    The guard is rendered literally, never as a bound parameter, so the planner can prove that
    a partial index ``(<age>, <key>) WHERE <guard> IS NULL`` serves the query. Every DELETE the
    project issues is built by :meth:`delete_prunable`, which always carries this predicate.

    A rule with no guard column (a policy's ``null_columns: []``, written on purpose) prunes
    every row whose age column is before the cutoff, whoever owns it; its predicate is the age
    comparison alone, which is always there, so no DELETE without a predicate can be built. An
    age column may hold future instants (an expiry): such rows are never before the cutoff,
    which is in the past.

    A rule may also be narrowed to ranges of the age column (:meth:`within`): the rows of one
    partition of a range-partitioned table, reached through the table itself.

    Attributes:
        table: the table as the job sees it: only the key, the guards, the age and ``ctid``.
        key: the unique key the batches are ordered and matched by (type left open: bigint,
            uuid, text; values are only ever read back and rebound).
        age: the ``timestamptz`` column compared with the cutoff.
        guards: the columns that must be NULL; empty for a rule with no guard.
        cutoff_inclusive: a row whose age equals the cutoff is prunable too (``<=``); default
            ``False``, strictly before it (``<``).
        ages: the ranges of the age column the rule is narrowed to, each ``[lower,
            upper)``; ``None`` for the whole table (an empty tuple admits no row).
        hold: the policy's holds (:mod:`~favorites_maintenance.retention.holds`), or
            ``None``: a row an active hold covers is never prunable (:meth:`with_hold`).
    """

    table: sa.Table
    key: sa.Column
    age: sa.Column
    guards: tuple[sa.Column, ...]
    cutoff_inclusive: bool = False
    ages: tuple[AgeRange, ...] | None = None
    hold: HoldTable | None = None

    @classmethod
    def define(cls, table: str, *, key_column: str, age_column: str,
               null_columns: Sequence[str], cutoff_inclusive: bool = False) -> "RetentionRule":
        """Build the rule of ``table`` (``schema.table``) from column names.

        The names become SQLAlchemy ``Table``/``Column`` objects, quoted by the dialect
        wherever they reach SQL; none is ever formatted into a statement's text.

        ``null_columns`` empty is a rule with no guard; ``cutoff_inclusive`` prunes the row
        exactly at the cutoff too (see the class).

        Raises:
            RuleError: ``table`` is not ``schema.table``, a name is not a lower-case SQL
                identifier, or a column is named twice.
        """
        schema, name = split_table_name(table)
        for what, value in (("key_column", key_column),
                            ("age_column", age_column), *(("null_columns", c)
                                                           for c in null_columns)):
            if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
                raise RuleError(f"{what} {value!r} is not a lower-case SQL identifier "
                                "(letters, digits, _; at most 63 characters)")
        names = [key_column, age_column, *null_columns]
        if len(set(names)) != len(names) or "ctid" in names:
            raise RuleError(f"columns {names!r} must be distinct, and none may be ctid")
        t = sa.Table(
            name, sa.MetaData(schema=schema),
            sa.Column(key_column, sa.types.NullType(), primary_key=True),
            *(sa.Column(c, sa.types.NullType(), nullable=True) for c in null_columns),
            sa.Column(age_column, TIMESTAMP(timezone=True), nullable=False),
            # PostgreSQL's row address: the purge reaches rows it has locked by it (never read
            # before they are locked, never kept across transactions).
            sa.Column("ctid", sa.types.NullType(), system=True),
        )
        return cls(table=t, key=t.c[key_column], age=t.c[age_column],
                   guards=tuple(t.c[c] for c in null_columns),
                   cutoff_inclusive=bool(cutoff_inclusive))

    def with_columns(self, names: Sequence[str]) -> "RetentionRule":
        """The same rule over a ``Table`` of the same name that also has the columns ``names``
        (untyped: their values only pass from one statement to another on the server), for the
        statements that return whole rows (the move to an archive). ``names`` are read from the
        catalog, so they need not be lower-case identifiers; they reach SQL as ``Column``
        objects, quoted by the dialect."""
        own = {self.key.name, self.age.name, *(c.name for c in self.guards), "ctid"}
        return self._over(self._table_with([n for n in names if n not in own]), self.hold)

    def within(self, ages: Sequence[AgeRange]) -> "RetentionRule":
        """The same rule on the same table, narrowed to the rows whose age lies in one of
        ``ages`` (each ``[lower, upper)``, timezone-aware instants, ``None`` for an open end):
        every statement built from it carries ``(<age> >= lower AND <age> < upper) OR ...``
        beside the prunable predicate.

        On a table range-partitioned by the age column, the ranges of one partition (its
        bounds; for the default partition, the ranges no other partition covers) let the
        planner prune every other partition, so the rule reaches that partition's rows through
        the table: the table's statement triggers, row-level security and grants apply, as to
        the application's own DELETEs. An empty ``ages`` admits no row.

        Raises:
            InvalidArgumentError: a naive bound.
        """
        for lower, upper in ages:
            for name, value in (("lower", lower), ("upper", upper)):
                if value is not None:
                    require_aware(value, f"age range {name} bound")
        return dataclasses.replace(self, ages=tuple(ages))

    def with_hold(self, hold: HoldTable | None) -> "RetentionRule":
        """The same rule, whose rows an active hold of ``hold`` covers are never prunable
        (``None``: no holds). The hold column joins the table as the rule sees it when it is
        none of the rule's own columns.

        Raises:
            RuleError: the hold column is not a lower-case SQL identifier, or is ``ctid``.
        """
        if hold is None:
            return dataclasses.replace(self, hold=None)
        if not _IDENTIFIER.fullmatch(hold.column) or hold.column == "ctid":
            raise RuleError(f"hold_column {hold.column!r} is not a lower-case SQL identifier "
                            "(letters, digits, _; at most 63 characters)")
        if hold.column in self.table.c:
            return self._over(self.table, hold)
        return self._over(self._table_with([hold.column]), hold)

    def _table_with(self, names: Sequence[str]) -> sa.Table:
        """A ``Table`` of the same name with the rule's columns and the untyped ``names``."""
        t = self.table
        return sa.Table(
            t.name, sa.MetaData(schema=t.schema),
            *(sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable,
                        system=c.system) for c in t.columns),
            *(sa.Column(name, sa.types.NullType()) for name in names))

    def _over(self, t: sa.Table, hold: HoldTable | None) -> "RetentionRule":
        """The same rule over ``t`` (its table, or one :meth:`_table_with` built), with
        ``hold``."""
        return RetentionRule(table=t, key=t.c[self.key.name], age=t.c[self.age.name],
                             guards=tuple(t.c[c.name] for c in self.guards),
                             cutoff_inclusive=self.cutoff_inclusive, ages=self.ages, hold=hold)

    @property
    def hold_column(self) -> sa.Column | None:
        """The column of the table a hold matches, or ``None`` without holds."""
        return None if self.hold is None else self.table.c[self.hold.column]

    def _names(self) -> tuple:
        return (self.table.schema, self.table.name, self.key.name, self.age.name,
                tuple(c.name for c in self.guards), self.cutoff_inclusive,
                self.ages, None if self.hold is None else self.hold._names())

    def __eq__(self, other: object) -> bool:
        # Two rules built from the same names are the same rule (Table objects compare by
        # identity).
        return isinstance(other, RetentionRule) and self._names() == other._names()

    def __hash__(self) -> int:
        return hash(self._names())


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
    require_aware(now, "now")
    if retention_days <= 0:
        raise InvalidArgumentError(f"retention_days must be > 0, got {retention_days!r}")
    anchor = now
    if window_end is not None:
        require_aware(window_end, "window_end")
        anchor = min(now, window_end)
    return anchor.astimezone(_UTC) - dt.timedelta(days=retention_days)

