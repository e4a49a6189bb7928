"""Detaching an attached table partition: the checks that decide it, then the ``DETACH`` as
the table's owner or through the owner's function (the drop phase's first part; see
:func:`~favorites_maintenance.retention.partitioned.drop_expired_partitions`).
"""

from __future__ import annotations

import sqlalchemy as sa

from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.errors import describe
from favorites_maintenance.retention.partition_checks import (
    bypassed_by_drop,
    detached_holds_kept_row,
    find_held_row,
    find_kept_row,
)
from favorites_maintenance.retention.partition_marks import (
    GONE,
    gone,
    mark_detaching,
    marked_by_us,
    pending,
    step_aside,
    write_mark,
)
from favorites_maintenance.retention.partition_phase import (
    DETACH_FUNCTION,
    Action,
    DropPhase,
    PartitionDecision,
    log,
    ms_int,
)
from favorites_maintenance.retention.table_partitions import TablePartition, bound_sql

#: ``schema.name`` of the relation ``:oid``.
_NAME_OF = sa.text("SELECT format('%s.%s', n.nspname, c.relname) FROM pg_class c "
                   "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = :oid")


def decide(phase: DropPhase, partition: TablePartition, privilege: str,
           has_default: bool) -> None:
    """Check one attached partition (or one whose detach is pending) and detach it when every
    check holds, as ``privilege`` allows (``owner`` or ``function``); the decision is appended
    to ``phase.decisions``, the reason last when it is kept."""
    checks: list[str] = []

    def kept(reason: str) -> None:
        phase.decisions.append(PartitionDecision(partition.qualified_name, Action.KEPT,
                                                (*checks, reason)))

    if partition.detach_pending:
        # Another run's detach, pending while this run listed the partitions, may have
        # finished since and renamed the table.
        if gone(phase.engine, partition):
            return kept(GONE)
        ours = privilege == "owner" and marked_by_us(phase, partition, state="detaching")
        expired = partition.upper is not None and partition.upper <= phase.cutoff
        if not (ours or expired):
            return kept("a detach another session began and left pending; left to it")
        checks.append("a detach this job began and an interrupted run left pending"
                      if ours else "a detach left pending, of a range before the cutoff")
        if privilege == "function":
            # The owner's function checks it and finalizes it; the job's role may not
            # read a partition no longer reached through the table.
            return detach_by_function(phase, partition, checks)
    elif partition.is_default:
        return kept("the default partition: its rows are not bounded by a range")
    elif partition.upper is None or partition.upper > phase.cutoff:
        # The upper bound is exclusive: a range ending at the cutoff holds only ages before
        # it, prunable with either comparison of the rule (< or <=), and so does the owner's
        # function, which is given the same cutoff. A range ending just past it is left to
        # the batches, which delete the row at the cutoff of an inclusive rule.
        upper = partition.upper.isoformat() if partition.upper else "MAXVALUE"
        return kept(f"upper bound {upper} > cutoff {phase.cutoff.isoformat()}")
    else:
        checks.append(f"upper bound {partition.upper.isoformat()} <= cutoff "
                      f"{phase.cutoff.isoformat()}")
    try:
        with phase.engine.begin() as conn:
            limit_transaction(conn, lock_timeout=phase.lock_timeout,
                              statement_timeout=phase.statement_timeout)
            bypassed = bypassed_by_drop(conn, partition, phase.quoted_parent)
            if bypassed:
                return kept("a DROP would bypass " + ", ".join(bypassed))
            checks.append("no DELETE trigger, row-level security, publication or foreign "
                          "key a DROP would bypass")
            kept_row, how = find_kept_row(conn, phase.rule, partition)
            held = find_held_row(conn, phase.rule, partition)
    except sa.exc.DBAPIError as exc:
        return kept(f"check failed ({describe(exc)})")
    if kept_row:
        return kept(f"holds a row the rule keeps ({phase.rule.guard_sql} false; {how})")
    if held:
        # Its other rows go through the batches, which skip the held ones.
        return kept(f"holds a row an active hold of {phase.rule.hold.qualified_name} "
                    "covers")
    checks.append(f"no row the rule keeps ({how})" if phase.rule.guards
                  else "the rule has no guard: every row is prunable")
    if privilege == "owner":
        detach_as_owner(phase, partition, checks, concurrently=not has_default)
    else:
        detach_by_function(phase, partition, checks)


