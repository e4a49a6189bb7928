"""A policy's archive: the table its purge moves deleted rows into, and how long they stay.

With an archive (a policy's ``archive_table``), each batch statement deletes its rows and inserts
them into the archive in the same statement, so in the same transaction::

    WITH retention_batch AS MATERIALIZED (SELECT ctid, id, updated_at ... FOR UPDATE SKIP LOCKED),
    retention_deleted AS (
        DELETE FROM favorites.favorites USING retention_batch WHERE <guard, cutoff, address>
        RETURNING <every column of the table>),
    retention_archived AS (
        INSERT INTO <archive> (<every column>, _retention_run_id, _retention_policy,
                               _retention_archived_at)
        SELECT <every column>, :archive_run_id, :archive_policy, now() FROM retention_deleted
        RETURNING 1)
    SELECT <rows in batch>, (SELECT count(*) FROM retention_archived), <last position>

A row is then either in the table or in the archive, never both and never neither, whatever
fails and whenever the run is killed: the batch commits or rolls back whole. The values never
leave the server. :meth:`Archive.move` is the one place a batch's ``DELETE ... RETURNING``
becomes that move (every batch form reaches it through
:func:`~favorites_maintenance.retention.statements.removed_rows`).

The archive holds every column of the row as it was (same names, same types), plus three
columns whose names start with ``_retention_``: the run that archived it, the policy, and the
instant (the database's ``now()`` at the batch's transaction). A table column bearing one of
those names is refused at the first run, before any delete.

Before the first batch the run reads the table's columns from the catalog and:

- creates a missing archive: those columns and types, no constraint that could refuse a row (no
  key, no ``NOT NULL`` but on its own three columns, no check, no foreign key, no default), and
  one BRIN index on its three columns, which finds the rows of a run and those past the
  retention (the rows arrive in archiving order) at almost no cost per insert;
- refuses an existing archive that is not a table, lacks a column, has a column the table has
  not, has a column of another type, or has a constraint (a key, a unique index, a check, a
  foreign key, ``NOT NULL`` where the table allows NULL) that could refuse an archived row,
  naming the column or constraint and the fix.

Each batch then reads the table's columns once more, after its statement (which holds the
table's lock, so no migration can commit in between): a column added, dropped or retyped since
the check rolls the batch back and ends the run, so a column added during a run is never left
out of the archived rows.

:func:`prune_archive` deletes the policy's archived rows older than its ``archive_retention_days``
(by ``_retention_archived_at``), in batches, after the main purge.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.dml import Insert

from favorites_maintenance.retention.database import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    limit_transaction,
)
from favorites_maintenance.retention.errors import (
    ArchiveError,
    ArchivePruneError,
    ErrorKind,
    InvalidArgumentError,
    describe,
)
from favorites_maintenance.retention.rule import RetentionRule, split_table_name

log = logging.getLogger("favorites_maintenance.retention.purge")

#: The archive's own columns: the run that archived a row, the policy, the instant.
RUN_ID_COLUMN = "_retention_run_id"
POLICY_COLUMN = "_retention_policy"
ARCHIVED_AT_COLUMN = "_retention_archived_at"
#: Their types, as ``format_type`` names them.
ARCHIVE_COLUMNS = {RUN_ID_COLUMN: "text", POLICY_COLUMN: "text",
                   ARCHIVED_AT_COLUMN: "timestamp with time zone"}


@dataclass(frozen=True)
class ArchiveTarget:
    """Where a purge moves the rows it deletes, and what it stamps on each.

    Attributes:
        table: the archive, ``schema.table`` (lower-case SQL identifiers).
        policy: the policy's name (``_retention_policy``).
        run_id: the run's id (``_retention_run_id``): the Dagster run id in the job.

    Raises:
        InvalidArgumentError: ``table`` is not ``schema.table`` of identifiers, or ``policy``
            or ``run_id`` is empty.
    """

    table: str
    policy: str
    run_id: str

    def __post_init__(self):
        split_table_name(self.table, "archive_table")
        if not self.policy or not self.run_id:
            raise InvalidArgumentError("an archive target needs a policy and a run id")

    @property
    def schema(self) -> str:
        return self.table.partition(".")[0]

    @property
    def name(self) -> str:
        return self.table.partition(".")[2]


@dataclass(frozen=True)
class TableColumn:
    """One column of a table as the catalog gives it.

    Attributes:
        name: the column's name.
        type: its type as ``format_type`` writes it (``bigint``, ``text[]``, ``numeric(10,2)``,
            ``jsonb``, a schema-qualified type when not on the search path).
        not_null: whether it is ``NOT NULL``.
        generated: whether it is a generated column (``GENERATED ALWAYS AS (...) STORED``):
            archived as a value, recomputed by the table on restore.
        identity_always: whether it is ``GENERATED ALWAYS AS IDENTITY``.
        expression: a generated column's expression as the server writes it back
            (``pg_get_expr``), else ``None``.
    """

    name: str
    type: str
    not_null: bool = False
    generated: bool = False
    identity_always: bool = False
    expression: str | None = None


#: Every column of ``:t`` (``schema.table``) in order; no row for a missing table.
_COLUMNS = sa.text(
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
    "       a.attgenerated <> '', a.attidentity = 'a', "
    "       CASE WHEN a.attgenerated <> '' THEN pg_get_expr(d.adbin, d.adrelid) END "
    "  FROM pg_attribute a LEFT JOIN pg_attrdef d "
    "       ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
    " WHERE a.attrelid = to_regclass(:t) AND a.attnum > 0 "
    "   AND NOT a.attisdropped ORDER BY a.attnum")

#: The relation's kind (``r`` table, ``p`` partitioned table, ...), or no row.
_RELKIND = sa.text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)")

#: Constraints and unique indexes of ``:t`` that could refuse an inserted row: name, kind.
_REFUSING = sa.text(
    "SELECT conname, CASE contype WHEN 'p' THEN 'primary key' WHEN 'u' THEN 'unique' "
    "       WHEN 'c' THEN 'check' WHEN 'f' THEN 'foreign key' ELSE 'exclusion' END "
    "  FROM pg_constraint WHERE conrelid = to_regclass(:t) AND contype IN ('p','u','c','f','x') "
    "UNION ALL "
    "SELECT c.relname, 'unique index' FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    " WHERE i.indrelid = to_regclass(:t) AND i.indisunique AND NOT EXISTS ("
    "       SELECT 1 FROM pg_constraint WHERE conindid = i.indexrelid) "
    "ORDER BY 1")


def table_columns(conn: sa.Connection, table: str) -> tuple[TableColumn, ...] | None:
    """Every column of ``table`` (``schema.table``), in order; ``None`` when it does not exist
    (or this role cannot see it). One catalog read."""
    rows = conn.execute(_COLUMNS, {"t": table}).all()
    if not rows:
        exists = conn.execute(_RELKIND, {"t": table}).first()
        return None if exists is None else ()
    return tuple(TableColumn(*row) for row in rows)


class CatalogType(sa.types.UserDefinedType):
    """A column type as the catalog's ``format_type`` names it, rendered as such in DDL: the
    archive's columns take the table's types exactly (arrays, ``numeric(p,s)``, domains,
    enums), whatever SQLAlchemy knows of them. The text is the server's, never a policy's."""

    cache_ok = True

    def __init__(self, spec: str):
        self.spec = spec

    def get_col_spec(self, **kw) -> str:
        return self.spec


class InsertOverridingSystemValue(Insert):
    """``INSERT INTO t (<columns>) OVERRIDING SYSTEM VALUE SELECT ...``: writes the given value
    of a ``GENERATED ALWAYS`` identity column (PostgreSQL refuses it otherwise, SQLSTATE
    428C9). Only for ``insert(...).from_select(...)``."""

    inherit_cache = True


@compiles(InsertOverridingSystemValue)
def _insert_overriding(element, compiler, **kw):
    text = compiler.visit_insert(element, **kw)
    # After the statement's own "INSERT INTO <table> (": its column list is the first
    # parenthesis closed before the SELECT (a WITH in front may hold other parentheses).
    into = f"INSERT INTO {compiler.preparer.format_table(element.table)} ("
    start = text.find(into)
    head, found, tail = text[start:].partition(") SELECT ")
    if start < 0 or not found:
        raise sa.exc.CompileError("OVERRIDING SYSTEM VALUE needs INSERT ... SELECT")
    return f"{text[:start]}{head}) OVERRIDING SYSTEM VALUE SELECT {tail}"


def archive_table(target: ArchiveTarget, columns: tuple[TableColumn, ...]) -> sa.Table:
    """The archive of ``target`` as a ``Table``: ``columns`` (the table's, every one nullable,
    no default), the three archive columns, the system columns ``ctid`` and ``tableoid`` (a
    row's address is only unique with its partition's), and its index (BRIN, on the three)."""
    t = sa.Table(
        target.name, sa.MetaData(schema=target.schema),
        *(sa.Column(c.name, CatalogType(c.type), nullable=True) for c in columns),
        sa.Column(RUN_ID_COLUMN, sa.Text, nullable=False),
        sa.Column(POLICY_COLUMN, sa.Text, nullable=False),
        sa.Column(ARCHIVED_AT_COLUMN, TIMESTAMP(timezone=True), nullable=False),
        sa.Column("ctid", sa.types.NullType(), system=True),
        sa.Column("tableoid", sa.types.NullType(), system=True),
    )
    # Rows arrive in the order they are archived and are never updated, so a BRIN index (a
    # summary per range of pages) finds a run's rows and the rows past the retention at
    # almost no cost per insert; a B-tree on the same columns made each move cost 2.5 times
    # the purge alone, a BRIN one 1.7 times ("favorites-maintenance bench", A_archive).
    sa.Index(f"{target.name}_brin_idx"[:63], t.c[POLICY_COLUMN], t.c[RUN_ID_COLUMN],
             t.c[ARCHIVED_AT_COLUMN], postgresql_using="brin",
             postgresql_with={"autosummarize": "on"})
    return t


def create_archive_sql(target: ArchiveTarget, columns: tuple[TableColumn, ...],
                       dialect: sa.Dialect) -> str:
    """The DDL of the archive of ``target`` for a table of ``columns``, as the run creates it:
    for an owner who creates the archive for a role that may not (``CREATE TABLE``, then its
    index; statements separated by ``;``)."""
    t = archive_table(target, columns)
    return ";\n".join([str(sa.schema.CreateTable(t).compile(dialect=dialect)).strip(),
                       *(str(sa.schema.CreateIndex(ix).compile(dialect=dialect))
                         for ix in sorted(t.indexes, key=lambda ix: ix.name))]) + ";"


@dataclass(frozen=True)
class Archive:
    """An archive checked against its table before the first batch (:func:`prepare_archive`).

    Attributes:
        target: the archive, the policy and the run.
        table: the archive as a ``Table`` (every column of the source, the archive's three,
            ``ctid`` and ``tableoid``).
        source_rule: the rule over its table with every column, for the batch statements
            (:meth:`~favorites_maintenance.retention.rule.RetentionRule.with_columns`).
        columns: the table's columns as checked.
        computed: columns the archive computes itself, by the table's own expression (an
            archive made with ``LIKE ... INCLUDING GENERATED``): not written, as PostgreSQL
            refuses a value for them.
        overriding: the archive has a ``GENERATED ALWAYS`` identity column (``LIKE ...
            INCLUDING IDENTITY``): its rows are written ``OVERRIDING SYSTEM VALUE``, with the
            archived row's value.
    """

    target: ArchiveTarget
    table: sa.Table
    source_rule: RetentionRule
    columns: tuple[TableColumn, ...]
    computed: frozenset[str] = frozenset()
    overriding: bool = False

    def move(self, delete: sa.Delete) -> sa.CTE:
        """The batch's ``delete`` (of :attr:`source_rule`'s table) turned into a move to the
        archive: a CTE ``retention_archived`` with one row per row moved, in place of the
        ``DELETE ... RETURNING 1`` of a purge without an archive. ``:archive_run_id`` and
        ``:archive_policy`` are bound with the target's values."""
        return self.insert_moved(delete).returning(sa.literal_column("1")).cte(
            "retention_archived")

    def insert_moved(self, delete: sa.Delete) -> sa.Insert:
        """The move of :meth:`move` as a statement of its own: ``WITH retention_deleted AS
        (DELETE ... RETURNING <columns>) INSERT INTO <archive> SELECT ...``, whose row count
        is the rows moved (an optimistic batch's second statement: without ``RETURNING``
        and a count over it, a tenth less time for 100,000 rows)."""
        names = [c.name for c in self.columns if c.name not in self.computed]
        source = delete.table
        deleted = delete.returning(*(source.c[n] for n in names)).cte("retention_deleted")
        stamped = sa.select(
            *(deleted.c[n] for n in names),
            sa.bindparam("archive_run_id", self.target.run_id, type_=sa.Text),
            sa.bindparam("archive_policy", self.target.policy, type_=sa.Text),
            sa.func.now())
        insert = InsertOverridingSystemValue if self.overriding else Insert
        return insert(self.table).from_select(
            [*names, RUN_ID_COLUMN, POLICY_COLUMN, ARCHIVED_AT_COLUMN], stamped)

    def check_unchanged(self, conn: sa.Connection) -> None:
        """Inside a batch transaction, after its statement: raise :class:`ArchiveError` (the
        batch rolls back) when the table's columns changed since :func:`prepare_archive`."""
        now = table_columns(conn, self.source_rule.qualified_name) or ()
        if _shape(now) == _shape(self.columns):
            return
        before, after = dict(_shape(self.columns)), dict(_shape(now))
        changed = sorted(set(before.items()) ^ set(after.items()))
        column = changed[0][0] if changed else None
        raise ArchiveError(
            f"the columns of {self.source_rule.qualified_name} changed during the run "
            f"(column {column!r}): the batch was rolled back and no batch follows, so that no "
            f"row reaches {self.target.table} without a column. The next run checks the "
            "archive against the table again", column)


