"""A run's copy of a policy's active holds, kept exact by the hold table's change counter.

The hold table's trigger raises its counter (:func:`~favorites_maintenance.retention.holds.
changes_of`) in the transaction of every statement that writes a hold, so a counter read
before a batch that equals the one read with the copy, in the copy's snapshot, means that no
hold was committed since: the batch may test its rows against the copy, and none of its
statements reads the hold table. A counter that moved makes the run read the holds again
before the batch. A hold committed before a batch reads the counter therefore protects its
rows in that batch. A hold table without the counter, or whose trigger is disabled, gets no
copy: its statements read the holds themselves.

This module imports no Dagster.
"""

from __future__ import annotations

import dataclasses
import functools

import sqlalchemy as sa

from favorites_maintenance.retention.catalog_type import CatalogType
from favorites_maintenance.retention.database import BinaryArray
from favorites_maintenance.retention.holds import (
    CHANGES, HELD_VALUE, HoldTable, changes_of, trigger_name)


class HoldCopy:
    """A run's copy of a policy's active holds and the hold table's change counter, read in
    one snapshot: the batches test each row's hold column against the copy, bound to every
    statement as one array (``retention_held``, an array of the column's type in PostgreSQL's
    binary form), which PostgreSQL hashes once a statement, and re-read it whenever the
    counter has moved (:meth:`refresh`), before the batch. Mutable: the statements of a run,
    built once, bind its current copy at each execution.

    Attributes:
        values: the active holds' values as one array of the column's type, in binary form.
        changes: the counter's value when they were read.
        count: how many active holds were read.
    """

    def __init__(self, values: BinaryArray, changes: int, count: int):
        self.values, self.changes, self.count = values, changes, count

    def __repr__(self) -> str:  # never the values: they name rows
        return f"HoldCopy(changes={self.changes}, count={self.count})"

    def bound(self, array_type: str) -> sa.BindParameter:
        """The copy as the statement parameter ``retention_held``, read at each execution."""
        return sa.bindparam("retention_held", callable_=lambda: self.values,
                            type_=CatalogType(array_type))

    def refresh(self, conn: sa.Connection, holds: HoldTable) -> None:
        """Read the counter (one row) and, when it moved, the holds again with it, in one
        statement; the transaction's statements are then planned with the copy's values
        (``plan_cache_mode = force_custom_plan``). When the counter's trigger is no longer
        enabled on the hold table (a write may then leave the counter as it was), the holds
        are read again every time.

        Raises:
            sqlalchemy.exc.DBAPIError: the database refused; ``DataError`` for an active hold
                written since that is not a value of the hold column's type.
        """
        changes, armed, _ = conn.execute(_check_statement(holds.table)).one()
        if changes != self.changes or not armed:
            self.values, self.changes, self.count = _read_copy(conn, holds)


# Built once per hold table: a statement built again each batch is compiled again each batch
# (SQLAlchemy caches a compilation by the statement's tables), about 3 ms.
@functools.lru_cache(maxsize=64)
def _check_statement(hold_table: sa.Table) -> sa.Select:
    """One row: the counter, whether its trigger is armed (:func:`_trigger_enabled`), and
    ``plan_cache_mode`` set for the rest of the transaction."""
    c = changes_of(hold_table)
    # A plan kept for a prepared statement (a URL's prepare_threshold) would see the copy as
    # a parameter, which is not hashed.
    custom = sa.func.set_config("plan_cache_mode", "force_custom_plan", True)
    return sa.select(c.c[CHANGES], _trigger_enabled(hold_table), custom).select_from(c)


def _trigger_enabled(hold_table: sa.Table) -> sa.ColumnElement[bool]:
    """Whether the counter's trigger is on ``hold_table`` and fires for every writer
    (``ENABLE ALWAYS``, as :func:`~favorites_maintenance.retention.holds.
    create_hold_table_sql` leaves it)."""
    qualified = f"{hold_table.schema}.{hold_table.name}"
    t = sa.table("pg_trigger", sa.column("tgrelid"), sa.column("tgname"),
                 sa.column("tgenabled"), schema="pg_catalog")
    # 'A' fires always; 'O' (the default) not in a session_replication_role = replica
    # session, whose writes would leave the counter as it was.
    return sa.select(sa.literal(1)).select_from(t).where(
        t.c.tgrelid == sa.func.to_regclass(sa.literal(qualified, sa.Text)),
        t.c.tgname == sa.literal(trigger_name(hold_table), sa.Text),
        t.c.tgenabled == "A").exists()


def _read_copy(conn: sa.Connection, holds: HoldTable) -> tuple[BinaryArray, int, int]:
    """The active holds as an array of the column's type in binary form, the counter, and
    the holds' count, in one statement (one snapshot)."""
    c = changes_of(holds.table)
    values = sa.select(sa.cast(holds.table.c[HELD_VALUE], CatalogType(holds.column_type))
                       ).where(holds.active()).scalar_subquery()
    held = sa.select(sa.func.array(values).label("held")).subquery("retention_copy")
    data, oid, changes, count = conn.execute(sa.select(
        sa.func.array_send(held.c.held, type_=sa.LargeBinary),
        sa.cast(sa.func.pg_typeof(held.c.held), CatalogType("oid")),
        sa.select(c.c[CHANGES]).scalar_subquery(),
        sa.select(sa.func.count()).where(holds.active()).scalar_subquery())).one()
    return BinaryArray(bytes(data), oid), changes, count


def copy_holds(conn: sa.Connection, holds: HoldTable) -> HoldTable:
    """``holds`` (read in the column's type, :func:`~favorites_maintenance.retention.holds.
    typed_holds`) with a :class:`HoldCopy` of its active holds when the hold table has its
    change counter, readable by the role, and the counter's trigger enabled, and the hold
    column is not an array; else ``holds`` as it is, whose statements read the holds
    themselves.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused (``DataError``: a hold not of the
            column's type, written since the types were checked).
    """
    if holds.column_type is None:
        return holds
    c = changes_of(holds.table)
    qualified = f"{c.schema}.{c.name}"
    pg_type = sa.table("pg_type", sa.column("oid"), sa.column("typcategory"),
                       schema="pg_catalog")
    # An array of arrays is one array of more dimensions, not a list of the holds' values.
    not_an_array = sa.select(pg_type.c.typcategory != "A").where(
        pg_type.c.oid == sa.cast(sa.literal(holds.column_type, sa.Text), CatalogType("regtype"))
    ).scalar_subquery()
    usable = conn.execute(sa.select(
        sa.func.coalesce(sa.func.has_table_privilege(sa.func.to_regclass(qualified), "SELECT"),
                         False), _trigger_enabled(holds.table), not_an_array)).one()
    if not all(usable):
        return holds
    return dataclasses.replace(holds, copy=HoldCopy(*_read_copy(conn, holds)))
