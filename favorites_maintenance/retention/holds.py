"""Holds: rows that no run may delete, whatever their age, until the hold is released.

A policy that names a hold table (its ``hold_table`` setting) prunes a row only while no
*active* hold covers it: a row of the hold table with the policy's name, the row's value of the
hold column (the policy's key unless ``hold_column`` says another column) as text, and no
``released_at``. A run's batches and the counts (the backlog, ``heldRows``, the dry run, the
plan) read the active holds' values as the hold column's type (:func:`typed_holds`); a
statement built without reading that type compares the column cast to text: the same holds
match, as long as they are written as PostgreSQL writes the column's values (what
:func:`place_hold` stores). The test is part of the rule's predicate
(:meth:`~favorites_maintenance.retention.rule.RetentionRule.prunable`), so every statement built
from it carries it: the batches' candidate SELECT *and* their DELETE (as the guard is
repeated), the backlog counts, the partition probes. A hold placed while a run is in flight
therefore protects its row from the next batch on, and in the batch under way from its own
DELETE on. Releasing a hold makes the row prunable again at the next run, by the rule as it
stands. A row covered by several holds stays until every one of them is released.

The hold table (one per database, shared by the policies that name it; each hold belongs to
one policy)::

    hold_id      bigint identity primary key
    policy       text         the policy's name
    held_value   text         the hold column's value, as PostgreSQL writes it as text
    placed_by    text         who placed it
    reason       text         why (a ticket, a case)
    placed_at    timestamptz  when (the database's clock)
    released_at  timestamptz  NULL while the hold is active
    released_by  text         who released it

with a partial index on ``(policy, held_value) WHERE released_at IS NULL``: the purge's
anti-join reads only active holds. Beside it, ``<table>_changes`` holds one counter that a
statement trigger on the hold table (any INSERT, UPDATE, DELETE or TRUNCATE) raises in the
writer's own transaction: a run that read the holds and the counter in one snapshot knows,
from the counter alone, whether any hold was written since (:class:`~favorites_maintenance.retention.hold_copy.HoldCopy`).
:func:`create_hold_table_sql` gives the DDL; the CLI's ``hold init`` runs it (and adds the
counter to a hold table made before it). The application may insert holds itself; a released
hold stays in the table as the record of it.

This module imports no Dagster.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP

from favorites_maintenance.retention.catalog_type import CatalogType
from favorites_maintenance.retention.errors import ErrorKind, InvalidArgumentError, describe
from favorites_maintenance.retention.identifiers import split_table_name

#: The hold table's columns, by role.
HOLD_ID, POLICY, HELD_VALUE = "hold_id", "policy", "held_value"
PLACED_BY, REASON, PLACED_AT = "placed_by", "reason", "placed_at"
RELEASED_AT, RELEASED_BY = "released_at", "released_by"


def hold_table_of(schema: str, name: str) -> sa.Table:
    """The hold table ``schema.name`` as SQLAlchemy sees it (see the module docstring)."""
    return sa.Table(
        name, sa.MetaData(schema=schema),
        sa.Column(HOLD_ID, sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column(POLICY, sa.Text, nullable=False),
        sa.Column(HELD_VALUE, sa.Text, nullable=False),
        sa.Column(PLACED_BY, sa.Text, nullable=False),
        sa.Column(REASON, sa.Text, nullable=False),
        sa.Column(PLACED_AT, TIMESTAMP(timezone=True), nullable=False,
                  server_default=sa.func.now()),
        sa.Column(RELEASED_AT, TIMESTAMP(timezone=True), nullable=True),
        sa.Column(RELEASED_BY, sa.Text, nullable=True),
        sa.CheckConstraint(f"{REASON} <> ''", name=f"{name}_reason_given"),
        sa.Index(f"{name}_active_idx"[:63], POLICY, HELD_VALUE,
                 postgresql_where=sa.text(f"{RELEASED_AT} IS NULL")),
    )


def changes_of(hold_table: sa.Table) -> sa.Table:
    """The change counter of ``hold_table``: ``<table>_changes`` in its schema, one row whose
    ``changes`` (``bigint``) the hold table's trigger raises by one for every statement that
    writes it (see the module docstring)."""
    name = f"{hold_table.name}_changes"[:63]
    return sa.Table(
        name, sa.MetaData(schema=hold_table.schema),
        sa.Column("one", sa.Boolean, primary_key=True, server_default=sa.true()),
        sa.Column(CHANGES, sa.BigInteger, nullable=False, server_default="0"),
        sa.CheckConstraint("one", name=f"{name}_one_row"[:63]),
    )


#: The counter's column, and the name of the hold table's trigger (and its function).
CHANGES = "changes"


def trigger_name(hold_table: sa.Table) -> str:
    """The name of the counter's trigger on ``hold_table``, and of its function."""
    return f"{hold_table.name}_changed"[:63]


