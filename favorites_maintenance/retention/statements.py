"""Every SQL statement the purge runs, built from the :class:`~favorites_maintenance.retention.
rule.RetentionRule` with SQLAlchemy Core. Nothing here executes a statement except the
one-row reads of the session and the catalogs (:func:`assert_primary`,
:func:`assert_triggers_fire`, :func:`check_session`, :func:`table_shape`, :func:`table_facts`).

A batch that *locks first* is one statement, shown here for the guest-favorites rule (another
rule names its own table, key, age and guard columns)::

    WITH retention_batch AS MATERIALIZED (
        SELECT ctid, id, updated_at FROM favorites.favorites
         WHERE user_id IS NULL AND updated_at < :cutoff
           AND updated_at >= :after_age                               -- keyset, after batch 1
           AND (updated_at, id) > (:after_age, :after_key)
         ORDER BY updated_at, id LIMIT :batch_size
           FOR UPDATE SKIP LOCKED),
    retention_deleted AS (
        DELETE FROM favorites.favorites USING retention_batch
         WHERE user_id IS NULL AND updated_at < :cutoff
           AND favorites.ctid = retention_batch.ctid AND favorites.id = retention_batch.id
        RETURNING 1)
    SELECT <rows in batch>, (SELECT count(*) FROM retention_deleted),
           <last (updated_at, id) of batch>

- ``MATERIALIZED`` evaluates the candidate SELECT exactly once, so the DELETE cannot re-run a
  ``LIMIT`` subquery and take more than ``batch_size`` rows; the DELETE repeats the guard and the
  cutoff (defence in depth).
- The DELETE reaches the batch's rows by their ``ctid`` (row address) with a TID scan, not by a
  primary-key index descent per row, and checks the primary key as well: never a bare ``ctid``.
  The address is stable because the rows are locked by this very transaction: no one can
  update, delete or move them before the DELETE (unlike an unlocked
  ``ctid IN (SELECT ...)``). On a
  partitioned table, where addresses repeat across partitions, or for a role without ``SELECT``
  on ``ctid`` (the least-privilege role of ``least_privilege.sql`` grants three columns), the
  DELETE matches by primary key instead.
- ``SKIP LOCKED`` lets N purges (or a purge and user transactions) run side by side: each takes
  rows nobody else holds, so no row is deleted twice and nobody waits.
- The keyset ``(updated_at, id) > last`` starts each batch past the previous one, so the index
  scan never re-walks the dead entries earlier batches left behind (the dead-tuple snowball of
  LIMIT-only loops). The redundant ``updated_at >=`` bound gives the planner the range on the
  leading column, so it keeps to the partial index instead of walking the plain ``updated_at``
  index through account rows. Rows the keyset passes over (locked by someone else at the time)
  are left for the next run and show up in the backlog.
- The ids never leave the server: memory does not grow with the rows deleted.

An *optimistic* batch writes each row once (deleted) rather than twice (locked, then deleted),
in two statements of one transaction: :func:`keyset_bound_statement` counts the candidates up
to the limit through the index and names the last one, then :func:`keyset_delete_statement`
deletes the prunable rows up to it with a bitmap heap scan, in place. The DELETE locks each row
as it deletes it and re-checks the guard and the cutoff on the row's newest version, so a row
claimed by an account meanwhile is left alone; when the counts differ the loop rolls the batch
back and takes it again locking first (:mod:`~favorites_maintenance.retention.batch_loop`).
:func:`batch_statement` with ``lock_first=False`` is the one-statement form without ``FOR
UPDATE SKIP LOCKED``, at about twice the time per row.

A one-row batch first locks and names its row with the *next-key* statement, so the row can be
skipped if its delete fails.

With an archive (a policy's ``archive_table``), the DELETE of every form returns every column
and feeds an ``INSERT`` into the archive (:func:`removed_rows`, through
:meth:`~favorites_maintenance.retention.archive.Archive.move`), and ``deleted`` counts the rows
moved (the optimistic forms' second statement is then the move itself, whose row count is
the rows moved, :func:`counted`).

*Page order*, the other way to walk a backlog spread over the whole table, has its statements in
:mod:`~favorites_maintenance.retention.page_statements`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, TIMESTAMP, aggregate_order_by

from favorites_maintenance.retention.errors import ReplicationRoleError, StandbyError
from favorites_maintenance.retention.rule import RetentionRule

if TYPE_CHECKING:
    from favorites_maintenance.retention.archive import Archive


def batch_statement(rule: RetentionRule, cutoff: dt.datetime, keyset: bool,
                    by_ctid: bool = True, lock_first: bool = True,
                    archive: Archive | None = None) -> sa.Select:
    """The one statement of a batch; ``:batch_size`` (rows, rendered inline at execution) and,
    with ``keyset``, the position ``:after_age`` (a UTC instant) and ``:after_key`` are bound.

    It returns one row: ``selected`` (rows in the batch), ``deleted`` (rows it deleted),
    ``last_age`` and ``last_key`` (the batch's last keyset position, ``None`` when empty).

    ``lock_first=False`` gives the optimistic form: the candidates are read without
    ``FOR UPDATE SKIP LOCKED`` and the DELETE locks each row as it deletes it.

    With ``archive``, the deleted rows move into it in the same statement and ``deleted``
    counts the rows moved (:meth:`~favorites_maintenance.retention.archive.Archive.move`);
    ``rule`` is then the archive's ``source_rule``, whose table has every column.

    Raises:
        InvalidArgumentError: ``cutoff`` is naive.
    """
    t = rule.table
    where = [rule.prunable(cutoff)]
    if keyset:
        where += _after_position(rule)
    candidates = (
        sa.select(*([t.c.ctid] if by_ctid else []), rule.key.label("key"), rule.age.label("age"))
        .where(*where)
        .order_by(rule.age, rule.key)
        # Rendered into the statement: as a server-side parameter the LIMIT is planned worse
        # (batch p50 6.4 -> 9-11 ms at 2 M rows in the bench).
        .limit(sa.bindparam("batch_size", type_=sa.Integer, literal_execute=True))
    )
    if lock_first:
        candidates = candidates.with_for_update(skip_locked=True)
    # CTE names a table is unlikely to have: a policy's table may be called "batch".
    batch = candidates.cte("retention_batch").prefix_with("MATERIALIZED")
    if by_ctid:
        # The batch's rows are locked by this transaction, so no one can update, delete or
        # move them before the DELETE: their ctid (row address) names exactly the locked row
        # versions. A TID scan per address reaches each without a primary-key index descent;
        # the id is matched too, so a row is only ever deleted by its address *and* its key,
        # and the guard is checked again on each. In the optimistic form a row updated since
        # it was read has moved: the DELETE re-checks the newest version, whose address no
        # longer matches, and leaves it (the batch then comes up short and is rolled back).
        match = sa.and_(t.c.ctid == batch.c.ctid, rule.key == batch.c.key)
    else:
        # A partitioned table repeats row addresses across partitions, and a role may lack
        # SELECT on ctid: match by key. The age column is matched too: a table partitioned by
        # it has its primary key on (id, updated_at).
        match = sa.and_(rule.key == batch.c.key, rule.age == batch.c.age)
    deleted = removed_rows(rule.delete_prunable(cutoff, match), archive)
    # The batch's last key and its size in one pass over it (a window count, then the top row).
    last = (
        sa.select(batch.c.age, batch.c.key, sa.func.count().over().label("selected"))
        .order_by(batch.c.age.desc(), batch.c.key.desc())
        .limit(1)
        .subquery("last")
    )
    # One row even for an empty batch.
    one = sa.select(sa.literal(1).label("one")).subquery("one")
    return sa.select(
        sa.func.coalesce(last.c.selected, 0).label("selected"),
        sa.select(sa.func.count()).select_from(deleted).scalar_subquery().label("deleted"),
        last.c.age.label("last_age"),
        last.c.key.label("last_key"),
    ).select_from(one.outerjoin(last, sa.true()))


def removed_rows(delete: sa.Delete, archive: Archive | None) -> sa.CTE:
    """A batch's ``delete`` as the CTE the batch statement counts its rows from, one row per
    row removed: ``DELETE ... RETURNING 1`` (``retention_deleted``), or with ``archive`` the
    move of the deleted rows into it (:meth:`~favorites_maintenance.retention.archive.Archive.
    move`). The one place a batch's rows go somewhere: every batch form goes through it."""
    if archive is not None:
        return archive.move(delete)
    return delete.returning(sa.literal_column("1")).cte("retention_deleted")


def _after_position(rule: RetentionRule) -> list[sa.ColumnElement[bool]]:
    after_age = sa.bindparam("after_age", type_=TIMESTAMP(timezone=True))
    return [
        # Redundant with the row comparison, but it gives the planner the range on the
        # leading column, so it prefers the partial index to walking the plain updated_at
        # index through the account rows (and re-sorting them by id).
        rule.age >= after_age,
        sa.tuple_(rule.age, rule.key) > sa.tuple_(after_age, sa.bindparam("after_key")),
    ]


def keyset_position(rule: RetentionRule) -> list[sa.ColumnElement[bool]]:
    """The predicate "past the keyset position" of a batch, ``:after_age`` and ``:after_key``
    bound (what every statement after the first batch adds)."""
    return _after_position(rule)


def next_key_statement(rule: RetentionRule, cutoff: dt.datetime, keyset: bool) -> sa.Select:
    """Lock and return the key of the next candidate (columns ``key``, ``age``; no row when none
    is left): a one-row batch names its row before it tries to delete it, so the row can be
    skipped if the delete fails. With ``keyset``, ``:after_age`` and ``:after_key`` are bound.
    """
    where = [rule.prunable(cutoff)] + (_after_position(rule) if keyset else [])
    return (sa.select(rule.key.label("key"), rule.age.label("age")).where(*where)
            .order_by(rule.age, rule.key).limit(1)
            .with_for_update(skip_locked=True))


def keyset_bound_statement(rule: RetentionRule, cutoff: dt.datetime, keyset: bool) -> sa.Select:
    """The first statement of an optimistic batch in keyset order: how many candidates there
    are up to ``:batch_size`` past the position (``:after_age``, ``:after_key`` with
    ``keyset``), and the last of them. One row: ``selected``, ``last_age``, ``last_key``
    (``None`` when there is no candidate). The partial index answers it alone (an index-only
    scan)."""
    where = [rule.prunable(cutoff)] + (_after_position(rule) if keyset else [])
    inner = (sa.select(rule.age.label("age"), rule.key.label("key")).where(*where)
             .order_by(rule.age, rule.key)
             .limit(sa.bindparam("batch_size", type_=sa.Integer, literal_execute=True))
             .subquery("retention_candidates"))
    # The last candidate's key: the candidates come in keyset order, so the aggregate's own
    # ORDER BY costs no sort (PostgreSQL sees them presorted), and no window is buffered.
    keys = sa.func.array_agg(aggregate_order_by(inner.c.key, inner.c.age, inner.c.key),
                             type_=ARRAY(sa.Text))
    last = (sa.select(sa.func.count().label("selected"), sa.func.max(inner.c.age).label("last_age"),
                      keys[sa.func.count()].label("last_key"))
            .subquery("retention_last"))
    # Evaluated once, after this statement was planned (an ordered index scan): the DELETE
    # that follows in the transaction is then planned as a bitmap heap scan, which visits the
    # batch's pages in address order, each once (a third less time than an index scan).
    return sa.select(last.c.selected, last.c.last_age, last.c.last_key,
                     sa.func.set_config("enable_indexscan", "off", True).label("armed"))


def keyset_delete_statement(rule: RetentionRule, cutoff: dt.datetime, keyset: bool,
                            archive: Archive | None = None) -> sa.Delete | sa.Insert:
    """The second statement of an optimistic batch in keyset order: ``DELETE`` the prunable
    rows past the position and up to the last one :func:`keyset_bound_statement` named
    (``:last_age``, ``:last_key``)::

        DELETE FROM favorites.favorites
         WHERE user_id IS NULL AND updated_at < :cutoff
           AND updated_at >= :after_age AND (updated_at, id) > (:after_age, :after_key)
           AND updated_at <= :last_age AND (updated_at, id) <= (:last_age, :last_key)

    A bitmap heap scan (the count turned plain index scans off for the rest of the
    transaction) deletes the rows page after page, without collecting addresses or
    ``RETURNING`` anything: less than half the time of the locking statement for a day's rows.
    Its row count is what it deleted. It checks the guard and the cutoff on each row's newest
    version, so a row claimed since the count is left; when the counts differ (a row claimed,
    deleted or moved in between, or one made prunable in between, which could take the batch
    past its limit) the loop rolls the batch back and takes it again locking first, so no
    transaction commits more rows than the limit.

    With ``archive`` it moves those rows into the archive instead (:func:`counted`), its row
    count the rows moved.
    """
    last_age = sa.bindparam("last_age", type_=TIMESTAMP(timezone=True))
    where = (_after_position(rule) if keyset else []) + [
        rule.age <= last_age,
        sa.tuple_(rule.age, rule.key) <= sa.tuple_(last_age, sa.bindparam("last_key"))]
    return counted(rule.delete_prunable(cutoff, *where), archive)


def counted(delete: sa.Delete, archive: Archive | None) -> sa.Delete | sa.Insert:
    """An optimistic batch's second statement: the plain ``delete``, or with ``archive`` the
    move of its rows into the archive (:meth:`~favorites_maintenance.retention.archive.
    Archive.insert_moved`); either way its row count is what it removed."""
    if archive is None:
        return delete
    return archive.insert_moved(delete)


class BatchStatements:
    """The batch and next-key statements of one run, each built the first time the run asks
    for it: a run of one optimistic batch (a day's rows) builds two of the eight, and building
    a statement costs more than running it on a small backlog.

    The variants, each before and after the first keyset position: the locking batch
    statement (:func:`batch_statement`), the two statements of an optimistic batch
    (:func:`keyset_bound_statement`, then :func:`keyset_delete_statement`), and the next-key
    statement (:func:`next_key_statement`).

    Args:
        rule, cutoff: the rule and the cutoff (a timezone-aware UTC instant) of the run.
        by_ctid: see :attr:`TableFacts.by_ctid`.
        archive: where the batches move their rows (``None``: they are deleted); the
            statements then read the archive's ``source_rule``.
    """

    def __init__(self, rule: RetentionRule, cutoff: dt.datetime, by_ctid: bool,
                 archive: Archive | None = None):
        self.rule = archive.source_rule if archive is not None else rule
        self.cutoff, self.by_ctid, self.archive = cutoff, by_ctid, archive
        self._built: dict[tuple[str, bool], sa.Executable] = {}

    def _get(self, kind: str, keyset: bool) -> sa.Executable:
        key = (kind, keyset)
        if key not in self._built:
            rule, cutoff, archive = self.rule, self.cutoff, self.archive
            if kind == "locking":
                built = batch_statement(rule, cutoff, keyset=keyset, by_ctid=self.by_ctid,
                                        archive=archive)
            elif kind == "bound":
                built = keyset_bound_statement(rule, cutoff, keyset=keyset)
            elif kind == "delete":
                built = keyset_delete_statement(rule, cutoff, keyset=keyset, archive=archive)
            else:
                built = next_key_statement(rule, cutoff, keyset=keyset)
            self._built[key] = built
        return self._built[key]

    def batch(self, *, keyset: bool, fast: bool) -> sa.Select | sa.Delete | sa.Insert:
        """The batch statement after a keyset position or not: the locking one, or (``fast``)
        the DELETE of the optimistic pair, which runs after :meth:`bound`."""
        return self._get("delete" if fast else "locking", keyset)

    def locks(self, statement: sa.Executable) -> bool:
        """Whether ``statement`` is one of the locking batch statements (one statement a
        batch), not the DELETE of an optimistic pair."""
        return any(statement is built for (kind, _), built in self._built.items()
                   if kind == "locking")

    def bound(self, *, keyset: bool) -> sa.Select:
        """The first statement of an optimistic batch after a keyset position or not."""
        return self._get("bound", keyset)

    def next_key(self, *, keyset: bool) -> sa.Select:
        """The next-key statement after a keyset position or not."""
        return self._get("next_key", keyset)


def candidate_keys(rule: RetentionRule, cutoff: dt.datetime, sample: int) -> sa.Select:
    """The keys of the first ``sample`` candidates in keyset order, unlocked (the zero-progress
    probe counts them, then locks them ``NOWAIT``)."""
    return (sa.select(rule.key).where(rule.prunable(cutoff))
            .order_by(rule.age, rule.key).limit(sample))


def count_of(statement: sa.Select) -> sa.Select:
    """``SELECT count(*)`` of the rows ``statement`` returns."""
    return sa.select(sa.func.count()).select_from(statement.subquery())


#: Driver SQL: the zero-progress probe's two statements see one snapshot.
REPEATABLE_READ = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"

#: One row, one column: whether the session is on a hot standby.
IS_IN_RECOVERY = sa.text("SELECT pg_is_in_recovery()")

#: Row-level security of ``:t`` (``schema.table``): enabled, forced, number of policies.
ROW_SECURITY = sa.text(
    "SELECT c.relrowsecurity, c.relforcerowsecurity, "
    "       (SELECT count(*) FROM pg_policy p WHERE p.polrelid = c.oid) "
    "FROM pg_class c WHERE c.oid = to_regclass(:t)")

#: Enabled BEFORE DELETE row triggers of ``:t`` by name (tgtype bits: 1 row-level, 2 BEFORE,
#: 8 DELETE).
BEFORE_DELETE_TRIGGERS = sa.text(
    "SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass(:t) "
    "AND NOT tgisinternal AND tgenabled <> 'D' AND tgtype & 11 = 11 "
    "ORDER BY tgname")

#: Foreign keys referencing ``:t``: constraint and table (``schema.name``), ON DELETE action
#: (``a`` no action, ``r`` restrict, ``c`` cascade, ``n`` set null, ``d`` set default).
REFERENCING_KEYS = sa.text(
    "SELECT format('%I.%I', cn.nspname, con.conname), format('%I.%I', tn.nspname, t.relname), "
    "       con.confdeltype "
    "FROM pg_constraint con JOIN pg_class t ON t.oid = con.conrelid "
    "JOIN pg_namespace tn ON tn.oid = t.relnamespace "
    "JOIN pg_namespace cn ON cn.oid = con.connamespace "
    "WHERE con.contype = 'f' AND con.confrelid = to_regclass(:t) AND con.conparentid = 0 "
    "ORDER BY 1")

#: Enabled DELETE triggers of ``:t`` (any timing, row or statement): name, function.
DELETE_TRIGGERS = sa.text(
    "SELECT tgname, tgfoid::regprocedure::text FROM pg_trigger WHERE tgrelid = to_regclass(:t) "
    "AND NOT tgisinternal AND tgenabled <> 'D' AND tgtype & 8 = 8 ORDER BY tgname")

#: DELETE rules of ``:t`` by name.
DELETE_RULES = sa.text(
    "SELECT rulename FROM pg_rewrite WHERE ev_class = to_regclass(:t) "
    "AND ev_type = '4' ORDER BY rulename")


def assert_primary(conn: sa.Connection) -> None:
    """Raise :class:`StandbyError` if ``conn`` is on a hot standby (``pg_is_in_recovery()``)."""
    if conn.execute(IS_IN_RECOVERY).scalar_one():
        raise _standby_error()


def _standby_error() -> StandbyError:
    return StandbyError("the database connection reached a hot standby "
                        "(pg_is_in_recovery() is true); point the database's URL at the primary")


#: One row: the session's ``session_replication_role``, where it comes from, the database and
#: the role (for the fix).
_REPLICATION_ROLE = sa.text(
    "SELECT setting, source, current_database(), current_user FROM pg_settings "
    "WHERE name = 'session_replication_role'")

#: How to undo ``session_replication_role = replica``, by where it was set
#: (``pg_settings.source``); ``{db}`` and ``{role}`` are the session's.
_REPLICATION_ROLE_FIX = {
    "database": 'ALTER DATABASE "{db}" RESET session_replication_role',
    "user": 'ALTER ROLE "{role}" RESET session_replication_role',
    "database user": 'ALTER ROLE "{role}" IN DATABASE "{db}" RESET session_replication_role',
    "client": "remove it from the options of FAVORITES_DATABASE_URL (or PGOPTIONS)",
    "configuration file": "ALTER SYSTEM RESET session_replication_role, or remove it from "
                          "postgresql.conf, then reload",
}


def assert_triggers_fire(conn: sa.Connection) -> None:
    """Raise :class:`ReplicationRoleError` if the session's ``session_replication_role`` is
    ``replica`` (set on the database, the role or the URL): triggers and foreign keys would not
    fire, so the purge would delete rows that others still reference and skip their cascades.
    """
    _refuse_replica_role(*conn.execute(_REPLICATION_ROLE).one())


#: One row: :data:`IS_IN_RECOVERY` and :data:`_REPLICATION_ROLE` together.
_SESSION = sa.text(
    "SELECT pg_is_in_recovery(), setting, source, current_database(), current_user "
    "FROM pg_settings WHERE name = 'session_replication_role'")


def check_session(conn: sa.Connection) -> None:
    """:func:`assert_primary` and :func:`assert_triggers_fire` in one statement: raise
    :class:`StandbyError` on a hot standby, else :class:`ReplicationRoleError` when triggers
    would not fire."""
    in_recovery, *role = conn.execute(_SESSION).one()
    if in_recovery:
        raise _standby_error()
    _refuse_replica_role(*role)


def _refuse_replica_role(setting: str, source: str, database: str, role: str) -> None:
    if setting != "replica":
        return
    fix = _REPLICATION_ROLE_FIX.get(source, "reset it where it is set").format(db=database,
                                                                               role=role)
    raise ReplicationRoleError(
        f"session_replication_role is 'replica' for the job's sessions (set by: {source}): "
        f"no trigger and no foreign key fires in that mode, so a DELETE would leave rows that "
        f"reference a deleted row (ON DELETE RESTRICT) and skip its cascades. Nothing was "
        f"deleted. Fix, as a superuser: {fix}", source)


#: The catalog entries a table check reads, as the select list of a row of ``pg_class c``: the
#: relation's kind, each rule column's name, type, modifier and NOT NULL, the validated CHECK
#: constraints. A migration that changes any of them changes the row.
_SHAPE_COLUMNS = (
    "c.relkind, "
    "ARRAY(SELECT format('%s %s %s %s', a.attname, a.atttypid, a.atttypmod, a.attnotnull) "
    "        FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 "
    "         AND NOT a.attisdropped AND a.attname = ANY(CAST(:columns AS text[])) "
    "       ORDER BY a.attname), "
    "ARRAY(SELECT oid FROM pg_constraint WHERE conrelid = c.oid AND contype = 'c' "
    "         AND convalidated ORDER BY oid)")

#: The shape of ``:t`` (``schema.table``) in one row, none for a missing table.
_TABLE_SHAPE = sa.text(
    f"SELECT {_SHAPE_COLUMNS} FROM pg_class c WHERE c.oid = to_regclass(:t)")

#: The shape and the facts of ``:t`` in one row (none for a missing table): its heap pages,
#: whether it is partitioned, whether the role may read ``ctid``, row-level security, the
#: server's version, and whether the role may lock rows of it (``FOR UPDATE`` needs UPDATE on
#: at least one column).
_TABLE_FACTS = sa.text(
    f"SELECT {_SHAPE_COLUMNS}, "
    "       pg_relation_size(c.oid) / current_setting('block_size')::int, "
    "       c.relkind = 'p', has_column_privilege(c.oid, 'ctid', 'SELECT'), "
    "       c.relrowsecurity, current_setting('server_version_num')::int, "
    "       has_any_column_privilege(c.oid, 'UPDATE') "
    "  FROM pg_class c WHERE c.oid = to_regclass(:t)")


def _shape_params(rule: RetentionRule) -> dict:
    return {"t": rule.qualified_name,
            "columns": [rule.key.name, rule.age.name, *(c.name for c in rule.guards)]}


def table_shape(conn: sa.Connection, rule: RetentionRule) -> tuple | None:
    """What the table check of ``rule`` depends on, as comparable values (``None`` for a
    missing table): one catalog read, cheap enough for every batch."""
    row = conn.execute(_TABLE_SHAPE, _shape_params(rule)).first()
    return None if row is None else (row[0], tuple(row[1]), tuple(row[2]))


@dataclass(frozen=True)
class TableFacts:
    """What a run reads of its table before the first batch, in one catalog statement
    (:func:`table_facts`).

    Attributes:
        shape: :func:`table_shape`'s value (``None``: no such table).
        blocks: heap pages (0 for a partitioned table, whose rows are in its partitions).
        partitioned: a partitioned table (row addresses repeat across its partitions).
        ctid_readable: the role may read the ``ctid`` column.
        row_security: the table has row-level security enabled.
        version: the server's ``server_version_num`` (140000 for 14.0).
        may_lock: the role holds UPDATE on at least one column (``FOR UPDATE`` needs it).
    """

    shape: tuple | None
    blocks: int = 0
    partitioned: bool = False
    ctid_readable: bool = False
    row_security: bool = False
    version: int = 0
    may_lock: bool = False

    @property
    def by_ctid(self) -> bool:
        """Whether the DELETE may reach the batch's rows by ``ctid``: not on a partitioned
        table (addresses repeat across partitions), nor for a role that may not read the
        column."""
        return self.shape is not None and not self.partitioned and self.ctid_readable


def table_facts(conn: sa.Connection, rule: RetentionRule) -> TableFacts:
    """Read :class:`TableFacts` of ``rule``'s table in the open transaction of ``conn`` (its
    page count takes the table's ACCESS SHARE lock, as a batch does)."""
    row = conn.execute(_TABLE_FACTS, _shape_params(rule)).first()
    if row is None:
        return TableFacts(shape=None)
    kind, columns, checks, blocks, partitioned, ctid, row_security, version, may_lock = row
    return TableFacts(shape=(kind, tuple(columns), tuple(checks)), blocks=blocks,
                      partitioned=partitioned, ctid_readable=ctid, row_security=row_security,
                      version=version, may_lock=may_lock)
