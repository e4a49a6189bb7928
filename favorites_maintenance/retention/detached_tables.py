"""Dropping the tables the drop phase detached once their ``detached_retention`` is over,
as the table's owner or through the owner's function, each checked again first (the drop
phase's second part; see
:func:`~favorites_maintenance.retention.partitioned.drop_expired_partitions`).
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.partition_checks import detached_holds_kept_row
from favorites_maintenance.retention.partition_marks import marked_tables, read_mark
from favorites_maintenance.retention.partition_phase import (
    DROP_FUNCTION,
    Action,
    DropPhase,
    PartitionDecision,
    iso,
    log,
    ms_int,
)
from favorites_maintenance.retention.table_partitions import TablePartition


def drop_due(phase: DropPhase, privilege: str) -> None:
    """Drop the tables this job detached from the parent whose retention is over."""
    with phase.engine.connect() as conn, conn.begin():
        limit_transaction(conn, lock_timeout=phase.lock_timeout,
                          statement_timeout=phase.statement_timeout)
        marked = marked_tables(conn)
        now = conn.execute(sa.select(sa.func.now())).scalar_one()
    just_detached = {name for d in phase.decisions
                     if d.action in (Action.DETACHED, Action.KEPT_DETACHED)
                     for name in (d.partition, d.detached_as)}
    for schema, name, description, is_partition in marked:
        mark = read_mark(description)
        if (mark is None or mark.get("from") != phase.parent or is_partition
                or f"{schema}.{name}" in just_detached):
            continue
        if mark.get("favorites_maintenance") != "detached":
            continue
        table = TablePartition(schema=schema, name=name, lower=None, upper=None)
        at = dt.datetime.fromisoformat(mark["at"])
        was = mark.get("partition")
        checks = [(f"partition {was} " if isinstance(was, str) else "")
                  + f"detached from {phase.parent} at {at.isoformat()}"]
        if phase.detached_retention is None:
            phase.decisions.append(PartitionDecision(
                table.qualified_name, Action.KEPT_DETACHED,
                (*checks, "detached_retention is null: kept for good")))
            continue
        due = at + phase.detached_retention
        if due > now:
            phase.decisions.append(PartitionDecision(
                table.qualified_name, Action.KEPT_DETACHED,
                (*checks, (f"kept until {due.isoformat()} (detached_retention "
                           f"{iso(phase.detached_retention)})"))))
            continue
        checks.append(f"detached_retention {iso(phase.detached_retention)} over")
        if privilege == "owner":
            drop_as_owner(phase, table, checks, int(mark.get("rows", 0)))
        else:
            drop_by_function(phase, table, checks)

def drop_as_owner(phase: DropPhase, table: TablePartition, checks: list[str],
                  rows: int) -> None:
    """Drop the detached ``table`` (``rows`` counted when it was detached) under an ``ACCESS
    EXCLUSIVE`` lock, unless it holds a row the rule keeps or a hold covers."""
    kept_row = False

    def drop() -> None:
        nonlocal kept_row
        with phase.engine.begin() as conn:
            limit_transaction(conn, lock_timeout=phase.lock_timeout,
                              statement_timeout=phase.statement_timeout)
            conn.execute(sa.text(f"LOCK TABLE {table.quoted_name} "
                                 "IN ACCESS EXCLUSIVE MODE"))
            kept_row = detached_holds_kept_row(conn, phase.rule, table)
            if not kept_row:
                conn.execute(sa.text(
                    f"DROP TABLE {table.quoted_name}"))

    error = phase.with_lock_retries("DROP TABLE", table, drop)
    if error is not None or kept_row:
        held = (f", or one an active hold of {phase.rule.hold.qualified_name} covers"
                if phase.rule.hold is not None else "")
        reason = (f"DROP TABLE failed ({error})" if error
                  else f"holds a row the rule keeps{held}: not dropped")
        if kept_row:
            log.warning("detached table %s holds a row the rule keeps (%s false)%s: it is "
                        "not dropped", table.qualified_name, phase.rule.guard_sql, held)
        phase.decisions.append(PartitionDecision(table.qualified_name, Action.KEPT_DETACHED,
                                                (*checks, reason)))
        return
    phase.decisions.append(PartitionDecision(table.qualified_name, Action.DROPPED,
                                            (*checks, "no row the rule keeps; dropped"),
                                            rows))

def drop_by_function(phase: DropPhase, table: TablePartition, checks: list[str]) -> None:
    """Drop the detached ``table`` through the owner's :data:`DROP_FUNCTION`; never for a policy
    with holds, which the function does not check."""
    function = phase.function(DROP_FUNCTION, "")
    if phase.rule.hold is not None:
        # The owner's function checks the guard, not the holds: a hold placed since the
        # detach would go with the table.
        phase.decisions.append(PartitionDecision(table.qualified_name, Action.KEPT_DETACHED, (
            *checks, f"the policy has holds, which {function} does not check: not dropped "
            "(the table's owner drops it once no active hold covers its rows)")))
        return
    rows = 0

    def call() -> None:
        nonlocal rows
        with phase.engine.begin() as conn:
            rows = conn.execute(
                sa.text(f"SELECT {function}(CAST(:p AS regclass), "
                        "CAST(:keep AS interval), :ms)"),
                {"p": table.quoted_name,
                 "keep": iso(phase.detached_retention),
                 "ms": ms_int(phase.lock_timeout)}).scalar_one()

    error = phase.with_lock_retries(function, table, call)
    if error is not None:
        phase.decisions.append(PartitionDecision(table.qualified_name, Action.KEPT_DETACHED,
                                                (*checks, f"{function}: {error}")))
        return
    phase.decisions.append(PartitionDecision(
        table.qualified_name, Action.DROPPED,
        (*checks, f"{function} checked it again and dropped it"), rows))
