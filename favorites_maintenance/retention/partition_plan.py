"""Which partitions of a range-partitioned table hold prunable rows: the work of a purge that
runs one step per partition.

Each partition is purged through the table, its rule narrowed to the partition's ranges of the
age column (:meth:`~favorites_maintenance.retention.rule.RetentionRule.within`: its bounds; for
the default partition, the ranges no other partition covers): the same predicate, the same
guard, the same batches, on the partition's rows alone, so that purges of different partitions
never select the same row and can run at once, in different processes or on different hosts.
The planner prunes every other partition from each statement, and the DELETEs are the table's,
as the application's are: its statement triggers fire (an erasure log fed by a transition
table sees every row), its row-level security and its grants apply, and the job's role needs
no grant on the partitions.

A partition is listed when an indexed probe through the table finds a prunable row in its
ranges (``SELECT 1 ... WHERE <prunable> AND <age in its ranges> LIMIT 1``, served by the
partition's copy of the rule's partial index); one whose lower bound is at or after the cutoff
cannot hold one and is not probed (after it, for a rule that prunes the row at the cutoff:
:meth:`~favorites_maintenance.retention.rule.RetentionRule.prunable_before`).
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from favorites_maintenance.retention.database import limit_transaction
from favorites_maintenance.retention.errors import (
    DatabaseError,
    TableShapeError,
    describe,
)
from favorites_maintenance.retention.table_partitions import TablePartition, leaf_partitions
from favorites_maintenance.retention.rule import RetentionRule


class PartitionPlanError(DatabaseError):
    """The partitions of the table could not be read or probed; no row was deleted by the plan
    (partitions the run's drop phase detached before it stay detached).
    ``error`` describes the database error."""

    def __init__(self, error):
        super().__init__(f"could not read the table's partitions: {error}", error)


#: Whether ``:t`` is a partitioned table (``relkind = 'p'``); no row when it does not exist.
_IS_PARTITIONED = sa.text("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(:t)")


def prunable_partitions(engine: sa.Engine, rule: RetentionRule,
                        cutoff: dt.datetime) -> list[TablePartition]:
    """The partitions of the rule's table that hold at least one row the rule prunes at
    ``cutoff``, oldest range first (the default partition last).

    A partition whose concurrent detach is pending is left out: it no longer belongs to the
    table, and its detach is finished by ``DETACH PARTITION ... FINALIZE``, not by deleting
    its rows.

    Each probe runs under the limits of a batch (``lock_timeout`` 2 s, ``statement_timeout``
    30 s, or the session's shorter ones), in one read-only transaction.

    Args:
        engine: engine on the table's database.
        rule: the policy's rule, on the partitioned table.
        cutoff: timezone-aware UTC instant.

    Raises:
        TableShapeError: the table is missing or not partitioned, or not by range on the
            rule's age column alone (see :func:`~favorites_maintenance.retention.partitioned.
            leaf_partitions`); the plan deleted no row.
        PartitionPlanError: the database failed.
        InvalidArgumentError: ``cutoff`` is naive.
    """
    rule.prunable(cutoff)  # refuses a naive cutoff before any connection
    schema, table = rule.table.schema, rule.table.name
    try:
        with engine.connect() as conn, conn.begin():
            limit_transaction(conn)
            partitioned = conn.execute(_IS_PARTITIONED,
                                       {"t": f'"{schema}"."{table}"'}).scalar_one_or_none()
            if not partitioned:
                what = "missing" if partitioned is None else "not a partitioned table"
                raise TableShapeError(
                    f"{rule.qualified_name} is {what}, but max_parallel_partitions is set: "
                    f"declare it PARTITION BY RANGE ({rule.age.name}), or leave "
                    "max_parallel_partitions unset")
            partitions = leaf_partitions(conn, schema, table, age_column=rule.age.name,
                                         setting="max_parallel_partitions")
            found = []
            for partition in partitions:
                if partition.detach_pending:
                    continue
                if partition.lower is not None and partition.lower >= rule.prunable_before(cutoff):
                    continue  # every row of it is at or after its lower bound
                own = rule.within(partition.ages)
                probe = sa.select(sa.literal(1)).select_from(own.table).where(
                    own.prunable(cutoff)).limit(1)
                if conn.execute(probe).first() is not None:
                    found.append(partition)
    except sa.exc.DBAPIError as exc:
        raise PartitionPlanError(describe(exc)) from None
    return found