@dataclass(frozen=True, eq=False)
class HoldTable:
    """The holds of one policy: which table holds them and which column of the policy's table
    a hold's value matches.

    Attributes:
        table: the hold table (see :func:`hold_table_of`).
        column: the column of the policy's table a hold's ``held_value`` matches.
        policy: the policy's name; only holds with this ``policy`` count.
        column_type: the column's type as the catalog writes it (``bigint``, ``uuid``), once
            read (:func:`typed_holds`): the hold test then reads each active hold's value as
            that type, once a statement, and compares it with the column as it is. ``None``:
            the column is cast to text on every row and compared with the values as text.
        copy: with :attr:`column_type`, the run's copy of the active holds
            (:func:`~favorites_maintenance.retention.hold_copy.copy_holds`): :meth:`uncovered`
            tests the column against it instead of reading the holds. ``None``: every
            statement reads them.
    """

    table: sa.Table
    column: str
    policy: str
    column_type: str | None = None
    copy: Any = None  # a HoldCopy (hold_copy.py, which builds on this module)

    @classmethod
    def define(cls, table: str, column: str, policy: str) -> "HoldTable":
        """The holds of ``policy`` in ``table`` (``schema.table``) on ``column``.

        Raises:
            RuleError: ``table`` is not ``schema.table`` of lower-case identifiers.
        """
        schema, name = split_table_name(table, "hold_table")
        return cls(table=hold_table_of(schema, name), column=column, policy=policy)

    @property
    def qualified_name(self) -> str:
        """``schema.table``, for messages (never for SQL)."""
        return f"{self.table.schema}.{self.table.name}"

    def _names(self) -> tuple:
        return (self.table.schema, self.table.name, self.column, self.policy, self.column_type)

    def typed(self, column_type: str | None) -> "HoldTable":
        """The same holds, compared in ``column_type`` (``None``: as text), without a copy;
        see :func:`typed_holds`, which reads the type and checks that the holds read as it."""
        return dataclasses.replace(self, column_type=column_type, copy=None)

    def _held_values(self) -> sa.Select:
        """The active holds' values: as text, or read as :attr:`column_type`."""
        value = self.table.c[HELD_VALUE]
        if self.column_type is not None:

            value = sa.cast(value, CatalogType(self.column_type))
        return sa.select(value).where(self.active())

    def _as_held(self, column: sa.ColumnElement) -> sa.ColumnElement:
        """``column`` as the held values read: as it is when typed, else cast to text."""
        return column if self.column_type is not None else sa.cast(column, sa.Text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HoldTable) and self._names() == other._names()

    def __hash__(self) -> int:
        return hash(self._names())

    def active(self) -> sa.ColumnElement[bool]:
        """The policy's active holds: ``policy = :name AND released_at IS NULL``."""
        h = self.table.c
        return sa.and_(h[POLICY] == sa.literal(self.policy, sa.Text), h[RELEASED_AT].is_(None))

    def uncovered(self, column: sa.ColumnElement, *, nullable: bool = True
                  ) -> sa.ColumnElement[bool]:
        """No active hold of the policy has ``column``'s value: ``<column> NOT IN (SELECT
        CAST(held_value AS <column_type>) FROM <holds> WHERE <active>)``, or without
        :attr:`column_type` ``<column>::text NOT IN (SELECT held_value ...)``
        (``held_value`` is never NULL, so this is ``NOT EXISTS``), or ``<column> IS NULL``,
        which no hold matches, when ``nullable``.

        Written as ``NOT IN`` so that PostgreSQL tests it as a filter against a hash of the
        active holds built once per statement: the batch's index scan keeps its order and its
        ``LIMIT``, and each row costs a hash probe, where an anti-join would probe the holds'
        index once per row (about 4 times the time per row with 10,000 holds, in the bench).
        Typed, the probe hashes the column's own value instead of writing it as text first.

        Raises (when the statement runs, typed): ``sqlalchemy.exc.DataError`` for an active
        hold whose value is not of the column's type (a hold written since
        :func:`typed_holds` checked them).
        """
        if self.copy is not None and self.column_type is not None:
            return self._not_in_copy(column)
        free = self._as_held(column).not_in(self._held_values())
        return sa.or_(column.is_(None), free) if nullable else free

    def _not_in_copy(self, column: sa.ColumnElement) -> sa.ColumnElement[bool]:
        """``CASE WHEN <column> = ANY(CAST(:retention_held AS <type>[])) THEN false ELSE true
        END``: true for a NULL column too. The array is a constant of the statement's plan,
        which PostgreSQL hashes once a statement; inside ``CASE`` the planner does not estimate
        the selectivity of each of its elements (about 10 to 20 ms of planning with 10,000
        holds, as ``NOT (... = ANY ...)``)."""
        array_type = f"{self.column_type}[]"
        held = column == sa.any_(sa.cast(self.copy.bound(array_type), CatalogType(array_type)))
        return sa.case((held, sa.false()), else_=sa.true())

    def covers(self, column: sa.ColumnElement) -> sa.ColumnElement[bool]:
        """An active hold of the policy has ``column``'s value: ``EXISTS`` one whose value is
        ``column``'s as text (the partial index on the active holds answers each probe), or,
        with :attr:`column_type`, ``<column> IS NOT NULL AND <column> IN (SELECT
        CAST(held_value AS <column_type>) ...)``, the test :meth:`uncovered` negates. Either
        is false, never NULL, for a NULL ``column``, so ``NOT covers`` keeps no such row out.
        """
        if self.column_type is not None:
            return sa.and_(column.is_not(None), column.in_(self._held_values()))
        h = self.table.c
        return sa.select(sa.literal(1)).select_from(self.table).where(
            self.active(), h[HELD_VALUE] == sa.cast(column, sa.Text)).exists()


