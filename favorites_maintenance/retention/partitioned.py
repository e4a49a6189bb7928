"""Range-partitioned tables: their leaf partitions, and removing the wholly expired ones.

A table partitioned by range on the rule's age column (declarative partitioning, ``PARTITION
BY RANGE (<age>)``) is read from the catalogs (``pg_partitioned_table``, ``pg_inherits``,
``pg_class.relpartbound``) into :class:`TablePartition` values, one per partition, so that the
purge can treat each partition on its own.

The catalogs are readable by every role, so reading them needs no privilege the job lacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import itertools
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP

from favorites_maintenance.retention.database import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    limit_transaction,
)
from favorites_maintenance.retention.errors import (
    ErrorKind,
    TableCheckError,
    TableShapeError,
    describe,
)
from favorites_maintenance.retention.rule import AgeRange, RetentionRule

_UTC = dt.UTC
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)


@dataclass(frozen=True)
class TablePartition:
    """One partition of a range-partitioned table, as the catalogs describe it.

    Attributes:
        schema: the partition's schema.
        name: the partition's table name.
        lower: the inclusive lower bound of its range, a UTC instant; ``None`` for
            ``MINVALUE`` or ``'-infinity'`` (and for the default partition).
        upper: the exclusive upper bound, a UTC instant; ``None`` for ``MAXVALUE`` or
            ``'infinity'`` (and for the default partition).
        is_default: the ``DEFAULT`` partition, which holds every row no other range admits.
        detach_pending: a ``DETACH PARTITION ... CONCURRENTLY`` of it was interrupted (a
            crash, a cancel) and awaits ``FINALIZE`` (``pg_inherits.inhdetachpending``).
        uncovered: for the default partition, the ranges of the age column no other partition
            covers (read with the others by :func:`leaf_partitions`); empty otherwise.
    """

    schema: str
    name: str
    lower: dt.datetime | None
    upper: dt.datetime | None
    is_default: bool = False
    detach_pending: bool = False
    uncovered: tuple[AgeRange, ...] = ()

    @property
    def ages(self) -> tuple[AgeRange, ...]:
        """The ranges of the age column its rows lie in, each ``[lower, upper)`` (``None`` for
        an open end): its bounds; for the default partition, :attr:`uncovered`. Given to
        :meth:`~favorites_maintenance.retention.rule.RetentionRule.within`, they reach its
        rows through the table, every other partition pruned."""
        return self.uncovered if self.is_default else ((self.lower, self.upper),)

    @property
    def qualified_name(self) -> str:
        """``schema.name``, for messages (never for SQL)."""
        return f"{self.schema}.{self.name}"

    @property
    def table(self) -> sa.TableClause:
        """The partition as a SQLAlchemy table clause (no columns), quoted by the dialect."""
        return sa.table(self.name, schema=self.schema)

    def describe_range(self) -> str:
        """``[2024-01-01T00:00:00+00:00, 2024-02-01T00:00:00+00:00)``, ``DEFAULT``, or with
        ``MINVALUE``/``MAXVALUE`` for an open end; for messages."""
        if self.is_default:
            return "DEFAULT"
        lower = self.lower.isoformat() if self.lower else "MINVALUE"
        upper = self.upper.isoformat() if self.upper else "MAXVALUE"
        return f"[{lower}, {upper})"


#: The partition key of ``:t``: strategy (``r``ange, ``l``ist, ``h``ash), number of columns,
#: the first key column's name (NULL for an expression) and its type.
_PARTITION_KEY = sa.text("""
    SELECT pt.partstrat, pt.partnatts, a.attname, format_type(a.atttypid, a.atttypmod),
           pg_get_partkeydef(pt.partrelid)
      FROM pg_partitioned_table pt
      LEFT JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
                               AND pt.partattrs[0] <> 0
     WHERE pt.partrelid = to_regclass(:t)
""")

#: The direct partitions of ``:t``: schema, name, relkind (``p`` for one that is itself
#: partitioned), whether a concurrent detach of it is pending, and its bound as SQL text.
_PARTITIONS = sa.text("""
    SELECT n.nspname, c.relname, c.relkind, i.inhdetachpending,
           pg_get_expr(c.relpartbound, c.oid)
      FROM pg_inherits i
      JOIN pg_class c ON c.oid = i.inhrelid
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE i.inhparent = to_regclass(:t)
     ORDER BY n.nspname, c.relname