def _shape(columns: tuple[TableColumn, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((c.name, c.type) for c in columns)


def prepare_archive(conn: sa.Connection, rule: RetentionRule, target: ArchiveTarget) -> Archive:
    """Check ``target``'s archive against ``rule``'s table, creating it when it is missing, in
    the connection's open transaction (see the module docstring); nothing is deleted.

    Raises:
        ArchiveError: a table column named like an archive column, an archive that does not
            match (named column or constraint), or one that is missing and cannot be created
            (this role may not, or its schema does not exist), with the DDL to run instead.
        sqlalchemy.exc.DBAPIError: a catalog read failed.
    """
    if target.table == rule.qualified_name:
        raise ArchiveError(f"archive_table {target.table} is the policy's own table")
    source = table_columns(conn, rule.qualified_name) or ()
    for column in source:
        if column.name in ARCHIVE_COLUMNS:
            raise ArchiveError(
                f"{rule.qualified_name} has a column {column.name!r}, the name of a column the "
                f"archive {target.table} keeps for itself ({', '.join(ARCHIVE_COLUMNS)}): an "
                "archived row could not tell them apart. Nothing was deleted", column.name)
    existing = table_columns(conn, target.table)
    archive = Archive(target, archive_table(target, source),
                      rule.with_columns([c.name for c in source]), source)
    if existing is None:
        _create(conn, archive, rule)
        return archive
    return check_archive(conn, archive, rule, existing)


def _create(conn: sa.Connection, archive: Archive, rule: RetentionRule) -> None:
    target = archive.target
    try:
        with conn.begin_nested():
            conn.execute(sa.schema.CreateTable(archive.table, if_not_exists=True))
            for index in sorted(archive.table.indexes, key=lambda ix: ix.name):
                conn.execute(sa.schema.CreateIndex(index, if_not_exists=True))
    except sa.exc.DBAPIError as exc:
        error = describe(exc)
        why = ("its schema does not exist" if error.kind is ErrorKind.UNDEFINED_SCHEMA
               else "this role may not create it" if error.kind is ErrorKind.PERMISSION_DENIED
               else f"creating it failed: {error}")
        raise ArchiveError(
            f"archive {target.table} does not exist and {why}. Nothing was deleted. Create it "
            f"as the table's owner (docs/archive.md, \"Privileges\"), then grant the job's role "
            f"SELECT, INSERT and DELETE on it:\n"
            f"{create_archive_sql(target, archive.columns, conn.dialect)}") from None
    log.info("created the archive %s (the columns of %s, and the archive's own %s)",
             target.table, rule.qualified_name, ", ".join(ARCHIVE_COLUMNS))


def check_archive(conn: sa.Connection, archive: Archive, rule: RetentionRule,
                  existing: tuple[TableColumn, ...]) -> Archive:
    """Refuse an existing archive (of columns ``existing``) that does not match ``rule``'s
    table: see the module docstring. Returns ``archive`` set to write what the archive's
    columns take: its generated columns computed by the table's own expression left to it
    (:attr:`Archive.computed`), its ``GENERATED ALWAYS`` identity overridden
    (:attr:`Archive.overriding`).

    Raises:
        ArchiveError: naming the column or constraint at fault and the fix.
    """
    target, source = archive.target.table, rule.qualified_name
    quote = conn.dialect.identifier_preparer.quote
    kind = conn.execute(_RELKIND, {"t": target}).scalar()
    if kind not in ("r", "p"):
        raise ArchiveError(f"archive {target} is not a table; point archive_table at a table "
                           "(or at a name the run may create)")
    have = {c.name: c for c in existing}
    for column in archive.columns:
        found = have.get(column.name)
        if found is None:
            raise ArchiveError(
                f"archive {target} has no column {column.name!r} ({column.type}), which "
                f"{source} has: an archived row would lose it. Nothing was deleted. Fix: "
                f"ALTER TABLE {target} ADD COLUMN {quote(column.name)} {column.type}",
                column.name)
        if found.type != column.type:
            raise ArchiveError(
                f"archive {target} column {column.name!r} is {found.type}, but {source}'s is "
                f"{column.type}: an archived row would not keep its value as it was. Nothing "
                f"was deleted. Fix: ALTER TABLE {target} ALTER COLUMN {quote(column.name)} "
                f"TYPE {column.type}", column.name)
        if found.not_null and not column.not_null:
            raise ArchiveError(
                f"archive {target} column {column.name!r} is NOT NULL, but {source}'s is not: "
                f"it could refuse an archived row. Nothing was deleted. Fix: ALTER TABLE "
                f"{target} ALTER COLUMN {quote(column.name)} DROP NOT NULL", column.name)
    for name, type_ in ARCHIVE_COLUMNS.items():
        found = have.get(name)
        if found is None or found.type != type_:
            raise ArchiveError(
                f"archive {target} has no column {name} {type_}, which the archive keeps for "
                f"the run, the policy and the instant of each row. Nothing was deleted. Fix: "
                f"ALTER TABLE {target} ADD COLUMN {name} {type_}", name)
    extra = [c.name for c in existing
             if c.name not in ARCHIVE_COLUMNS and c.name not in {s.name for s in archive.columns}]
    if extra:
        raise ArchiveError(
            f"archive {target} has a column {extra[0]!r} that {source} has not: the archive's "
            f"columns must be the table's (and the archive's own three). Nothing was deleted. "
            f"Fix: drop it from the archive, or add it to the table", extra[0])
    refusing = conn.execute(_REFUSING, {"t": target}).first()
    if refusing is not None:
        name, what = refusing
        raise ArchiveError(
            f"archive {target} has a {what} constraint {name!r}, which could refuse an archived "
            f"row (a key deleted, inserted again and deleted again is archived twice). Nothing "
            f"was deleted. Fix: drop it")
    computed = _computed_alike(archive, existing, source, quote)
    return dataclasses.replace(archive, computed=computed,
                               overriding=any(c.identity_always for c in existing))


def _computed_alike(archive: Archive, existing: tuple[TableColumn, ...], source: str,
                    quote: Callable[[str], str]) -> frozenset[str]:
    """The archive's generated columns, each computed by the expression of the table's column
    of that name, which then computes the value the row had; any other is refused."""
    target = archive.target.table
    table = {c.name: c for c in archive.columns}
    for column in existing:
        if not column.generated:
            continue
        of_table = table.get(column.name)
        if of_table is not None and of_table.expression == column.expression:
            continue
        why = ("it holds what the purge writes" if of_table is None
               else f"{source}'s is not" if not of_table.generated
               else f"{source}'s is generated otherwise (GENERATED ALWAYS AS "
                    f"({of_table.expression}) STORED)")
        raise ArchiveError(
            f"archive {target} column {column.name!r} is generated (GENERATED ALWAYS AS "
            f"({column.expression}) STORED), but {why}: the archive would compute a value of "
            f"its own in place of the row's. Nothing was deleted. Fix: ALTER TABLE {target} "
            f"ALTER COLUMN {quote(column.name)} DROP EXPRESSION", column.name)
    return frozenset(c.name for c in existing if c.generated)


# --- The archive's retention ---------------------------------------------------------------


@dataclass(frozen=True)
class ArchivePruneReport:
    """What deleting archived rows past the archive's retention did.

    Attributes:
        deleted_total: archived rows deleted (metadata ``archiveDeletedTotal``).
        batches: batch transactions that deleted rows.
        rows: the policy's rows left in the archive (metadata ``archiveRows``).
        duration_s: wall time, seconds.
        stopped: whether it stopped on the time budget or a stop request with rows left.
    """

    deleted_total: int
    batches: int
    rows: int
    duration_s: float
    stopped: bool = False


def _prune_statement(target_table: str) -> sa.Select:
    schema, name = split_table_name(target_table, "archive_table")
    t = sa.Table(name, sa.MetaData(schema=schema),
                 sa.Column(POLICY_COLUMN, sa.Text),
                 sa.Column(ARCHIVED_AT_COLUMN, TIMESTAMP(timezone=True)),
                 sa.Column("ctid", sa.types.NullType(), system=True),
                 sa.Column("tableoid", sa.types.NullType(), system=True))
    # The database's clock, the one that stamped the rows.
    old = sa.and_(t.c[POLICY_COLUMN] == sa.bindparam("policy", type_=sa.Text),
                  t.c[ARCHIVED_AT_COLUMN] < sa.func.now() - sa.bindparam("keep",
                                                                          type_=sa.Interval))
    # In no order: every row past the retention goes, and an order would sort them all per
    # batch (the archive's index is a BRIN one).
    batch = (sa.select(t.c.tableoid, t.c.ctid).where(old)
             .limit(sa.bindparam("batch_size", type_=sa.Integer, literal_execute=True))
             .cte("archive_batch").prefix_with("MATERIALIZED"))
    # Archived rows are never updated: the address read in this statement names the row, with
    # its partition's (each partition of an archive numbers its addresses from the start).
    deleted = (sa.delete(t).where(t.c.tableoid == batch.c.tableoid, t.c.ctid == batch.c.ctid,
                                  old)
               .returning(sa.literal_column("1")).cte("archive_deleted"))
    return sa.select(
        sa.select(sa.func.count()).select_from(batch).scalar_subquery().label("selected"),
        sa.select(sa.func.count()).select_from(deleted).scalar_subquery().label("deleted"))


def archive_rows_statement(target_table: str) -> sa.Select:
    """``SELECT count(*)`` of one policy's archived rows (``:policy`` bound)."""
    schema, name = split_table_name(target_table, "archive_table")
    t = sa.Table(name, sa.MetaData(schema=schema), sa.Column(POLICY_COLUMN, sa.Text))
    return sa.select(sa.func.count()).select_from(t).where(
        t.c[POLICY_COLUMN] == sa.bindparam("policy", type_=sa.Text))


def prune_archive(engine: sa.Engine, table: str, policy: str, retention_days: int, *,
                  batch_size: int, max_duration: dt.timedelta,
                  should_stop: Callable[[], bool] = lambda: False,
                  lock_timeout: dt.timedelta = DEFAULT_LOCK_TIMEOUT,
                  statement_timeout: dt.timedelta = DEFAULT_STATEMENT_TIMEOUT,
                  ) -> ArchivePruneReport:
    """Delete ``policy``'s rows of archive ``table`` archived more than ``retention_days`` ago
    (by the database's clock), at most ``batch_size`` rows a transaction, then
    count the policy's rows left. A missing archive has nothing to delete.

    At least one batch runs; after it, the purge stops on ``should_stop`` or once
    ``max_duration`` has passed (the rows left wait for the next run).

    Raises:
        ArchivePruneError: a batch failed (rolled back); earlier batches stay committed.
        InvalidArgumentError: ``batch_size`` or ``retention_days`` not > 0.
    """
    if batch_size <= 0 or retention_days <= 0:
        raise InvalidArgumentError("batch_size and retention_days must be > 0")
    started = time.monotonic()
    statement = _prune_statement(table)
    params = {"policy": policy, "keep": dt.timedelta(days=retention_days),
              "batch_size": batch_size}
    deleted = batches = 0
    stopped = False
    try:
        with engine.connect() as conn:
            with conn.begin():
                missing = conn.execute(_RELKIND, {"t": table}).first() is None
            while not missing:
                with conn.begin():
                    limit_transaction(conn, lock_timeout=lock_timeout,
                                      statement_timeout=statement_timeout,
                                      synchronous_commit=False)
                    row = conn.execute(statement, params).one()
                deleted += row.deleted
                batches += 1 if row.deleted else 0
                if row.selected < batch_size:
                    break
                if should_stop() or time.monotonic() - started >= max_duration.total_seconds():
                    stopped = True
                    break
            with conn.begin():
                rows = 0 if missing else conn.execute(archive_rows_statement(table),
                                                      {"policy": policy}).scalar_one()
    except sa.exc.DBAPIError as exc:
        error = describe(exc)
        log.warning("deleting archived rows of %s past its retention failed: %s", table, error)
        raise ArchivePruneError(table, deleted, error) from None
    if deleted:
        log.info("deleted %d rows of the archive %s archived more than %d days ago",
                 deleted, table, retention_days)
    return ArchivePruneReport(deleted_total=deleted, batches=batches, rows=rows,
                              duration_s=time.monotonic() - started, stopped=stopped)
