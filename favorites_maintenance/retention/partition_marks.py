"""The marks the drop phase leaves on the tables it detaches: a comment saying whose it is and
when it left the table, and a new name out of the way of whatever creates partitions by name.
A later run reads them to finish an interrupted detach and to know when to drop the table.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json

import sqlalchemy as sa

from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.partition_phase import DropPhase
from favorites_maintenance.retention.table_partitions import (
    TablePartition,
    bound_sql,
    quote_identifier,
)

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

#: PostgreSQL's longest name, in bytes.
_MAX_NAME_BYTES = 63


def marked_tables(conn: sa.Connection) -> list[sa.Row]:
    """The tables this job marked, any parent's: ``(schema, name, comment, is a partition
    again)`` each, by schema and name."""
    return list(conn.execute(_MARKED, {"mark": MARK + "%"}).all())


def write_mark(phase: DropPhase, conn: sa.Connection, partition: TablePartition,
               state: str | None, rows: int, *,
               partition_was: TablePartition | None = None) -> None:
    """Write (or, ``state`` None, clear) the job's comment on ``partition``, in the open
    transaction of ``conn``; ``partition_was``: the partition a detached table was (its
    name and bounds are recorded)."""
    name = partition.quoted_name
    if state is None:
        conn.execute(sa.text(f"COMMENT ON TABLE {name} IS NULL"))
        return
    now = conn.execute(sa.select(sa.func.now())).scalar_one().astimezone(dt.UTC)
    mark = {"favorites_maintenance": state, "from": phase.parent}
    if partition_was is not None:
        mark |= {"partition": partition_was.qualified_name,
                 "bounds": bound_sql(partition_was)}
    text = json.dumps({**mark, "at": now.isoformat(), "rows": rows})
    literal = "'" + text.replace("'", "''") + "'"
    conn.execute(sa.text(f"COMMENT ON TABLE {name} IS "
                         + literal.replace(":", r"\:")))


def step_aside(conn: sa.Connection, partition: TablePartition) -> TablePartition:
    """Rename the table ``partition`` was, just detached, to a free name
    (:data:`DETACHED_SUFFIX`), in the open transaction of ``conn``; returns it under its
    new name."""
    for n in itertools.count(1):
        suffix = DETACHED_SUFFIX + (f"_{n}" if n > 1 else "")
        room = _MAX_NAME_BYTES - len(suffix.encode())
        candidate = partition.name.encode()[:room].decode(errors="ignore") + suffix
        qualified = quote_identifier(partition.schema) + "." + quote_identifier(candidate)
        if conn.execute(_NAME_FREE, {"t": qualified}).scalar_one():
            break
    conn.execute(sa.text(f"ALTER TABLE {partition.quoted_name} "
                         f"RENAME TO {quote_identifier(candidate)}"))
    return dataclasses.replace(partition, name=candidate)


#: Why a partition listed by this run is left alone: another run detached and renamed it.
GONE = "detached by another session meanwhile; left to it"


def mark_detaching(phase: DropPhase, partition: TablePartition) -> str | None:
    """Mark ``partition`` as being detached by this job, if it is still an attached
    partition of the parent; else say why not (another session detached it, or began to,
    since the partitions were read: its mark is left as that session wrote it).

    The partition is locked (``SHARE UPDATE EXCLUSIVE``, as a ``DETACH`` locks it) while
    this is checked and the comment written, so another run's detach cannot pass between."""
    name = partition.quoted_name
    with phase.engine.begin() as conn:
        limit_transaction(conn, lock_timeout=phase.lock_timeout,
                          statement_timeout=phase.statement_timeout)
        if _gone(conn, partition):
            return GONE  # another run detached it and renamed it
        conn.execute(sa.text(f"LOCK TABLE {name} IN SHARE UPDATE EXCLUSIVE MODE"))
        pending = conn.execute(sa.text(
            "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = CAST(:p AS regclass) "
            "AND inhparent = CAST(:parent AS regclass)"),
            {"p": name, "parent": phase.quoted_parent}).scalar()
        if pending is None:
            return GONE
        if pending:
            return "a detach another session began meanwhile; left to it"
        write_mark(phase, conn, partition, "detaching", 0)
    return None


def pending(engine: sa.Engine, partition: TablePartition) -> bool:
    """Whether a detach of ``partition`` is pending (``pg_inherits.inhdetachpending``)."""
    with engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = CAST(:p AS regclass)"),
            {"p": partition.quoted_name}).scalar())


def gone(engine: sa.Engine, partition: TablePartition) -> bool:
    """Whether no table bears ``partition``'s name any more: another session (a second run
    of the policy) detached and renamed it, or dropped it, since this run listed it."""
    with engine.connect() as conn:
        return _gone(conn, partition)


def _gone(conn: sa.Connection, partition: TablePartition) -> bool:
    return conn.execute(sa.text("SELECT to_regclass(:p)"),
                        {"p": partition.quoted_name}).scalar() is None


def marked_by_us(phase: DropPhase, partition: TablePartition, *, state: str) -> bool:
    """Whether ``partition`` bears this job's mark for the phase's table, in ``state``
    (``detaching``: a detach this job began); ``False`` when the table is :func:`gone`."""
    with phase.engine.connect() as conn:
        description = conn.execute(
            sa.text("SELECT obj_description(to_regclass(:p), 'pg_class')"),
            {"p": partition.quoted_name}).scalar_one()
    mark = read_mark(description)
    return bool(mark and mark.get("from") == phase.parent
                and mark.get("favorites_maintenance") == state)


def read_mark(description: str | None) -> dict | None:
    """The job's mark in a table's comment (a dict with ``at``, an ISO instant), else
    ``None``: no comment, another's, or one not readable."""
    if not description or not description.startswith(MARK):
        return None
    try:
        mark = json.loads(description)
    except ValueError:
        return None
    return mark if isinstance(mark, dict) and isinstance(mark.get("at"), str) else None