def create_hold_table_sql(table: str) -> list[str]:
    """The DDL of the hold table ``table`` (``schema.table``): ``CREATE TABLE IF NOT EXISTS``
    and its partial index, its change counter (:func:`changes_of`) with its one row, and the
    trigger that raises it (``CREATE OR REPLACE``, PostgreSQL 14 or later), PostgreSQL text,
    to run in order; each is safe to run again.

    Raises:
        RuleError: ``table`` is not ``schema.table`` of lower-case identifiers.
    """
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex, CreateTable


    t = hold_table_of(*split_table_name(table, "hold_table"))
    c = changes_of(t)
    dialect = postgresql.dialect()
    statements = [str(CreateTable(t, if_not_exists=True).compile(dialect=dialect)).strip()]
    statements += [str(CreateIndex(i, if_not_exists=True).compile(dialect=dialect)).strip()
                   for i in t.indexes]
    statements.append(str(CreateTable(c, if_not_exists=True).compile(dialect=dialect)).strip())
    q = dialect.identifier_preparer
    counter, holds = q.format_table(c), q.format_table(t)
    function = f"{q.quote_schema(t.schema)}.{q.quote(trigger_name(t))}"
    statements += [
        f"INSERT INTO {counter} (one, {CHANGES}) VALUES (true, 0) ON CONFLICT DO NOTHING",
        # The writer's role need not write the counter: the function runs as its owner.
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql "
        f"SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$ BEGIN "
        f"UPDATE {counter} SET {CHANGES} = {CHANGES} + 1; RETURN NULL; END $$",
        # One statement trigger: every write raises it, in the writer's transaction.
        f"CREATE OR REPLACE TRIGGER {q.quote(trigger_name(t))} AFTER INSERT OR UPDATE OR "
        f"DELETE OR TRUNCATE ON {holds} FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
        # Also in a session with session_replication_role = replica, and when a hold arrives
        # by logical replication: no write of a hold leaves the counter as it was.
        f"ALTER TABLE {holds} ENABLE ALWAYS TRIGGER {q.quote(trigger_name(t))}",
    ]
    return statements


