"""A range-partitioned table's partitions, as PostgreSQL's catalogs describe them.

"Partition" in the retention core means a PostgreSQL table partition (``PARTITION BY RANGE``);
a run's day is a Dagster partition, in ``pipeline/partitions.py``. A table partitioned by range
on the rule's age column (``PARTITION BY RANGE (<age>)``) is read from the catalogs
(``pg_partitioned_table``, ``pg_inherits``, ``pg_class.relpartbound``) into
:class:`TablePartition` values, one per partition, so that the purge can treat each partition
on its own.

The catalogs are readable by every role, so reading them needs no privilege the job lacks.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.retention.errors import TableShapeError
from favorites_maintenance.retention.rule import AgeRange

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
    def quoted_name(self) -> str:
        """``"schema"."name"``, quoted for the statements Core cannot say."""
        return quote_identifier(self.schema) + "." + quote_identifier(self.name)

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
    name = quote_identifier(schema) + "." + quote_identifier(table)
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


def quote_identifier(identifier: str) -> str:
    """``my"table`` -> ``"my""table"``: an identifier quoted for the statements Core cannot
    say (``ALTER TABLE ... DETACH PARTITION``, ``COMMENT ON``, ``LOCK TABLE``)."""
    return '"' + identifier.replace('"', '""') + '"'


def _unquote(literal: str) -> str:
    """``'2024-01-01 00:00:00+00'`` -> ``2024-01-01 00:00:00+00``."""
    if len(literal) >= 2 and literal[0] == "'" and literal[-1] == "'":
        return literal[1:-1].replace("''", "'")
    return literal


def bound_sql(partition: TablePartition) -> str:
    """The partition's ``FOR VALUES`` clause (``FOR VALUES FROM ('...') TO ('...')``, with
    ``MINVALUE``/``MAXVALUE`` for an open end), or ``DEFAULT``."""
    if partition.is_default:
        return "DEFAULT"
    lower = f"('{partition.lower.isoformat()}')" if partition.lower else "(MINVALUE)"
    upper = f"('{partition.upper.isoformat()}')" if partition.upper else "(MAXVALUE)"
    return f"FOR VALUES FROM {lower} TO {upper}"