def detach_as_owner(phase: DropPhase, partition: TablePartition, checks: list[str], *,
                    concurrently: bool) -> None:
    """Detach ``partition`` as the table's owner (``CONCURRENTLY`` unless ``concurrently`` is
    false), marked first, then counted, checked again, renamed and marked as detached; a row
    the rule keeps found after the detach attaches it again."""
    name = partition.quoted_name
    statement = f"ALTER TABLE {phase.quoted_parent} DETACH PARTITION {name}"
    if partition.detach_pending:
        form = "DETACH ... FINALIZE"
    elif concurrently:
        form = "DETACH ... CONCURRENTLY"
    else:
        form = "DETACH (the table has a default partition, which refuses CONCURRENTLY)"
    ours = partition.detach_pending and marked_by_us(phase, partition, state="detaching")
    marked = False
    gone: str | None = None

    def attempt() -> None:
        nonlocal marked, gone
        if not partition.detach_pending and not marked:
            # The mark says the detach was ours should this run die before it completes.
            gone = mark_detaching(phase, partition)
            if gone is not None:
                return
            marked = True
        # A CONCURRENTLY whose wait for older snapshots timed out left the detach pending:
        # the next attempt finishes it.
        if pending(phase.engine, partition):
            phase.alter(statement + " FINALIZE")
        else:
            phase.alter(statement + (" CONCURRENTLY" if concurrently else ""))

    error = phase.with_lock_retries(form, partition, attempt)
    if gone is not None:
        phase.decisions.append(PartitionDecision(partition.qualified_name, Action.KEPT,
                                                (*checks, gone)))
        return
    if error is not None:
        phase.decisions.append(PartitionDecision(
            partition.qualified_name, Action.KEPT,
            (*checks, f"{form} failed ({error}); a later run finishes it")))
        return
    if partition.detach_pending and not ours:
        phase.decisions.append(PartitionDecision(
            partition.qualified_name, Action.KEPT_DETACHED,
            (*checks, (f"{form}: a detach another session began, finished; not "
                       "marked, so never dropped by this job"))))
        return
    # Nothing writes to it through the parent any more: the count is exact, and the guard
    # is checked again, as the last check before the table can ever be dropped.
    rows, kept_row, renamed = 0, False, partition

    def count_and_mark() -> None:
        nonlocal rows, kept_row, renamed
        with phase.engine.begin() as conn:
            limit_transaction(conn, lock_timeout=phase.lock_timeout,
                              statement_timeout=phase.statement_timeout)
            rows = conn.execute(sa.select(sa.func.count()).select_from(
                sa.table(partition.name, schema=partition.schema))).scalar_one()
            kept_row = detached_holds_kept_row(conn, phase.rule, partition)
            if kept_row:
                write_mark(phase, conn, partition, None, rows)
                return
            # Out of the way of whatever creates partitions by name.
            renamed = step_aside(conn, partition)
            write_mark(phase, conn, renamed, "detached", rows, partition_was=partition)

    error = phase.with_lock_retries("the count and mark of the detached table", partition,
                                   count_and_mark)
    if error is not None:
        log.warning("partition %s was detached from %s, but its rows could not be counted "
                    "and marked (%s): it is not dropped by this job. Attach it again, or "
                    "drop it by hand once checked", partition.qualified_name, phase.parent,
                    error)
        phase.decisions.append(PartitionDecision(
            partition.qualified_name, Action.KEPT_DETACHED,
            (*checks, f"{form}; then not marked ({error}): not dropped")))
        return
    if kept_row:
        _attach_again(phase, partition, checks, form)
        return
    phase.decisions.append(PartitionDecision(
        partition.qualified_name, Action.DETACHED,
        (*checks, form, f"renamed {renamed.qualified_name}"), rows,
        detached_as=renamed.qualified_name))

def detach_by_function(phase: DropPhase, partition: TablePartition, checks: list[str]) -> None:
    """Detach ``partition`` through the owner's :data:`DETACH_FUNCTION`, which checks it again
    under its lock and renames the table; ``checks``: the checks passed so far."""
    function = phase.function(DETACH_FUNCTION, "")
    rows, detached_as = 0, partition.qualified_name

    def call() -> None:
        nonlocal rows, detached_as
        with phase.engine.begin() as conn:
            name = partition.quoted_name
            oid = conn.execute(sa.text("SELECT CAST(CAST(:p AS regclass) AS oid)"),
                               {"p": name}).scalar_one()
            rows = conn.execute(
                sa.text(f"SELECT {function}(CAST(:p AS regclass), :cutoff, :ms)"),
                {"p": name, "cutoff": phase.cutoff,
                 "ms": ms_int(phase.lock_timeout)}).scalar_one()
            # The function renames the table it detached: its oid stays.
            detached_as = conn.execute(_NAME_OF, {"oid": oid}).scalar_one()

    error = phase.with_lock_retries(function, partition, call)
    if error is not None:
        phase.decisions.append(PartitionDecision(partition.qualified_name, Action.KEPT,
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
    phase.decisions.append(PartitionDecision(
        partition.qualified_name, Action.DETACHED, (*checks, done), rows,
        detached_as=detached_as))


def _attach_again(phase: DropPhase, partition: TablePartition, checks: list[str],
                  form: str) -> None:
    """Attach ``partition``, just detached by ``form``, again: a row the rule keeps reached it
    after the check, and must stay in the table the application reads. Records the decision;
    a failed attach leaves it detached and never dropped, and says how to attach it."""
    attach = (f"ALTER TABLE {phase.quoted_parent} ATTACH PARTITION {partition.quoted_name} "
              f"{bound_sql(partition)}")
    error = phase.with_lock_retries("ATTACH PARTITION", partition,
                                   lambda: phase.alter(attach))
    if error is None:
        log.warning("partition %s was detached from %s, but a row the rule keeps "
                    "reached it after the check: attached again",
                    partition.qualified_name, phase.parent)
        phase.decisions.append(PartitionDecision(
            partition.qualified_name, Action.KEPT,
            (*checks, f"{form}; then a row the rule keeps was found: attached again")))
        return
    log.warning("partition %s was detached from %s, but a row the rule keeps reached "
                "it after the check, and attaching it again failed (%s): it is not "
                "dropped. Attach it again: ALTER TABLE %s ATTACH PARTITION %s %s",
                partition.qualified_name, phase.parent, error,
                phase.parent, partition.qualified_name, bound_sql(partition))
    phase.decisions.append(PartitionDecision(
        partition.qualified_name, Action.KEPT_DETACHED,
        (*checks, f"{form}; then a row the rule keeps was found: not dropped")))