def create_hold_table(engine: sa.Engine, table: str) -> None:
    """Create the hold table ``table``, its index, its change counter and the counter's
    trigger where they do not exist (one transaction).

    Raises:
        RuleError: a malformed name.
        sqlalchemy.exc.DBAPIError: the database refused (e.g. no CREATE on the schema).
    """
    with engine.begin() as conn:
        for statement in create_hold_table_sql(table):
            conn.exec_driver_sql(statement)


@dataclass(frozen=True)
class Hold:
    """One hold as the table has it.

    Attributes:
        hold_id: its id.
        held_value: the value it holds (text).
        placed_by, reason: who placed it and why.
        placed_at: when, a UTC instant.
        released_at, released_by: when and by whom it was released; ``None`` while active.
    """

    hold_id: int
    held_value: str
    placed_by: str
    reason: str
    placed_at: dt.datetime
    released_at: dt.datetime | None
    released_by: str | None

    @property
    def active(self) -> bool:
        return self.released_at is None


def place_hold(engine: sa.Engine, holds: HoldTable, value: str, *, reason: str,
               placed_by: str, of_table: str | None = None) -> int:
    """Place a hold of ``holds.policy`` on ``value`` (text, as the hold column's value reads
    cast to text) and return its id. Runs the next run's batches and, from its commit on, the
    DELETE of a batch under way, around the rows it covers.

    With ``of_table`` (the policy's table, ``schema.table``), ``value`` is first read as the
    hold column's type there and stored as PostgreSQL writes that value as text, so that a
    hold typed another way (``042`` for a bigint, an upper-case UUID, an instant in another
    time zone) still covers its row instead of matching none.

    Raises:
        InvalidArgumentError: an empty ``value``, ``reason`` or ``placed_by``; a ``value`` that
            is not of the hold column's type (the value itself is not repeated).
        sqlalchemy.exc.DBAPIError: the database refused (a missing table: run ``hold init``).
    """
    for what, given in (("key", value), ("reason", reason), ("by", placed_by)):
        if not given or not given.strip():
            raise InvalidArgumentError(f"hold {what} must not be empty")
    h = holds.table.c
    with engine.begin() as conn:
        if of_table is not None:
            value = _as_the_column_writes_it(conn, of_table, holds.column, value)
        return conn.execute(sa.insert(holds.table).values({
            POLICY: holds.policy, HELD_VALUE: value, REASON: reason, PLACED_BY: placed_by,
        }).returning(h[HOLD_ID])).scalar_one()


def _column_type(conn: sa.Connection, table: str, column: str, *,
                 modifier: bool = True) -> str:
    """``table.column``'s type as ``format_type`` writes it (SQL that reads as that type);
    without ``modifier``, a type of the same values without a length or precision
    (``character varying`` for ``character varying(5)``, ``bpchar`` for ``character(5)``,
    ``bit varying`` for ``bit(3)``).

    Raises:
        InvalidArgumentError: the column is not found.
    """
    # Written without a length, character and bit read as character(1) and bit(1).
    name = ("format_type(atttypid, atttypmod)" if modifier else
            "CASE atttypid WHEN CAST('bpchar' AS regtype) THEN 'bpchar' "
            "WHEN CAST('bit' AS regtype) THEN 'bit varying' ELSE format_type(atttypid, NULL) END")
    type_name = conn.execute(sa.text(
        f"SELECT {name} FROM pg_attribute "
        "WHERE attrelid = CAST(:t AS regclass) AND attname = :c AND NOT attisdropped"),
        {"t": table, "c": column}).scalar()
    if type_name is None:
        raise InvalidArgumentError(f"hold column {column} is not a column of {table}")
    return type_name


