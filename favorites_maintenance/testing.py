"""Testing a retention policy's rule: which rows it would delete at a given instant.

A policy's author tests the rule's boundary, not the presence of the machinery: a row 31 days
expired is prunable under a 30-day retention, one 29 days expired or not yet expired is not::

    import datetime as dt

    from favorites_maintenance.testing import prunable_keys

    NOW = dt.datetime(2026, 6, 16, 12, tzinfo=dt.timezone.utc)

    def test_the_30_day_boundary(conn):  # a connection on a database holding the table
        old, recent, future = insert_requests(conn, expires_at=[NOW - dt.timedelta(days=31),
                                                               NOW - dt.timedelta(days=29),
                                                               NOW + dt.timedelta(days=5)])
        assert prunable_keys("email_change_requests", conn, now=NOW) == [old]

:func:`prunable_keys` deletes nothing. It finds the policy by name the way the code location
does (``favorites_maintenance/defs/``, or a component tree given as ``tree``), checks the table
as the job does before its first batch, derives the cutoff from ``now`` as the job's
``compute_cutoff`` op does (:func:`~favorites_maintenance.pipeline.partitions.partition_cutoff`;
without ``now``, from the database server's clock, as the job reads it) and matches rows with
the rule's own predicate, the one every batch's ``DELETE`` repeats.
``favorites-maintenance dry-run`` counts with the same :class:`PrunableRows`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.components.policy_tree import load_policies
from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.partitions import partition_cutoff, read_now
from favorites_maintenance.retention.clock import ClockReading
from favorites_maintenance.retention.errors import InvalidArgumentError
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.table_check import TableFindings, check_table

__all__ = ["PrunableRows", "find_policy", "prunable_keys", "prunable_rows"]


@dataclass(frozen=True)
class PrunableRows:
    """The rows ``policy``'s rule matches for ``cutoff``: what a run with that cutoff would
    delete (but rows another session holds, which a run skips and leaves for the next).

    Attributes:
        policy: the policy whose rule it is.
        cutoff: the timezone-aware UTC instant rows must be older than (strictly, or at it
            too for a policy with ``cutoff_inclusive``).
        clock: the database server's clock the cutoff was derived from, with this host's
            (its ``warning`` says when they disagree); ``None`` when ``now`` was given.

    Every method reads in the connection's current transaction and deletes nothing.
    """

    policy: Policy
    cutoff: dt.datetime
    clock: ClockReading | None = None

    def statement(self, connection: sa.Connection | None = None) -> sa.Select:
        """``SELECT <key>, <age> FROM <table> WHERE <rule's predicate>``, unordered; with
        ``connection``, the holds compared as a run's batches compare them
        (:func:`~favorites_maintenance.retention.backlog.compared_as_batches`, read there),
        without, as text."""
        rule = self._rule(connection)
        return sa.select(rule.key.label("key"), rule.age.label("age")).where(
            rule.prunable(self.cutoff))

    def _rule(self, connection: sa.Connection | None) -> RetentionRule:
        """The policy's rule, its holds compared as the batches compare them when
        ``connection`` can tell how."""
        if connection is None:
            return self.policy.rule
        from favorites_maintenance.retention.backlog import compared_as_batches

        return compared_as_batches(connection, self.policy.rule)

    def check(self, connection: sa.Connection) -> TableFindings:
        """Check the table as the job does before its first batch.

        Raises:
            TableShapeError: a table or column the rule cannot use (named).
        """
        return check_table(connection, self.policy.rule)

    def keys(self, connection: sa.Connection) -> list[Any]:
        """The keys of the matched rows, in the order the job's batches take them (the age
        column, then the key)."""
        sub = self.statement(connection).subquery()
        return list(connection.execute(
            sa.select(sub.c.key).order_by(sub.c.age, sub.c.key)).scalars())

    def count(self, connection: sa.Connection) -> tuple[int, dt.datetime | None]:
        """How many rows match, and the oldest age column among them (``None``: none)."""
        sub = self.statement(connection).subquery()
        count, oldest = connection.execute(
            sa.select(sa.func.count(), sa.func.min(sub.c.age))).one()
        return count, oldest

    def held(self, connection: sa.Connection) -> int:
        """How many rows the guard and the age admit but an active hold keeps (0 for a
        policy without a hold table): not in :meth:`count`, never deleted."""
        if self.policy.rule.hold is None:
            return 0
        from favorites_maintenance.retention.backlog import count_held

        return connection.execute(count_held(self._rule(connection), self.cutoff)).scalar_one()


def find_policy(policy: str | Policy, tree: dg.ComponentTree | None = None) -> Policy:
    """``policy`` itself, or the policy of that name in ``tree`` (default: the code location's
    ``favorites_maintenance/defs/``), its settings read as the code location reads them.

    Raises:
        KeyError: no policy of that name (the message lists the policies).
        PolicyLoadError: the policies do not load (as the code location would not).
    """
    if isinstance(policy, Policy):
        return policy
    policies = {p.name: p for p in load_policies(tree)}
    if policy not in policies:
        raise KeyError(f"no policy {policy!r}; the policies are {', '.join(sorted(policies))}")
    return policies[policy]


def prunable_rows(policy: str | Policy, *, now: dt.datetime | None = None,
                  partition: str | None = None,
                  tree: dg.ComponentTree | None = None,
                  database: sa.Engine | sa.Connection | None = None) -> PrunableRows:
    """The rows ``policy``'s rule matches at ``now``, the cutoff derived as the job derives
    it (:func:`~favorites_maintenance.pipeline.partitions.partition_cutoff`; no
    ``partition``: ``now - retention_days``), a UTC instant.

    Args:
        policy: a policy's name (looked up by :func:`find_policy`) or the policy.
        now: timezone-aware instant the run would start at; ``None``: the current instant, as
            the job reads it: the clock of ``database``'s server.
        partition: daily partition key (``YYYY-MM-DD``) of the run, or ``None``.
        tree: the component tree to find the policy in (default: ``defs/``).
        database: engine or connection on the policy's database, whose clock is "now" when
            ``now`` is not given (a connection is read in its current transaction).

    Raises:
        ValueError: ``partition`` is not a daily partition key.
        InvalidArgumentError: a naive ``now``, or neither ``now`` nor ``database``.
        ConnectError: the database's clock could not be read.
        KeyError, PolicyLoadError: see :func:`find_policy`.
    """
    found = find_policy(policy, tree)
    clock = None
    if now is None:
        if database is None:
            raise InvalidArgumentError("give now, or the database whose clock is now (the job "
                                       "reads the database server's, never this host's)")
        clock = read_now(database)
        now = clock.database
    return PrunableRows(found, partition_cutoff(partition, found.settings.retention_days,
                                                now=now), clock)


def prunable_keys(policy_name: str | Policy, connection: sa.Connection | sa.Engine, *,
                  now: dt.datetime | None = None, partition: str | None = None,
                  tree: dg.ComponentTree | None = None) -> list[Any]:
    """The keys of the rows the policy's rule would delete if a run started at ``now``, in the
    order the job's batches take them; nothing is deleted.

    Args:
        policy_name: the policy's ``name`` (as its ``defs.yaml`` gives it), or the policy.
        connection: a connection on the policy's database (read in its current transaction,
            so rows it inserted and has not committed count), or an engine (a connection is
            opened for the call).
        now, partition, tree: see :func:`prunable_rows`; without ``now``, the clock of
            ``connection``'s database server.

    Returns:
        The key values (``int``, ``uuid.UUID``, ``str``, ... as the key column's type reads).

    Raises:
        TableShapeError: the table is not one the job would purge (named column, fix).
        ValueError, InvalidArgumentError, ConnectError, KeyError, PolicyLoadError: see
            :func:`prunable_rows`.
    """
    if isinstance(connection, sa.Engine):
        with connection.connect() as conn:
            rows = prunable_rows(policy_name, now=now, partition=partition, tree=tree,
                                 database=conn)
            rows.check(conn)
            return rows.keys(conn)
    rows = prunable_rows(policy_name, now=now, partition=partition, tree=tree,
                         database=connection)
    rows.check(connection)
    return rows.keys(connection)
