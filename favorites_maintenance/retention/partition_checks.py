"""The checks the drop phase runs on a table partition before it detaches or drops it: what a
``DETACH`` and ``DROP`` would bypass, a row the rule keeps (its guard), a row an active hold
covers. Each reads the catalogs or the table in the caller's transaction.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP

from favorites_maintenance.retention.backlog import compared_as_batches
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.table_partitions import TablePartition

#: What a DETACH and DROP would bypass, for partition ``:p`` of ``:parent``: one phrase each.
def bypass_query(part: str, parent: str) -> str:
    """The query listing what a ``DETACH`` and ``DROP`` of partition ``part`` of ``parent``
    would bypass, one phrase a row (column ``b``): a DELETE trigger on either, row-level
    security on either, a publication that publishes deletes of either, a foreign key
    referencing either. ``part`` and ``parent`` are SQL expressions of type ``regclass``. The
    job's check before a detach and the owner's detach function
    (``least_privilege_partitions.sql``, which checks again under its lock) run this text."""
    return f"""
    SELECT format('DELETE trigger %I on %s', t.tgname, t.tgrelid::regclass) AS b
      FROM pg_trigger t
     WHERE t.tgrelid IN ({part}, {parent}) AND NOT t.tgisinternal AND t.tgtype & 8 <> 0
    UNION ALL
    SELECT format('row-level security on %s', c.oid::regclass)
      FROM pg_class c WHERE c.oid IN ({part}, {parent}) AND c.relrowsecurity
    UNION ALL
    SELECT format('publication %I', p.pubname)
      FROM pg_publication p
     WHERE p.pubdelete AND EXISTS (
           SELECT 1 FROM pg_publication_tables pt
            WHERE pt.pubname = p.pubname
              AND to_regclass(format('%I.%I', pt.schemaname, pt.tablename)) IN ({part}, {parent}))
    UNION ALL
    SELECT format('foreign key %I of %s', k.conname, k.conrelid::regclass)
      FROM pg_constraint k
     WHERE k.contype = 'f' AND k.conparentid = 0 AND k.confrelid IN ({part}, {parent})
"""


_BYPASSED = sa.text(bypass_query("CAST(:p AS regclass)", "CAST(:parent AS regclass)"))


def bypassed_by_drop(conn: sa.Connection, partition: TablePartition,
                     quoted_parent: str) -> list[str]:
    """What a ``DETACH`` and ``DROP`` of ``partition`` would bypass, one phrase each (``DELETE
    trigger t on favorites.favorites``, ``publication p``, ...); empty when nothing."""
    return list(conn.execute(_BYPASSED, {
        "p": partition.quoted_name,
        "parent": quoted_parent}).scalars())


def find_kept_row(conn: sa.Connection, rule: RetentionRule,
         partition: TablePartition) -> tuple[bool, str]:
    """Whether the partition holds a row the rule keeps, read through the parent within
    the partition's bounds (the job's role may read the parent, not its partitions), and
    how the plan reads it."""
    if not rule.guards:
        return False, "no guard"
    where = [sa.or_(*(g.is_not(None) for g in rule.guards))]
    ts = TIMESTAMP(timezone=True)
    if partition.lower is not None:
        where.append(rule.age >= sa.bindparam("lower", partition.lower, type_=ts))
    if partition.upper is not None:
        where.append(rule.age < sa.bindparam("upper", partition.upper, type_=ts))
    query = sa.select(sa.literal(1)).select_from(rule.table).where(*where).limit(1)
    if partition.detach_pending:
        # A pending partition is no longer read through the parent: read it itself.
        query = sa.select(sa.literal(1)).select_from(
            sa.table(partition.name, *(sa.column(g.name) for g in rule.guards),
                     schema=partition.schema)).where(
            sa.or_(*(sa.column(g.name).is_not(None) for g in rule.guards))).limit(1)
    compiled = query.compile(conn, compile_kwargs={"literal_binds": True})
    plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) "
                                + str(compiled).replace("%", "%%")).scalar_one()
    how = _plan_summary(plan[0]["Plan"] if isinstance(plan, list) else plan)
    return conn.execute(query).first() is not None, how


def find_held_row(conn: sa.Connection, rule: RetentionRule, partition: TablePartition) -> bool:
    """Whether an active hold covers a row of the partition, read through the parent
    within its bounds (the partition itself when its detach is pending), the holds read as
    the batches read them (a hold ``042`` covers the bigint 42).

    Raises:
        sqlalchemy.exc.DBAPIError: the table or the hold table cannot be read.
    """
    if rule.hold is None:
        return False
    if partition.detach_pending:
        return detached_holds_kept_row(conn, rule, partition, guards=False)
    rule = compared_as_batches(conn, rule)
    ts = TIMESTAMP(timezone=True)
    where = [rule.hold.covers(rule.hold_column)]
    if partition.lower is not None:
        where.append(rule.age >= sa.bindparam("lower", partition.lower, type_=ts))
    if partition.upper is not None:
        where.append(rule.age < sa.bindparam("upper", partition.upper, type_=ts))
    return conn.execute(sa.select(sa.literal(1)).select_from(rule.table)
                        .where(*where).limit(1)).first() is not None


def detached_holds_kept_row(conn: sa.Connection, rule: RetentionRule, table: TablePartition,
                            guards: bool = True) -> bool:
    """Whether the detached table (or a partition whose detach is pending), read itself,
    holds a row an active hold covers or, with ``guards``, a row the rule keeps; the holds
    read as the batches read them, in the type of the parent's hold column.

    Raises:
        sqlalchemy.exc.DBAPIError: the table or the hold table cannot be read.
    """
    if rule.hold is not None:
        # A hold placed after the detach keeps the detached table from being dropped; one
        # written 042 holds the bigint 42 for the batches, so it keeps the table too.
        hold = compared_as_batches(conn, rule).hold
        t = sa.table(table.name, sa.column(hold.column), schema=table.schema)
        if conn.execute(sa.select(sa.literal(1)).select_from(t).where(
                hold.covers(t.c[hold.column])).limit(1)
        ).first() is not None:
            return True
    if not rule.guards or not guards:
        return False
    t = sa.table(table.name, *(sa.column(g.name) for g in rule.guards),
                 schema=table.schema)
    return conn.execute(sa.select(sa.literal(1)).select_from(t).where(
        sa.or_(*(t.c[g.name].is_not(None) for g in rule.guards))).limit(1)
    ).first() is not None


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