""")

_RANGE = re.compile(r"FOR VALUES FROM \((.*)\) TO \((.*)\)", re.DOTALL)


def leaf_partitions(conn: sa.Connection, schema: str, table: str, *,
                    age_column: str | None = None,
                    setting: str = "drop_expired_partitions") -> list[TablePartition]:
    """The partitions of ``schema.table``, a table range-partitioned on one ``timestamptz``
    column (``age_column`` when given), ordered by range (``MINVALUE`` first, the default
    partition last).

    Partitions whose concurrent detach is pending are listed too (``detach_pending``): they no
    longer receive rows, and ``DETACH PARTITION ... FINALIZE`` completes their detach.

    Bounds are printed by the server in the session's ``TimeZone`` and read back in the same
    session, so the instants do not depend on the session's settings.

    Args:
        conn: a connection on the table's database (any role: catalogs only).
        schema, table: the partitioned table.
        age_column: the column the table must be partitioned by (the rule's age column);
            ``None``: any single ``timestamptz`` column.
        setting: the policy setting that needs the shape, named by the errors
            (``drop_expired_partitions`` or ``max_parallel_partitions``).

    Returns:
        One :class:`TablePartition` per direct partition (empty when it has none).

    Raises:
        TableShapeError: the table is not partitioned, or not by range on ``age_column``
            alone (the message says what its partition key is), or a partition is itself
            partitioned.
    """
    qualified = f"{schema}.{table}"
    name = _quote(schema) + "." + _quote(table)
    key = conn.execute(_PARTITION_KEY, {"t": name}).first()
    if key is None:
        raise TableShapeError(
            f"{qualified} is not a partitioned table, but {setting} is set: "
            f"declare it PARTITION BY RANGE ({age_column or '<age column>'}), or leave "
            f"{setting} unset")
    strategy, columns, column, type_name, keydef = key
    wanted = age_column or column
    if strategy != "r" or columns != 1 or column is None or column != wanted:
        raise TableShapeError(
            f"{qualified} is partitioned by {keydef}, but {setting} needs it "
            f"partitioned by RANGE ({wanted or '<age column>'}), the policy's age column: a "
            f"partition's range must bound the age of every row it holds",
            column=age_column)
    if type_name != "timestamp with time zone":
        raise TableShapeError(
            f"{qualified} is partitioned by {keydef} of type {type_name}, but "
            f"{setting} compares its bounds with a UTC instant and needs "
            f"timestamp with time zone", column=column)
    rows = conn.execute(_PARTITIONS, {"t": name}).all()
    nested = [f"{s}.{n}" for s, n, kind, _, _ in rows if kind == "p"]
    if nested:
        raise TableShapeError(
            f"{qualified} has partitions that are themselves partitioned ({', '.join(nested)}): "
            f"{setting} handles one level of range partitions only")
    literals: list[str] = []
    parsed = []
    for part_schema, part_name, _, pending, bound in rows:
        if bound == "DEFAULT":
            parsed.append((part_schema, part_name, pending, True, None, None))
            continue
        match = _RANGE.fullmatch(bound or "")
        if match is None:
            raise TableShapeError(f"partition {part_schema}.{part_name} of {qualified} has "
                                  f"bound {bound!r}, not a range")
        ends = []
        for end in match.groups():
            end = end.strip()
            if end in ("MINVALUE", "MAXVALUE"):
                ends.append(None)
            else:
                ends.append(len(literals))
                literals.append(_unquote(end))
        parsed.append((part_schema, part_name, pending, False, *ends))
    instants: list[dt.datetime | None] = []
    if literals:
        # Read back as microseconds since the epoch: the driver parses timestamptz text in the
        # ISO DateStyle only. 'infinity' and '-infinity' bound no more than MAXVALUE and
        # MINVALUE do (NULL: an open end).
        instants = [None if us is None else _EPOCH + dt.timedelta(microseconds=us)
                    for us in conn.execute(sa.text(
                        "SELECT CASE WHEN isfinite(CAST(v AS timestamptz)) THEN CAST(extract("
                        "epoch FROM CAST(v AS timestamptz)) * 1000000 AS bigint) END "
                        "FROM unnest(CAST(:v AS text[])) WITH ORDINALITY AS b(v, i) ORDER BY i"),
                        {"v": literals}).scalars()]
    partitions = [
        TablePartition(schema=s, name=n, detach_pending=bool(pending), is_default=default,
                       lower=_instant(instants, lo), upper=_instant(instants, hi))
        for s, n, pending, default, lo, hi in parsed]
    # A partition whose detach is pending no longer receives rows: its range is the default's.
    covered = [(p.lower, p.upper) for p in partitions
               if not p.is_default and not p.detach_pending]
    partitions = [dataclasses.replace(p, uncovered=_uncovered(covered)) if p.is_default else p
                  for p in partitions]
    return sorted(partitions, key=lambda p: (p.is_default, p.lower or _LEAST, p.name))


_LEAST = dt.datetime.min.replace(tzinfo=_UTC)


def _uncovered(ranges: list[AgeRange]) -> tuple[AgeRange, ...]:
    """The ranges of instants that none of ``ranges`` (``[lower, upper)``, disjoint, ``None``
    for an open end) covers, in order; ``((None, None),)`` when ``ranges`` is empty."""
    gaps: list[AgeRange] = []
    start: dt.datetime | None = None  # covered up to here; None: nothing yet
    for lower, upper in sorted(ranges, key=lambda r: r[0] or _LEAST):
        if lower is not None and (start is None or lower > start):
            gaps.append((start, lower))
        if upper is None:
            return tuple(gaps)
        start = upper
    gaps.append((start, None))
    return tuple(gaps)


def _instant(instants: list[dt.datetime | None], index: int | None) -> dt.datetime | None:
    """The bound at ``index`` in UTC; ``None`` for an open end (none, or an infinity)."""
    value = None if index is None else instants[index]
    return None if value is None else value.astimezone(_UTC)


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _unquote(literal: str) -> str:
    """``'2024-01-01 00:00:00+00'`` -> ``2024-01-01 00:00:00+00``."""
    if len(literal) >= 2 and literal[0] == "'" and literal[-1] == "'":
        return literal[1:-1].replace("''", "'")
    return literal


# --- Removing wholly expired partitions --------------------------------------------------------

log = logging.getLogger("favorites_maintenance.retention.partitioned")

#: Attempts of one DETACH or DROP that ``lock_timeout`` cancels, and the pause before the
#: second, in seconds (doubled after each).
LOCK_ATTEMPTS = 5
LOCK_BACKOFF_S = 1.0

#: The first characters of the comment the job writes on a table it detaches (a JSON object:
#: ``state``, ``from`` the parent, ``at`` the UTC instant, ``rows``; once detached, also
#: ``partition``, its name as a partition, and ``bounds``, its ``FOR VALUES`` clause).
MARK = '{"favorites_maintenance"'

#: What a detached table's name becomes: the partition's name with this suffix (and ``_2``,
#: ``_3``, ... when taken; the name shortened to fit 63 bytes). A tool that creates
#: partitions by name (pg_partman's ``create_partition_time``, ``partition_data_time``) then
#: finds no table of the partition's name and creates a new partition, rather than writing a
#: late row of the range into the detached table.
DETACHED_SUFFIX = "_detached"

#: The function a table's owner installs so that a role that may not alter the table has its
#: expired partitions detached and dropped (``least_privilege_partitions.sql``, rendered for
#: the rule by ``least_privilege.partition_functions_sql``):
#: ``<schema>.<table>_detach_partition(regclass, timestamptz, integer)`` and
#: ``<schema>.<table>_drop_detached(regclass, interval, integer)``.
DETACH_FUNCTION = "{schema}.{table}_detach_partition"
DROP_FUNCTION = "{schema}.{table}_drop_detached"
_DETACH_ARGS = "(regclass, timestamptz, integer)"
_DROP_ARGS = "(regclass, interval, integer)"


class Action(str, enum.Enum):
    """What the drop phase did with one partition or detached table."""

    DETACHED = "detached"
    """Detached from the parent (its rows counted as removed); dropped by a later run."""
    DROPPED = "dropped"
    """A table this job detached, dropped once ``detached_retention`` had passed."""
    KEPT = "kept"
    """Left attached: its prunable rows are deleted in batches as any other row."""
    KEPT_DETACHED = "kept_detached"
    """A detached table left in place (its retention not over, or a check failed)."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class PartitionDecision:
    """What the drop phase decided for one partition (or detached table), and why.

    Attributes:
        partition: ``schema.name``.
        action: the :class:`Action`.
        checks: the checks' results, one phrase each, in the order run (``upper bound
            2024-02-01T00:00:00+00:00 <= cutoff``, ``no account row (index scan on ...)``,
            ...); the last one is the reason when ``action`` is ``kept``.
        rows: rows of the partition counted when it was detached (or dropped), else 0.
        detached_as: for a partition detached, the name (``schema.name``) its table took
            (:data:`DETACHED_SUFFIX`); empty otherwise.
    """

    partition: str
    action: Action
    checks: tuple[str, ...] = ()
    rows: int = 0
    detached_as: str = ""

    @property
    def ends_after_cutoff(self) -> bool:
        """Kept for its range alone: it ends after the cutoff (the run's log names such
        partitions together)."""
        return (self.action is Action.KEPT and len(self.checks) == 1
                and self.checks[0].startswith("upper bound ") and " > cutoff " in self.checks[0])

    def describe(self) -> str:
        """One log line: ``partition favorites.favorites_20240101 detached (1,000 rows): ...``,
        ``detached table favorites.favorites_20240101 dropped: ...``."""
        rows = f" ({self.rows:,} rows)" if self.rows else ""
        if self.action in (Action.DROPPED, Action.KEPT_DETACHED):
            what = "detached table"
            action = "kept" if self.action is Action.KEPT_DETACHED else "dropped"
        else:
            what, action = "partition", str(self.action)
        return f"{what} {self.partition} {action}{rows}: {'; '.join(self.checks)}"


@dataclass(frozen=True)
class PartitionDropResult:
    """What one drop phase did (see :func:`drop_expired_partitions`).

    Attributes:
        detached: partitions detached by this run (``schema.name``), an interrupted detach
            it finalized included.
        dropped: detached tables this run dropped.
        rows_removed: rows of the partitions this run detached (they left the table: the
            run's ``deletedTotal`` counts them).
        decisions: one :class:`PartitionDecision` per partition and detached table looked at.
        privilege: how the job altered the table: ``owner`` (its role may), ``function`` (the
            owner's ``SECURITY DEFINER`` function), or ``none`` (neither: nothing detached).
    """

    detached: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    rows_removed: int = 0
    decisions: tuple[PartitionDecision, ...] = ()
    privilege: str = "none"

    def figures(self) -> tuple[int, int, int]:
        """(partitions detached, detached tables dropped, rows of the detached partitions)."""
        return len(self.detached), len(self.dropped), self.rows_removed


def drop_expired_partitions(engine: sa.Engine, rule: RetentionRule, cutoff: dt.datetime, *,
                            detached_retention: dt.timedelta | None = dt.timedelta(days=7),
                            lock_timeout: dt.timedelta = DEFAULT_LOCK_TIMEOUT,
                            statement_timeout: dt.timedelta = DEFAULT_STATEMENT_TIMEOUT,
                            should_stop: Callable[[], bool] = lambda: False,
                            ) -> PartitionDropResult:
    """Detach the partitions of the rule's table that hold nothing the rule keeps and lie
    wholly before ``cutoff``, finish a detach an earlier run left pending, and drop the tables
    this job detached at least ``detached_retention`` ago. Runs before the batch purge, which
    then deletes the prunable rows of every partition left attached.

    A partition is detached only when every check holds (each result is logged):

    - it is a range partition whose upper bound is at or before ``cutoff`` (never the default
      partition, whose rows are not bounded);
    - it holds no row the rule keeps (a guard column NOT NULL), by a query on the table, not
      by its bounds; the plan is logged (an index scan, or a sequential scan when no index on
      the guard serves it);
    - no DELETE trigger, row-level security, publication publishing deletes, or foreign key
      referencing it or the parent: a DETACH and DROP would bypass each of them.
    - with holds (the rule's ``hold``), no row of it an active hold covers: its other rows go
      through the batches, which skip the held one. A detached table is checked again before
      it is dropped, so a hold placed after the detach keeps it.

    How the table is altered: when the job's role owns the table (or is a member of its
    owner), ``DETACH PARTITION ... CONCURRENTLY`` (plain ``DETACH`` when the table has a
    default partition, which refuses ``CONCURRENTLY``), each statement under ``lock_timeout``
    and tried :data:`LOCK_ATTEMPTS` times with a doubling pause. Otherwise through the
    owner's functions (:data:`DETACH_FUNCTION`, :data:`DROP_FUNCTION`), which check again
    under the lock they take and detach with a plain ``DETACH`` (PostgreSQL refuses
    ``CONCURRENTLY`` inside a function). With neither, a WARNING names the function to install
    and nothing is detached.

    A detached table is renamed (:data:`DETACHED_SUFFIX`), so that nothing that creates
    partitions by name writes into it, and marked by a comment (:data:`MARK`: from which
    table, which partition it was, when, how many rows), so a later run finds it and knows
    when to drop it; before the ``DROP`` the guard is checked again on the detached table,
    which no session writes through the parent any more.

    Args:
        engine: engine on the table's database (the primary).
        rule: the policy's rule; its table is range-partitioned on ``rule.age``.
        cutoff: timezone-aware UTC instant of the run.
        detached_retention: how long a detached table is kept before a later run drops it;
            ``None``: kept for good.
        lock_timeout: the longest wait of one DETACH or DROP for its locks.
        statement_timeout: the limit of each check's query.
        should_stop: polled before each partition and during the pauses between lock
            attempts; ``True`` ends the phase there with what it did (a stop request: the
            partitions not reached stay attached).

    Returns:
        The :class:`PartitionDropResult`.

    Raises:
        TableShapeError: the table is not range-partitioned on the rule's age column.
        TableCheckError: the catalogs could not be read (a lost connection, a lock held past
            ``lock_timeout``) before anything was detached or dropped. After that, the phase
            ends there with what it did (a WARNING says why), so that the run counts it. A
            check or an alteration that fails is logged instead, and leaves that partition to
            the batches.
        InvalidArgumentError: a naive ``cutoff``.
    """
    rule.prunable(cutoff)  # refuses a naive cutoff
    phase = _DropPhase(engine, rule, cutoff, detached_retention, lock_timeout,
                       statement_timeout, should_stop)
    return phase.run()


#: What a DETACH and DROP would bypass, for partition ``:p`` of ``:parent``: one phrase each.
_BYPASSED = sa.text("""
    SELECT format('DELETE trigger %I on %s', t.tgname, t.tgrelid::regclass)
      FROM pg_trigger t
     WHERE t.tgrelid IN (CAST(:p AS regclass), CAST(:parent AS regclass))
       AND NOT t.tgisinternal AND t.tgtype & 8 <> 0
    UNION ALL
    SELECT format('row-level security on %s', c.oid::regclass)
      FROM pg_class c
     WHERE c.oid IN (CAST(:p AS regclass), CAST(:parent AS regclass)) AND c.relrowsecurity
    UNION ALL
    SELECT format('publication %I', p.pubname)
      FROM pg_publication p
     WHERE p.pubdelete AND EXISTS (
           SELECT 1 FROM pg_publication_tables pt
            WHERE pt.pubname = p.pubname
              AND to_regclass(format('%I.%I', pt.schemaname, pt.tablename))
                  IN (CAST(:p AS regclass), CAST(:parent AS regclass)))
    UNION ALL
    SELECT format('foreign key %I of %s', k.conname, k.conrelid::regclass)
      FROM pg_constraint k
     WHERE k.contype = 'f' AND k.conparentid = 0
       AND k.confrelid IN (CAST(:p AS regclass), CAST(:parent AS regclass))
""")

#: Tables this job detached (marked by :data:`MARK`), and whether each is a partition again.
_MARKED = sa.text("""
    SELECT n.nspname, c.relname, d.description, c.relispartition
      FROM pg_description d
      JOIN pg_class c ON c.oid = d.objoid
      JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE d.classoid = 'pg_class'::regclass AND d.objsubid = 0 AND c.relkind = 'r'
       AND d.description LIKE :mark
     ORDER BY 1, 2
""")

#: Whether ``:t`` (``schema.name``, quoted) names no relation and no type: a table may take it.
_NAME_FREE = sa.text("SELECT to_regclass(:t) IS NULL AND to_regtype(:t) IS NULL")

#: ``schema.name`` of the relation ``:oid``.
_NAME_OF = sa.text("SELECT format('%s.%s', n.nspname, c.relname) FROM pg_class c "
                   "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = :oid")

#: PostgreSQL's longest name, in bytes.
_MAX_NAME_BYTES = 63

_PRIVILEGE = sa.text("""
    SELECT pg_has_role(current_user, c.relowner, 'USAGE'),
           has_function_privilege(to_regprocedure(:detach), 'EXECUTE'),
           has_function_privilege(to_regprocedure(:drop), 'EXECUTE')
      FROM pg_class c WHERE c.oid = CAST(:t AS regclass)
""")


@dataclass
class _DropPhase:
    engine: sa.Engine
    rule: RetentionRule
    cutoff: dt.datetime
    detached_retention: dt.timedelta | None
    lock_timeout: dt.timedelta
    statement_timeout: dt.timedelta
    should_stop: Callable[[], bool] = lambda: False
    decisions: list[PartitionDecision] = field(default_factory=list)
    stop_logged: bool = False
    privilege: str = "none"

    @property
    def parent(self) -> str:
        return self.rule.qualified_name

    @property
    def quoted_parent(self) -> str:
        return _quote(self.rule.table.schema) + "." + _quote(self.rule.table.name)

    def function(self, template: str, args: str) -> str:
        return template.format(schema=self.rule.table.schema, table=self.rule.table.name) + args

    def run(self) -> PartitionDropResult:
        try:
            return self._run()
        except sa.exc.DBAPIError as exc:
            # Raised only by the catalog reads; a failed check or alteration is logged instead.
            done = [d for d in self.decisions if d.action in (Action.DETACHED, Action.DROPPED)]
            if not done:
                raise TableCheckError(describe(exc), self.parent) from None
            # What it detached has left the table: a retry would not see it again, so the
            # run must count it now.
            log.warning("drop_expired_partitions stopped after %d partitions detached or "
                        "dropped: %s; the batches delete the prunable rows of the others",
                        len(done), describe(exc))
            return self.result(self.privilege)

    def _run(self) -> PartitionDropResult:
        with self.engine.connect() as conn, conn.begin():
            # pg_get_expr locks each partition: a lock an application holds on one must not
            # keep this read waiting past lock_timeout.
            limit_transaction(conn, lock_timeout=self.lock_timeout,
                              statement_timeout=self.statement_timeout)
            partitions = leaf_partitions(conn, self.rule.table.schema, self.rule.table.name,
                                         age_column=self.rule.age.name)
            owner, may_detach, may_drop = conn.execute(_PRIVILEGE, {
                "t": self.quoted_parent,
                "detach": self.function(DETACH_FUNCTION, _DETACH_ARGS),
                "drop": self.function(DROP_FUNCTION, _DROP_ARGS)}).one()
        privilege = "owner" if owner else "function" if may_detach and may_drop else "none"
        self.privilege = privilege
        if privilege == "none":
            log.warning(
                "drop_expired_partitions: the job's role may not alter %s and cannot execute "
                "%s and %s: nothing detached, every prunable row is deleted in batches. Install "
                "them as the table's owner (favorites-maintenance partition-functions, docs/"
                "partitioned-tables.md)", self.parent,
                self.function(DETACH_FUNCTION, _DETACH_ARGS),
                self.function(DROP_FUNCTION, _DROP_ARGS))
            return PartitionDropResult(privilege=privilege)
        has_default = any(p.is_default for p in partitions)
        for partition in partitions:
            if self.stopped():
                return self.result(privilege)
            self.decide(partition, privilege, has_default)
        if not self.stopped():
            self.drop_due(privilege)
        return self.result(privilege)

    def stopped(self) -> bool:
        """Whether a stop was requested (logged once, the first time it is seen)."""
        if not self.should_stop():
            return False
        if not self.stop_logged:
            self.stop_logged = True
            log.warning("drop_expired_partitions stopped on request after %d partitions "
                        "decided; the others stay attached", len(self.decisions))
        return True

    def result(self, privilege: str) -> PartitionDropResult:
        for decision in self.decisions:
            log.debug("%s", decision.describe())
        detached = tuple(d.partition for d in self.decisions if d.action is Action.DETACHED)
        return PartitionDropResult(
            detached=detached,
            dropped=tuple(d.partition for d in self.decisions if d.action is Action.DROPPED),
            rows_removed=sum(d.rows for d in self.decisions if d.action is Action.DETACHED),
            decisions=tuple(self.decisions), privilege=privilege)

    # -- one attached partition ----------------------------------------------------------------

    def decide(self, partition: TablePartition, privilege: str, has_default: bool) -> None:
        checks: list[str] = []

        def kept(reason: str) -> None:
            self.decisions.append(PartitionDecision(partition.qualified_name, Action.KEPT,
                                                    (*checks, reason)))

        if partition.detach_pending:
            ours = privilege == "owner" and self.marked_by_us(partition, state="detaching")
            expired = partition.upper is not None and partition.upper <= self.cutoff
            if not (ours or expired):
                return kept("a detach another session began and left pending; left to it")
            checks.append("a detach this job began and an interrupted run left pending"
                          if ours else "a detach left pending, of a range before the cutoff")
            if privilege == "function":
                # The owner's function checks it and finalizes it; the job's role may not
                # read a partition no longer reached through the table.
                return self.detach_by_function(partition, checks)
        elif partition.is_default:
            return kept("the default partition: its rows are not bounded by a range")
        elif partition.upper is None or partition.upper > self.cutoff:
            # The upper bound is exclusive: a range ending at the cutoff holds only ages before
            # it, prunable with either comparison of the rule (< or <=), and so does the owner's
            # function, which is given the same cutoff. A range ending just past it is left to
            # the batches, which delete the row at the cutoff of an inclusive rule.
            upper = partition.upper.isoformat() if partition.upper else "MAXVALUE"
            return kept(f"upper bound {upper} > cutoff {self.cutoff.isoformat()}")
        else:
            checks.append(f"upper bound {partition.upper.isoformat()} <= cutoff "
                          f"{self.cutoff.isoformat()}")
        try:
            with self.engine.begin() as conn:
                limit_transaction(conn, lock_timeout=self.lock_timeout,
                                  statement_timeout=self.statement_timeout)
                bypassed = list(conn.execute(_BYPASSED, {
                    "p": _quote(partition.schema) + "." + _quote(partition.name),
                    "parent": self.quoted_parent}).scalars())
                if bypassed:
                    return kept("a DROP would bypass " + ", ".join(bypassed))
                checks.append("no DELETE trigger, row-level security, publication or foreign "
                              "key a DROP would bypass")
                kept_row, how = self.kept_row(conn, partition)
                held = self.held_row(conn, partition)
        except sa.exc.DBAPIError as exc:
            return kept(f"check failed ({describe(exc)})")
        if kept_row:
            return kept(f"holds a row the rule keeps ({self.rule.guard_sql} false; {how})")
        if held:
            # Its other rows go through the batches, which skip the held ones.
            return kept(f"holds a row an active hold of {self.rule.hold.qualified_name} "
                        "covers")
        checks.append(f"no row the rule keeps ({how})" if self.rule.guards
                      else "the rule has no guard: every row is prunable")
        if privilege == "owner":
            self.detach_as_owner(partition, checks, concurrently=not has_default)
        else:
            self.detach_by_function(partition, checks)

    def kept_row(self, conn: sa.Connection, partition: TablePartition) -> tuple[bool, str]:
        """Whether the partition holds a row the rule keeps, read through the parent within
        the partition's bounds (the job's role may read the parent, not its partitions), and
        how the plan reads it."""
        if not self.rule.guards:
            return False, "no guard"
        where = [sa.or_(*(g.is_not(None) for g in self.rule.guards))]
        ts = TIMESTAMP(timezone=True)
        if partition.lower is not None:
            where.append(self.rule.age >= sa.bindparam("lower", partition.lower, type_=ts))
        if partition.upper is not None:
            where.append(self.rule.age < sa.bindparam("upper", partition.upper, type_=ts))
        query = sa.select(sa.literal(1)).select_from(self.rule.table).where(*where).limit(1)
        if partition.detach_pending:
            # A pending partition is no longer read through the parent: read it itself.
            query = sa.select(sa.literal(1)).select_from(
                sa.table(partition.name, *(sa.column(g.name) for g in self.rule.guards),
                         schema=partition.schema)).where(
                sa.or_(*(sa.column(g.name).is_not(None) for g in self.rule.guards))).limit(1)
        compiled = query.compile(conn, compile_kwargs={"literal_binds": True})
        plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) "
                                    + str(compiled).replace("%", "%%")).scalar_one()
        how = _plan_summary(plan[0]["Plan"] if isinstance(plan, list) else plan)
        return conn.execute(query).first() is not None, how

    def detach_as_owner(self, partition: TablePartition, checks: list[str], *,
                        concurrently: bool) -> None:
        name = _quote(partition.schema) + "." + _quote(partition.name)
        statement = f"ALTER TABLE {self.quoted_parent} DETACH PARTITION {name}"
        if partition.detach_pending:
            form = "DETACH ... FINALIZE"
        elif concurrently:
            form = "DETACH ... CONCURRENTLY"
        else:
            form = "DETACH (the table has a default partition, which refuses CONCURRENTLY)"
        ours = partition.detach_pending and self.marked_by_us(partition, state="detaching")
        marked = False
        gone: str | None = None

        def attempt() -> None:
            nonlocal marked, gone
            if not partition.detach_pending and not marked:
                # The mark says the detach was ours should this run die before it completes.
                gone = self.mark_detaching(partition)
                if gone is not None:
                    return
                marked = True
            # A CONCURRENTLY whose wait for older snapshots timed out left the detach pending:
            # the next attempt finishes it.
            if self.pending(partition):
                self.alter(statement + " FINALIZE")
            else:
                self.alter(statement + (" CONCURRENTLY" if concurrently else ""))

        error = self.with_lock_retries(form, partition, attempt)
        if gone is not None:
            self.decisions.append(PartitionDecision(partition.qualified_name, Action.KEPT,
                                                    (*checks, gone)))
            return
        if error is not None:
            self.decisions.append(PartitionDecision(
                partition.qualified_name, Action.KEPT,
                (*checks, f"{form} failed ({error}); a later run finishes it")))
            return
        if partition.detach_pending and not ours:
            self.decisions.append(PartitionDecision(
                partition.qualified_name, Action.KEPT_DETACHED,
                (*checks, (f"{form}: a detach another session began, finished; not "
                           "marked, so never dropped by this job"))))
            return
        # Nothing writes to it through the parent any more: the count is exact, and the guard
        # is checked again, as the last check before the table can ever be dropped.
        rows, kept_row, renamed = 0, False, partition

        def count_and_mark() -> None:
            nonlocal rows, kept_row, renamed
            with self.engine.begin() as conn:
                limit_transaction(conn, lock_timeout=self.lock_timeout,
                                  statement_timeout=self.statement_timeout)
                rows = conn.execute(sa.select(sa.func.count()).select_from(
                    sa.table(partition.name, schema=partition.schema))).scalar_one()
                kept_row = self.detached_holds_kept_row(conn, partition)
                if kept_row:
                    self.write_mark(conn, partition, None, rows)
                    return
                # Out of the way of whatever creates partitions by name.
                renamed = self.step_aside(conn, partition)
                self.write_mark(conn, renamed, "detached", rows, partition_was=partition)

        error = self.with_lock_retries("the count and mark of the detached table", partition,
                                       count_and_mark)
        if error is not None:
            log.warning("partition %s was detached from %s, but its rows could not be counted "
                        "and marked (%s): it is not dropped by this job. Attach it again, or "
                        "drop it by hand once checked", partition.qualified_name, self.parent,
                        error)
            self.decisions.append(PartitionDecision(
                partition.qualified_name, Action.KEPT_DETACHED,
                (*checks, f"{form}; then not marked ({error}): not dropped")))
            return
        if kept_row:
            # The row must stay in the table the application reads: attach it again.
            attach = (f"ALTER TABLE {self.quoted_parent} ATTACH PARTITION {name} "
                      f"{_bound_sql(partition)}")
            error = self.with_lock_retries("ATTACH PARTITION", partition,
                                           lambda: self.alter(attach))
            if error is None:
                log.warning("partition %s was detached from %s, but a row the rule keeps "
                            "reached it after the check: attached again",
                            partition.qualified_name, self.parent)
                self.decisions.append(PartitionDecision(
                    partition.qualified_name, Action.KEPT,
                    (*checks, f"{form}; then a row the rule keeps was found: attached again")))
                return
            log.warning("partition %s was detached from %s, but a row the rule keeps reached "
                        "it after the check, and attaching it again failed (%s): it is not "
                        "dropped. Attach it again: ALTER TABLE %s ATTACH PARTITION %s %s",
                        partition.qualified_name, self.parent, error,
                        self.parent, partition.qualified_name, _bound_sql(partition))
            self.decisions.append(PartitionDecision(
                partition.qualified_name, Action.KEPT_DETACHED,
                (*checks, f"{form}; then a row the rule keeps was found: not dropped")))
            return
        self.decisions.append(PartitionDecision(
            partition.qualified_name, Action.DETACHED,
            (*checks, form, f"renamed {renamed.qualified_name}"), rows,
            detached_as=renamed.qualified_name))

    def detach_by_function(self, partition: TablePartition, checks: list[str]) -> None:
        function = self.function(DETACH_FUNCTION, "")
        rows, detached_as = 0, partition.qualified_name

        def call() -> None:
            nonlocal rows, detached_as
            with self.engine.begin() as conn:
                name = _quote(partition.schema) + "." + _quote(partition.name)
                oid = conn.execute(sa.text("SELECT CAST(CAST(:p AS regclass) AS oid)"),
                                   {"p": name}).scalar_one()
                rows = conn.execute(
                    sa.text(f"SELECT {function}(CAST(:p AS regclass), :cutoff, :ms)"),
                    {"p": name, "cutoff": self.cutoff,
                     "ms": _ms_int(self.lock_timeout)}).scalar_one()
                # The function renames the table it detached: its oid stays.
                detached_as = conn.execute(_NAME_OF, {"oid": oid}).scalar_one()

        error = self.with_lock_retries(function, partition, call)
        if error is not None:
            self.decisions.append(PartitionDecision(partition.qualified_name, Action.KEPT,
                                                    (*checks, f"{function}: {error}")))
            return
        done = f"{function} checked it again under its lock and detached it"
        if detached_as == partition.qualified_name:
            log.warning("%s detached %s but left it under the partition's name, which a tool "
                        "that creates partitions by name would reuse: install the owner's "
                        "functions again (favorites-maintenance partition-functions, docs/"
                        "partitioned-tables.md)", function, partition.qualified_name)
        else:
            done += f"; renamed {detached_as}"
        self.decisions.append(PartitionDecision(
            partition.qualified_name, Action.DETACHED, (*checks, done), rows,
            detached_as=detached_as))

    # -- detached tables -------------------------------------------------------------------------

    def drop_due(self, privilege: str) -> None:
        """Drop the tables this job detached from the parent whose retention is over."""
        with self.engine.connect() as conn, conn.begin():
            limit_transaction(conn, lock_timeout=self.lock_timeout,
                              statement_timeout=self.statement_timeout)
            marked = conn.execute(_MARKED, {"mark": MARK + "%"}).all()
            now = conn.execute(sa.select(sa.func.now())).scalar_one()
        just_detached = {name for d in self.decisions
                         if d.action in (Action.DETACHED, Action.KEPT_DETACHED)
                         for name in (d.partition, d.detached_as)}
        for schema, name, description, is_partition in marked:
            mark = _read_mark(description)
            if (mark is None or mark.get("from") != self.parent or is_partition
                    or f"{schema}.{name}" in just_detached):
                continue
            if mark.get("favorites_maintenance") != "detached":
                continue
            table = TablePartition(schema=schema, name=name, lower=None, upper=None)
            at = dt.datetime.fromisoformat(mark["at"])
            was = mark.get("partition")
            checks = [(f"partition {was} " if isinstance(was, str) else "")
                      + f"detached from {self.parent} at {at.isoformat()}"]
            if self.detached_retention is None:
                self.decisions.append(PartitionDecision(
                    table.qualified_name, Action.KEPT_DETACHED,
                    (*checks, "detached_retention is null: kept for good")))
                continue
            due = at + self.detached_retention
            if due > now:
                self.decisions.append(PartitionDecision(
                    table.qualified_name, Action.KEPT_DETACHED,
                    (*checks, (f"kept until {due.isoformat()} (detached_retention "
                               f"{_iso(self.detached_retention)})"))))
                continue
            checks.append(f"detached_retention {_iso(self.detached_retention)} over")
            if privilege == "owner":
                self.drop_as_owner(table, checks, int(mark.get("rows", 0)))
            else:
                self.drop_by_function(table, checks)

    def drop_as_owner(self, table: TablePartition, checks: list[str], rows: int) -> None:
        kept_row = False

        def drop() -> None:
            nonlocal kept_row
            with self.engine.begin() as conn:
                limit_transaction(conn, lock_timeout=self.lock_timeout,
                                  statement_timeout=self.statement_timeout)
                conn.execute(sa.text(f"LOCK TABLE {_quote(table.schema)}.{_quote(table.name)} "
                                     "IN ACCESS EXCLUSIVE MODE"))
                kept_row = self.detached_holds_kept_row(conn, table)
                if not kept_row:
                    conn.execute(sa.text(
                        f"DROP TABLE {_quote(table.schema)}.{_quote(table.name)}"))

        error = self.with_lock_retries("DROP TABLE", table, drop)
        if error is not None or kept_row:
            held = (f", or one an active hold of {self.rule.hold.qualified_name} covers"
                    if self.rule.hold is not None else "")
            reason = (f"DROP TABLE failed ({error})" if error
                      else f"holds a row the rule keeps{held}: not dropped")
            if kept_row:
                log.warning("detached table %s holds a row the rule keeps (%s false)%s: it is "
                            "not dropped", table.qualified_name, self.rule.guard_sql, held)
            self.decisions.append(PartitionDecision(table.qualified_name, Action.KEPT_DETACHED,
                                                    (*checks, reason)))
            return
        self.decisions.append(PartitionDecision(table.qualified_name, Action.DROPPED,
                                                (*checks, "no row the rule keeps; dropped"),
                                                rows))

    def drop_by_function(self, table: TablePartition, checks: list[str]) -> None:
        function = self.function(DROP_FUNCTION, "")
        if self.rule.hold is not None:
            # The owner's function checks the guard, not the holds: a hold placed since the
            # detach would go with the table.
            self.decisions.append(PartitionDecision(table.qualified_name, Action.KEPT_DETACHED, (
                *checks, f"the policy has holds, which {function} does not check: not dropped "
                "(the table's owner drops it once no active hold covers its rows)")))
            return
        rows = 0

        def call() -> None:
            nonlocal rows
            with self.engine.begin() as conn:
                rows = conn.execute(
                    sa.text(f"SELECT {function}(CAST(:p AS regclass), "
                            "CAST(:keep AS interval), :ms)"),
                    {"p": _quote(table.schema) + "." + _quote(table.name),
                     "keep": _iso(self.detached_retention),
                     "ms": _ms_int(self.lock_timeout)}).scalar_one()

        error = self.with_lock_retries(function, table, call)
        if error is not None:
            self.decisions.append(PartitionDecision(table.qualified_name, Action.KEPT_DETACHED,
                                                    (*checks, f"{function}: {error}")))
            return
        self.decisions.append(PartitionDecision(
            table.qualified_name, Action.DROPPED,
            (*checks, f"{function} checked it again and dropped it"), rows))

    # -- helpers -------------------------------------------------------------------------------

    def held_row(self, conn: sa.Connection, partition: TablePartition) -> bool:
        """Whether an active hold covers a row of the partition, read through the parent
        within its bounds (the partition itself when its detach is pending)."""
        if self.rule.hold is None:
            return False
        if partition.detach_pending:
            return self.detached_holds_kept_row(conn, partition, guards=False)
        ts = TIMESTAMP(timezone=True)
        where = [self.rule.hold.covers(self.rule.hold_column)]
        if partition.lower is not None:
            where.append(self.rule.age >= sa.bindparam("lower", partition.lower, type_=ts))
        if partition.upper is not None:
            where.append(self.rule.age < sa.bindparam("upper", partition.upper, type_=ts))
        return conn.execute(sa.select(sa.literal(1)).select_from(self.rule.table)
                            .where(*where).limit(1)).first() is not None

    def detached_holds_kept_row(self, conn: sa.Connection, table: TablePartition,
                                guards: bool = True) -> bool:
        if self.rule.hold is not None:
            # A hold placed after the detach keeps the detached table from being dropped.
            t = sa.table(table.name, sa.column(self.rule.hold.column), schema=table.schema)
            if conn.execute(sa.select(sa.literal(1)).select_from(t).where(
                    self.rule.hold.covers(t.c[self.rule.hold.column])).limit(1)
            ).first() is not None:
                return True
        if not self.rule.guards or not guards:
            return False
        t = sa.table(table.name, *(sa.column(g.name) for g in self.rule.guards),
                     schema=table.schema)
        return conn.execute(sa.select(sa.literal(1)).select_from(t).where(
            sa.or_(*(t.c[g.name].is_not(None) for g in self.rule.guards))).limit(1)
        ).first() is not None

    def alter(self, statement: str) -> None:
        """Run one ``ALTER TABLE`` outside a transaction block (``CONCURRENTLY`` demands it),
        under ``lock_timeout`` set for the session and reset after."""
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("SELECT set_config('lock_timeout', :ms, false)"),
                         {"ms": _ms(self.lock_timeout)})
            try:
                conn.exec_driver_sql(statement)
            finally:
                if not conn.invalidated:
                    with contextlib.suppress(sa.exc.DBAPIError):
                        conn.exec_driver_sql("RESET lock_timeout")

    def with_lock_retries(self, what: str, table: TablePartition,
                          attempt: Callable[[], None]) -> str | None:
        """Run ``attempt``; after a lock timeout, again up to :data:`LOCK_ATTEMPTS` times with
        a doubling pause. Returns ``None`` on success, else why it failed (for the log)."""
        pause = LOCK_BACKOFF_S
        for number in range(1, LOCK_ATTEMPTS + 1):
            try:
                attempt()
                return None
            except sa.exc.DBAPIError as exc:
                error = describe(exc)
                refused = _refusal(exc)
                if refused is not None:
                    return refused
                if error.kind is not ErrorKind.LOCK_NOT_AVAILABLE or number == LOCK_ATTEMPTS:
                    log.warning("%s of %s failed: %s", what, table.qualified_name,
                                error)
                    return error
                log.warning("%s of %s: lock_timeout (%s) on attempt %d/%d; again in %g s",
                            what, table.qualified_name, _ms(self.lock_timeout), number,
                            LOCK_ATTEMPTS, pause)
                if self.pause_or_stop(pause):
                    return "a stop was requested before the next attempt"
                pause *= 2
        return "no attempt left"  # pragma: no cover - the loop returns

    def pause_or_stop(self, seconds: float) -> bool:
        """Sleep ``seconds``, polling :attr:`should_stop` every tenth of a second; whether a
        stop was requested."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.stopped():
                return True
            time.sleep(min(left, 0.1))
        return self.stopped()

    def write_mark(self, conn: sa.Connection, partition: TablePartition, state: str | None,
                   rows: int, *, partition_was: TablePartition | None = None) -> None:
        """Write (or, ``state`` None, clear) the job's comment on ``partition``, in the open
        transaction of ``conn``; ``partition_was``: the partition a detached table was (its
        name and bounds are recorded)."""
        name = _quote(partition.schema) + "." + _quote(partition.name)
        if state is None:
            conn.execute(sa.text(f"COMMENT ON TABLE {name} IS NULL"))
            return
        now = conn.execute(sa.select(sa.func.now())).scalar_one().astimezone(_UTC)
        mark = {"favorites_maintenance": state, "from": self.parent}
        if partition_was is not None:
            mark |= {"partition": partition_was.qualified_name,
                     "bounds": _bound_sql(partition_was)}
        text = json.dumps({**mark, "at": now.isoformat(), "rows": rows})
        literal = "'" + text.replace("'", "''") + "'"
        conn.execute(sa.text(f"COMMENT ON TABLE {name} IS "
                             + literal.replace(":", r"\:")))

    def step_aside(self, conn: sa.Connection, partition: TablePartition) -> TablePartition:
        """Rename the table ``partition`` was, just detached, to a free name
        (:data:`DETACHED_SUFFIX`), in the open transaction of ``conn``; returns it under its
        new name."""
        for n in itertools.count(1):
            suffix = DETACHED_SUFFIX + (f"_{n}" if n > 1 else "")
            room = _MAX_NAME_BYTES - len(suffix.encode())
            candidate = partition.name.encode()[:room].decode(errors="ignore") + suffix
            qualified = _quote(partition.schema) + "." + _quote(candidate)
            if conn.execute(_NAME_FREE, {"t": qualified}).scalar_one():
                break
        conn.execute(sa.text(f"ALTER TABLE {_quote(partition.schema)}.{_quote(partition.name)} "
                             f"RENAME TO {_quote(candidate)}"))
        return dataclasses.replace(partition, name=candidate)

    def mark_detaching(self, partition: TablePartition) -> str | None:
        """Mark ``partition`` as being detached by this job, if it is still an attached
        partition of the parent; else say why not (another session detached it, or began to,
        since the partitions were read: its mark is left as that session wrote it).

        The partition is locked (``SHARE UPDATE EXCLUSIVE``, as a ``DETACH`` locks it) while
        this is checked and the comment written, so another run's detach cannot pass between."""
        name = _quote(partition.schema) + "." + _quote(partition.name)
        with self.engine.begin() as conn:
            limit_transaction(conn, lock_timeout=self.lock_timeout,
                              statement_timeout=self.statement_timeout)
            if conn.execute(sa.text("SELECT to_regclass(:p)"), {"p": name}).scalar() is None:
                # Another run detached it and renamed it.
                return "detached by another session meanwhile; left to it"
            conn.execute(sa.text(f"LOCK TABLE {name} IN SHARE UPDATE EXCLUSIVE MODE"))
            pending = conn.execute(sa.text(
                "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = CAST(:p AS regclass) "
                "AND inhparent = CAST(:parent AS regclass)"),
                {"p": name, "parent": self.quoted_parent}).scalar()
            if pending is None:
                return "detached by another session meanwhile; left to it"
            if pending:
                return "a detach another session began meanwhile; left to it"
            self.write_mark(conn, partition, "detaching", 0)
        return None

    def pending(self, partition: TablePartition) -> bool:
        """Whether a detach of ``partition`` is pending (``pg_inherits.inhdetachpending``)."""
        with self.engine.connect() as conn:
            return bool(conn.execute(sa.text(
                "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = CAST(:p AS regclass)"),
                {"p": _quote(partition.schema) + "." + _quote(partition.name)}).scalar())

    def marked_by_us(self, partition: TablePartition, *, state: str) -> bool:
        with self.engine.connect() as conn:
            description = conn.execute(
                sa.text("SELECT obj_description(CAST(:p AS regclass), 'pg_class')"),
                {"p": _quote(partition.schema) + "." + _quote(partition.name)}).scalar_one()
        mark = _read_mark(description)
        return bool(mark and mark.get("from") == self.parent
                    and mark.get("favorites_maintenance") == state)


