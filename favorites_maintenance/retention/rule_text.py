"""A retention rule in words: the names and text its messages and its index are written with.

:class:`RuleText` is mixed into :class:`~favorites_maintenance.retention.rule.RetentionRule`,
whose fields it reads. None of this text reaches a statement the job runs: those are built from
SQLAlchemy objects (:mod:`~favorites_maintenance.retention.rule_predicates`); the index
definition is printed for whoever creates the index.
"""

from __future__ import annotations

import sqlalchemy as sa


class RuleText:
    """The text of a :class:`~favorites_maintenance.retention.rule.RetentionRule`, from its
    fields (declared here, set by the rule): its table's name, its predicate as messages write
    it, and the partial index it recommends."""

    table: sa.Table
    key: sa.Column
    age: sa.Column
    guards: tuple[sa.Column, ...]
    cutoff_inclusive: bool

    @property
    def qualified_name(self) -> str:
        """``schema.table``, for messages (never for SQL)."""
        return f"{self.table.schema}.{self.table.name}"

    @property
    def index_name(self) -> str:
        """The name :attr:`recommended_index_sql` gives the partial index (at most 63
        characters); the job recognises the index by its columns and predicate, whatever its
        name."""
        return f"{self.table.name}_{self.age.name}_{self.key.name}_prunable_idx"[:63]

    @property
    def recommended_index_sql(self) -> str:
        """The partial index each batch is written for, to run outside a transaction (it does
        not block writes): ``(<age>, <key>) WHERE <guard>``, the keyset order of the batches
        under the rule's literal guard; ``(<age>, <key>)`` for a rule with no guard."""
        return (f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {self.index_name} ON "
                f"{self.qualified_name} ({self.age.name}, {self.key.name})"
                + (f" WHERE {self.guard_sql}" if self.guards else ""))

    @property
    def guard_sql(self) -> str:
        """The guard as SQL text, for messages and index definitions: ``user_id IS NULL``
        (empty for a rule with no guard)."""
        return " AND ".join(f"{c.name} IS NULL" for c in self.guards)

    @property
    def comparison(self) -> str:
        """The age column's comparison with the cutoff: ``<``, or ``<=`` for a rule with
        ``cutoff_inclusive``."""
        return "<=" if self.cutoff_inclusive else "<"

    @property
    def predicate_sql(self) -> str:
        """The whole predicate as text, for messages (never for SQL): ``user_id IS NULL AND
        updated_at < cutoff``, or ``expires_at < cutoff`` for a rule with no guard
        (``<=`` with ``cutoff_inclusive``)."""
        return " AND ".join([*(f"{c.name} IS NULL" for c in self.guards),
                             f"{self.age.name} {self.comparison} cutoff"])

    @property
    def older_than(self) -> str:
        """How messages say that an age is prunable against an instant: ``older than``, or
        ``at or before`` for a rule with ``cutoff_inclusive``."""
        return "at or before" if self.cutoff_inclusive else "older than"