#: What reading a value as a column's type raises when it is not a value of that type: a data
#: exception (``abc`` for a bigint), or a check violation when the type's domain refuses it by
#: a CHECK (an integrity error, though the value is as foreign to the column).
NOT_OF_THE_TYPE = frozenset({ErrorKind.DATA_EXCEPTION, ErrorKind.CHECK_VIOLATION})


def _not_of_the_type(exc: sa.exc.DBAPIError) -> bool:
    """Whether reading a value as a column's type failed because it is not a value of that
    type (:data:`NOT_OF_THE_TYPE`)."""
    return describe(exc).kind in NOT_OF_THE_TYPE


def _as_the_column_writes_it(conn: sa.Connection, table: str, column: str, value: str) -> str:
    """``value`` read as ``table.column``'s type and written back as text (see
    :func:`place_hold`).

    Raises:
        InvalidArgumentError: the column is not found, or ``value`` is not of its type.
    """
    type_name = _column_type(conn, table, column)
    base_type = _column_type(conn, table, column, modifier=False)
    # The types' names come from the catalog, written by format_type as SQL reads them. An
    # explicit cast to varchar(5) or numeric(5, 2) cuts or rounds instead of failing: the
    # value must be the same read with the type's length or precision and without.
    try:
        with conn.begin_nested():
            written, whole = conn.execute(sa.text(
                f"SELECT CAST(CAST(:v AS {type_name}) AS text), "
                f"CAST(:v AS {type_name}) = CAST(:v AS {base_type})"), {"v": value}).one()
    except sa.exc.DBAPIError as exc:
        if not _not_of_the_type(exc):
            raise
        raise InvalidArgumentError(
            f"hold key is not a value of {table}.{column} ({type_name})") from None
    if not whole:
        raise InvalidArgumentError(
            f"hold key does not fit {table}.{column} ({type_name}): the column would keep it "
            "cut or rounded, a value no row has")
    return written


#: How long :func:`a_row_has` may look for a row (a hold column without an index is read
#: whole when no row has the value), milliseconds.
ROW_CHECK_TIMEOUT_MS = 10_000
_NO_PRIVILEGE, _CANCELED = "42501", "57014"
#: Comparing in a type without an equality operator (``json``) fails so.
_NO_EQUALITY = "42883"


def a_row_has(engine: sa.Engine, table: str, column: str, value: str) -> bool | None:
    """Whether a row of ``table`` (``schema.table``) has ``value`` in ``column``, compared in
    the column's own type so that an index on it answers: ``False`` tells a hold that covers
    no row now (a typo, or a row not inserted yet). ``None`` when it cannot tell: the role may
    not read the table, or the search took longer than :data:`ROW_CHECK_TIMEOUT_MS`.

    Raises:
        InvalidArgumentError: the column is not found, or ``value`` is not of its type.
        sqlalchemy.exc.DBAPIError: the database refused otherwise.
    """

    schema, name = split_table_name(table, "table")
    t = sa.table(name, sa.column(column), schema=schema)
    with engine.begin() as conn:
        type_name = _column_type(conn, table, column)
        conn.execute(sa.select(sa.func.set_config("statement_timeout",
                                                  str(ROW_CHECK_TIMEOUT_MS), True)))
        found = sa.select(sa.select(sa.literal(1)).select_from(t).where(
            t.c[column] == sa.cast(sa.bindparam("v", value, sa.Text), CatalogType(type_name))
        ).exists())
        try:
            with conn.begin_nested():
                return conn.execute(found).scalar_one()
        except sa.exc.DBAPIError as exc:
            if _not_of_the_type(exc):
                raise InvalidArgumentError(
                    f"hold key is not a value of {table}.{column} ({type_name})") from None
            if getattr(exc.orig, "sqlstate", None) in (_NO_PRIVILEGE, _CANCELED):
                return None
            raise