def _read_mark(description: str | None) -> dict | None:
    if not description or not description.startswith(MARK):
        return None
    try:
        mark = json.loads(description)
    except ValueError:
        return None
    return mark if isinstance(mark, dict) and isinstance(mark.get("at"), str) else None


def _refusal(exc: sa.exc.DBAPIError) -> str | None:
    """The reason the owner's function gave for keeping a table (it raises SQLSTATE 55000
    with a message starting ``kept:``, naming schema objects only), else ``None``."""
    orig = getattr(exc, "orig", None)
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None) or ""
    if getattr(orig, "sqlstate", None) == "55000" and primary.startswith("kept: "):
        return primary.removeprefix("kept: ")
    return None


def _plan_summary(plan: dict) -> str:
    """``index scan on favorites_20240101_user_id_idx`` / ``sequential scan of ...``: how the
    guard check's plan reads the partition."""
    stack = [plan]
    while stack:
        node = stack.pop()
        kind = node.get("Node Type", "")
        if "Index" in kind and node.get("Index Name"):
            return f"{kind.lower()} on {node['Index Name']}"
        if kind == "Seq Scan":
            # The planner's choice: an index on the guard may exist, unused on a small table.
            return (f"sequential scan of {node.get('Relation Name')}: the plan uses no index "
                    "for the guard check")
        if kind == "Result" and "Plans" not in node:
            return "no partition in range"
        stack.extend(reversed(node.get("Plans", [])))
    return "plan read"


def _bound_sql(partition: TablePartition) -> str:
    if partition.is_default:
        return "DEFAULT"
    lower = f"('{partition.lower.isoformat()}')" if partition.lower else "(MINVALUE)"
    upper = f"('{partition.upper.isoformat()}')" if partition.upper else "(MAXVALUE)"
    return f"FOR VALUES FROM {lower} TO {upper}"


def _iso(value: dt.timedelta | None) -> str:
    """ISO 8601: ``P7D``, ``P1DT12H``, ``PT0S``; ``null`` for ``None``."""
    if value is None:
        return "null"
    days, seconds = value.days, value.seconds + value.microseconds / 1e6
    time_part = f"T{seconds:g}S" if seconds else ""
    return f"P{days}D{time_part}" if days else f"PT{seconds:g}S"


def _ms(value: dt.timedelta) -> str:
    return f"{max(1, round(value.total_seconds() * 1000))}ms"


def _ms_int(value: dt.timedelta) -> int:
    return max(1, round(value.total_seconds() * 1000))
