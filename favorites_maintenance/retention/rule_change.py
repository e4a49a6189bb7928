"""What a change of a rule does to a table: the rows the new rule would delete that the old one
keeps, and the rows it stops deleting, counted in one read.

Both rules are on the same table (compare a rule moved to another table or database as the old
one removed and the new one added: :func:`count_prunable` on each). Their predicates are the
project's own (:meth:`~favorites_maintenance.retention.rule.RetentionRule.prunable`), holds
compared as a run's batches compare them (:func:`~favorites_maintenance.retention.holds.
typed_holds`), so what is counted is what a run would delete.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.sql import visitors

from favorites_maintenance.retention.holds import typed_holds
from favorites_maintenance.retention.rule import RetentionRule


@dataclass(frozen=True)
class RuleChange:
    """The difference between two rules on one table, in rows.

    Attributes:
        newly_prunable: rows the new rule admits at its cutoff that the old one keeps at its own.
        no_longer_prunable: rows the old rule admits that the new one keeps.
    """

    newly_prunable: int
    no_longer_prunable: int


def count_rule_change(conn: sa.Connection, old: RetentionRule, old_cutoff: dt.datetime,
                      new: RetentionRule, new_cutoff: dt.datetime) -> RuleChange:
    """Count, in one statement on ``conn``, the rows of the rules' table that one rule admits
    and the other keeps, each at its cutoff (timezone-aware UTC instants).

    A row one predicate cannot decide (a NULL in a compared column) counts as kept by it, as a
    DELETE's ``WHERE`` keeps it.

    Raises:
        ValueError: the rules are on different tables.
        InvalidArgumentError: a hold column that is not a column of the table.
        sqlalchemy.exc.DBAPIError: the table, a column or the hold table cannot be read.
    """
    if (old.table.schema, old.table.name) != (new.table.schema, new.table.name):
        raise ValueError(f"the rules are on different tables: {old.qualified_name} and "
                         f"{new.qualified_name}")
    old, new = _as_batches_compare(conn, old), _as_batches_compare(conn, new)
    # One Table object holding every column either rule reads, so that the two predicates
    # read the same row instead of joining the table to itself.
    names = sorted({c.name for c in (*old.table.columns, *new.table.columns)
                    if not c.system})
    wide = new.with_columns(names)
    new_admits = _rebound(wide.prunable(new_cutoff), wide.table, wide.table, "new")
    old_admits = _rebound(old.prunable(old_cutoff), old.table, wide.table, "old")
    admitted = sa.func.coalesce(new_admits, sa.false())
    was_admitted = sa.func.coalesce(old_admits, sa.false())
    statement = (sa.select(sa.func.count().filter(sa.and_(admitted, sa.not_(was_admitted))),
                           sa.func.count().filter(sa.and_(was_admitted, sa.not_(admitted))))
                 .select_from(wide.table).where(sa.or_(new_admits, old_admits)))
    newly, no_longer = conn.execute(statement).one()
    return RuleChange(newly_prunable=newly, no_longer_prunable=no_longer)


def count_prunable(conn: sa.Connection, rule: RetentionRule, cutoff: dt.datetime) -> int:
    """The rows ``rule`` admits at ``cutoff`` (a timezone-aware instant), in one statement.

    Raises:
        sqlalchemy.exc.DBAPIError: the table or a column cannot be read.
    """
    rule = _as_batches_compare(conn, rule)
    return conn.execute(sa.select(sa.func.count()).select_from(rule.table)
                        .where(rule.prunable(cutoff))).scalar_one()


def _as_batches_compare(conn: sa.Connection, rule: RetentionRule) -> RetentionRule:
    """``rule`` with its holds compared in the key's type when a run's batches would (a hold
    written ``042`` for the bigint 42 keeps its row in a run, so it is not counted)."""
    if rule.hold is None:
        return rule
    return rule.with_hold(typed_holds(conn, rule.hold, rule.qualified_name)[0])


def _rebound(predicate: sa.ColumnElement[bool], source: sa.Table, target: sa.Table,
             prefix: str) -> sa.ColumnElement[bool]:
    """``predicate`` reading ``target``'s columns where it read ``source``'s (by name), its
    bound parameters renamed ``<prefix>_<name>``: two predicates built by the same rule code
    bind the same names (``cutoff``) to different values."""
    def replace(element):
        if isinstance(element, sa.Column) and element.table is source:
            return target.c[element.name]
        if isinstance(element, sa.BindParameter) and not element.unique:
            return sa.bindparam(f"{prefix}_{element.key}", element.value, type_=element.type)
        return None

    return visitors.replacement_traverse(predicate, {}, replace)