def typed_holds(conn: sa.Connection, holds: HoldTable, table: str
                ) -> tuple[HoldTable, str | None]:
    """``holds`` compared in the type of ``table.column`` (``table`` is the policy's,
    ``schema.table``), when every active hold of the policy reads as that type; else
    ``holds`` as text, as before, and a warning to log (counts and the fix, never a value).

    A value that does not read as the type (``abc`` for a bigint, a value its domain's CHECK
    refuses) matches no row either way, nor does one that would be cut or rounded to fit it
    (``abcdeXYZ`` for a ``varchar(5)``), which is therefore not read as the type either;
    one written otherwise than PostgreSQL writes it (``042`` for the bigint ``42``, an
    upper-case UUID) covers its row only when typed, as the batches and the counts compare
    (:func:`~favorites_maintenance.retention.backlog.compared_as_batches`): the warning names
    how many, for :func:`place_hold` to write them again. Runs in the connection's
    transaction, in a savepoint.

    Raises:
        InvalidArgumentError: the column is not a column of ``table``.
        sqlalchemy.exc.DBAPIError: the database refused (no SELECT on the hold table).
    """

    type_name = _column_type(conn, table, holds.column)
    base_type = _column_type(conn, table, holds.column, modifier=False)
    typed = holds.typed(type_name)
    value = holds.table.c[HELD_VALUE]
    read = sa.cast(value, CatalogType(type_name))
    as_written = sa.cast(read, sa.Text)
    # A cast to varchar(5) or numeric(5, 2) cuts or rounds instead of failing (as in
    # place_hold): such a hold would keep a row it does not name.
    cut = read != sa.cast(value, CatalogType(base_type))
    try:
        with conn.begin_nested():
            unlike, cut_or_rounded = conn.execute(sa.select(
                sa.func.count().filter(value != as_written), sa.func.count().filter(cut)
            ).where(holds.active())).one()
    except sa.exc.DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) == _NO_EQUALITY:
            return holds.typed(None), (
                f"{table}.{holds.column} ({type_name}) has no equality operator: the hold "
                "test compares the values as text")
        if not _not_of_the_type(exc):
            raise
        return holds.typed(None), (
            f"an active hold of policy {holds.policy} in {holds.qualified_name} is not a value "
            f"of {table}.{holds.column} ({type_name}): it covers no row, and the hold test "
            "compares the values as text for this run (slower per row); find it with "
            f"hold list --policy {holds.policy} --show-keys, release it and place it again "
            "with hold place, which checks the value")
    if cut_or_rounded:
        return holds.typed(None), (
            f"an active hold of policy {holds.policy} in {holds.qualified_name} does not fit "
            f"{table}.{holds.column} ({type_name}): read as it, the value would be cut or "
            "rounded to one it does not name, and the hold test compares the values as text "
            f"for this run (slower per row); find it with hold list --policy {holds.policy} "
            "--show-keys, release it and place it again with hold place, which checks the value")
    if unlike:
        return typed, (
            f"{unlike} active hold(s) of policy {holds.policy} in {holds.qualified_name} are "
            f"not written as PostgreSQL writes {type_name}: read as it, they keep their rows, "
            "but a reader comparing text misses them; place holds with hold place, which "
            "writes them so")
    return typed, None


