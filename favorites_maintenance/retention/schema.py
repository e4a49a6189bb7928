"""The dev/test DDL of ``favorites.favorites`` and the recommended partial index.

The production table belongs to the favorites service: the job never creates or alters it. This
module builds a table of the same shape for the demo, the benchmark and the tests.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import TIMESTAMP, UUID

from favorites_maintenance.retention.rule import GUEST_FAVORITES, SCHEMA, TABLE

#: The index the job's batch query is written for: its predicate matches the rule's literal
#: ``user_id IS NULL``, and ``(updated_at, id)`` is the keyset order of the batches.
RECOMMENDED_INDEX_NAME = GUEST_FAVORITES.index_name
#: What to run on production (outside a transaction, so it does not block writes).
RECOMMENDED_INDEX_SQL = GUEST_FAVORITES.recommended_index_sql

dev_metadata = sa.MetaData(schema=SCHEMA)

#: The full dev table: the job reads only ``id``, ``user_id`` and ``updated_at``.
dev_favorites = sa.Table(
    TABLE,
    dev_metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
    sa.Column("user_id", sa.BigInteger, nullable=True),
    sa.Column("anonymous_id", UUID(as_uuid=True), nullable=True),
    sa.Column("item_id", sa.BigInteger, nullable=False),
    sa.Column("note", sa.Text, nullable=True),
    sa.Column("created_at", TIMESTAMP(timezone=True), nullable=False,
              server_default=sa.func.now()),
    sa.Column("updated_at", TIMESTAMP(timezone=True), nullable=False,
              server_default=sa.func.now()),
    sa.CheckConstraint("user_id IS NOT NULL OR anonymous_id IS NOT NULL",
                       name="favorites_owner_present"),
    sa.Index("favorites_updated_at_idx", "updated_at"),
)


def create_dev_schema(engine: sa.Engine, *, with_recommended_index: bool = True) -> None:
    """Create schema ``favorites`` and the dev table (idempotent).

    Args:
        engine: an engine on the dev/test database (never production).
        with_recommended_index: also create the partial index the job is written for.
    """
    with engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(SCHEMA, if_not_exists=True))
        dev_metadata.create_all(conn, checkfirst=True)
        if with_recommended_index:
            # Plain CREATE INDEX: the dev table is ours and this runs in one transaction.
            conn.execute(sa.text(RECOMMENDED_INDEX_SQL.replace(" CONCURRENTLY", "")))


def drop_dev_schema(engine: sa.Engine) -> None:
    """Drop schema ``favorites`` and everything in it (dev/test databases only)."""
    with engine.begin() as conn:
        conn.execute(sa.schema.DropSchema(SCHEMA, cascade=True, if_exists=True))
