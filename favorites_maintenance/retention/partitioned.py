"""Removing the wholly expired partitions of a range-partitioned table: the drop phase's front.

"Partition" here is a PostgreSQL table partition (:mod:`~favorites_maintenance.retention.
table_partitions` reads them); a run's day is a Dagster partition (``pipeline/partitions.py``).
The phase runs before the batch purge: :mod:`~favorites_maintenance.retention.partition_detach`
detaches what it may, :mod:`~favorites_maintenance.retention.detached_tables` drops what an
earlier run detached, each alteration retried by
:class:`~favorites_maintenance.retention.partition_phase.DropPhase` and each detached table
marked by :mod:`~favorites_maintenance.retention.partition_marks`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import sqlalchemy as sa

from favorites_maintenance.retention.database import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_STATEMENT_TIMEOUT,
    limit_transaction,
)
from favorites_maintenance.retention.detached_tables import drop_due
from favorites_maintenance.retention.errors import TableCheckError, describe
from favorites_maintenance.retention.partition_detach import decide
from favorites_maintenance.retention.partition_phase import (
    DETACH_ARGS,
    DETACH_FUNCTION,
    DROP_ARGS,
    DROP_FUNCTION,
    Action,
    DropPhase,
    PartitionDropResult,
    log,
)
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.table_partitions import leaf_partitions


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
    and tried ``partition_phase.LOCK_ATTEMPTS`` times with a doubling pause. Otherwise
    through the owner's functions (``partition_phase.DETACH_FUNCTION``, ``DROP_FUNCTION``),
    which check again under the lock they take and detach with a plain ``DETACH``
    (PostgreSQL refuses ``CONCURRENTLY`` inside a function). With neither, a WARNING names
    the function to install and nothing is detached.

    A detached table is renamed (``partition_marks.DETACHED_SUFFIX``), so that nothing that
    creates partitions by name writes into it, and marked by a comment
    (``partition_marks.MARK``: from which table, which partition it was, when, how many
    rows), so a later run finds it and knows when to drop it; before the ``DROP`` the guard
    is checked again on the detached table, which no session writes through the parent any
    more.

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
        The :class:`~favorites_maintenance.retention.partition_phase.PartitionDropResult`.

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
    phase = DropPhase(engine, rule, cutoff, detached_retention, lock_timeout,
                      statement_timeout, should_stop)
    return _run(phase)


#: Whether the job's role may alter the table ``:t`` (a member of its owner), and execute the
#: owner's functions ``:detach`` and ``:drop``.
_PRIVILEGE = sa.text("""
    SELECT pg_has_role(current_user, c.relowner, 'USAGE'),
           has_function_privilege(to_regprocedure(:detach), 'EXECUTE'),
           has_function_privilege(to_regprocedure(:drop), 'EXECUTE')
      FROM pg_class c WHERE c.oid = CAST(:t AS regclass)
""")


def _run(phase: DropPhase) -> PartitionDropResult:
    """The phase, ended with what it did when a catalog read fails after a change."""
    try:
        return _alter_table(phase)
    except sa.exc.DBAPIError as exc:
        # Raised only by the catalog reads; a failed check or alteration is logged instead.
        done = [d for d in phase.decisions if d.action in (Action.DETACHED, Action.DROPPED)]
        if not done:
            raise TableCheckError(describe(exc), phase.parent) from None
        # What it detached has left the table: a retry would not see it again, so the
        # run must count it now.
        log.warning("drop_expired_partitions stopped after %d partitions detached or "
                    "dropped: %s; the batches delete the prunable rows of the others",
                    len(done), describe(exc))
        return phase.result(phase.privilege)


def _alter_table(phase: DropPhase) -> PartitionDropResult:
    """Read the partitions and the job's privilege, decide each partition, then drop the
    detached tables whose retention is over."""
    with phase.engine.connect() as conn, conn.begin():
        # pg_get_expr locks each partition: a lock an application holds on one must not
        # keep this read waiting past lock_timeout.
        limit_transaction(conn, lock_timeout=phase.lock_timeout,
                          statement_timeout=phase.statement_timeout)
        partitions = leaf_partitions(conn, phase.rule.table.schema, phase.rule.table.name,
                                     age_column=phase.rule.age.name)
        owner, may_detach, may_drop = conn.execute(_PRIVILEGE, {
            "t": phase.quoted_parent,
            "detach": phase.function(DETACH_FUNCTION, DETACH_ARGS),
            "drop": phase.function(DROP_FUNCTION, DROP_ARGS)}).one()
    privilege = "owner" if owner else "function" if may_detach and may_drop else "none"
    phase.privilege = privilege
    if privilege == "none":
        log.warning(
            "drop_expired_partitions: the job's role may not alter %s and cannot execute "
            "%s and %s: nothing detached, every prunable row is deleted in batches. Install "
            "them as the table's owner (favorites-maintenance partition-functions, docs/"
            "partitioned-tables.md)", phase.parent,
            phase.function(DETACH_FUNCTION, DETACH_ARGS),
            phase.function(DROP_FUNCTION, DROP_ARGS))
        return PartitionDropResult(privilege=privilege)
    has_default = any(p.is_default for p in partitions)
    for partition in partitions:
        if phase.stopped():
            return phase.result(privilege)
        decide(phase, partition, privilege, has_default)
    if not phase.stopped():
        drop_due(phase, privilege)
    return phase.result(privilege)