def count_holds_matching_no_row(conn: sa.Connection, holds: HoldTable, table: str
                                ) -> int | None:
    """How many active holds of ``holds.policy`` no row of ``table`` (``schema.table``, the
    policy's) has the value of, compared in the hold column's type (an index on the column
    answers each): holds that keep nothing now, a typo or a row still to come. ``None`` when
    it cannot tell within :data:`ROW_CHECK_TIMEOUT_MS`, a hold is not of the column's type,
    or the type has no equality (``json``). Runs in the connection's transaction, in a
    savepoint.

    Raises:
        InvalidArgumentError: the column is not a column of ``table``.
        sqlalchemy.exc.DBAPIError: the database refused otherwise (no SELECT on a column).
    """

    schema, name = split_table_name(table, "table")
    t = sa.table(name, sa.column(holds.column), schema=schema)
    type_name = _column_type(conn, table, holds.column)
    held = sa.cast(holds.table.c[HELD_VALUE], CatalogType(type_name))
    unmatched = sa.select(sa.func.count()).select_from(holds.table).where(
        holds.active(),
        ~sa.select(sa.literal(1)).select_from(t).where(t.c[holds.column] == held).exists())
    previous = conn.execute(sa.select(sa.func.current_setting("statement_timeout"))).scalar()
    try:
        with conn.begin_nested():
            conn.execute(sa.select(sa.func.set_config(
                "statement_timeout", str(ROW_CHECK_TIMEOUT_MS), True)))
            count = conn.execute(unmatched).scalar_one()
            # Released with the savepoint, the setting would last to the transaction's end.
            conn.execute(sa.select(sa.func.set_config("statement_timeout", previous, True)))
            return count
    except sa.exc.DBAPIError as exc:
        # A lost connection has no SQLSTATE (None).
        if _not_of_the_type(exc) or getattr(exc.orig, "sqlstate", None) in (_CANCELED,
                                                                            _NO_EQUALITY):
            return None
        raise


def release_hold(engine: sa.Engine, holds: HoldTable, hold_id: int, *, released_by: str) -> bool:
    """Release the active hold ``hold_id`` of ``holds.policy``; ``False`` when there is no
    such active hold (unknown, another policy's, or released already). The rows it covered
    are prunable again at the next run unless another active hold covers them.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused.
    """
    h = holds.table.c
    with engine.begin() as conn:
        return conn.execute(sa.update(holds.table).where(
            h[HOLD_ID] == hold_id, holds.active()).values({
                RELEASED_AT: sa.func.now(), RELEASED_BY: released_by})).rowcount == 1


def list_holds(engine: sa.Engine, holds: HoldTable, *, include_released: bool = False
               ) -> list[Hold]:
    """The holds of ``holds.policy``, oldest first; only the active ones unless
    ``include_released``.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused.
    """
    h = holds.table.c
    where = [h[POLICY] == holds.policy] + ([] if include_released else [h[RELEASED_AT].is_(None)])
    with engine.connect() as conn:
        rows = conn.execute(sa.select(h[HOLD_ID], h[HELD_VALUE], h[PLACED_BY], h[REASON],
                                      h[PLACED_AT], h[RELEASED_AT], h[RELEASED_BY])
                            .where(*where).order_by(h[PLACED_AT], h[HOLD_ID])).all()
    return [Hold(*row) for row in rows]


@dataclass(frozen=True)
class HoldSummary:
    """A policy's active holds, in figures (never a held value).

    Attributes:
        active: active holds of the policy.
        oldest_placed_at: ``placed_at`` of the oldest of them, a UTC instant, or ``None``.
        now: the database's clock when read, a UTC instant.
    """

    active: int
    oldest_placed_at: dt.datetime | None
    now: dt.datetime

    @property
    def oldest_age_s(self) -> float:
        """How long the oldest active hold has stood, seconds (0 with none)."""
        if self.oldest_placed_at is None:
            return 0.0
        return max((self.now - self.oldest_placed_at).total_seconds(), 0.0)


def summarize_holds(conn: sa.Connection, holds: HoldTable) -> HoldSummary:
    """Count ``holds.policy``'s active holds and read the oldest one's ``placed_at``, in the
    connection's transaction (the partial index on active holds serves it).

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused (a missing table, no grant).
    """
    h = holds.table.c
    active, oldest, now = conn.execute(
        sa.select(sa.func.count(), sa.func.min(h[PLACED_AT]), sa.func.now())
        .where(holds.active())).one()
    return HoldSummary(active=active, oldest_placed_at=oldest.astimezone(dt.UTC) if oldest
                       else None, now=now.astimezone(dt.UTC))
