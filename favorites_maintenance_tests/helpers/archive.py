"""A table with an archive, for the archive and restore tests: ``shop.items``, whose columns take
the types an archive must keep exactly (arrays, ``jsonb``, ``numeric(p,s)``, an enum, a
generated column, a ``GENERATED ALWAYS`` identity key), and the policy ``shop_items`` that
archives into ``shop.items_archive``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable

import dagster as dg
import sqlalchemy as sa

# The shop's tests read the days as ``shop.PARTITION``, ``shop.OLD``, ...
from favorites_maintenance_tests.helpers.clock import CUTOFF, FRESH, OLD, PARTITION  # noqa: F401

UTC = dt.timezone.utc
POLICY = "shop_items"
TABLE = "shop.items"
ARCHIVE = "shop.items_archive"
JOB = "shop_items_cleanup_job"
RESTORE_JOB = "restore_shop_items_job"
RESTORE_OP = "restore_shop_items"
ASSET_KEY = dg.AssetKey(["shop", "shop_items_cleanup"])
#: The variable the policy reads its retention days from (a correction is a new value).
RETENTION_VAR = "SHOP_ITEMS_RETENTION_DAYS"
#: Every column of the table, in order (``price_cents`` is generated).
COLUMNS = ("id", "owner_id", "tags", "attrs", "scores", "price", "mood", "note", "price_cents",
           "updated_at")

DDL = """
CREATE SCHEMA shop;
CREATE TYPE shop.mood AS ENUM ('glad', 'sad');
CREATE TABLE shop.items (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner_id bigint,
    tags text[],
    attrs jsonb,
    scores integer[],
    price numeric(10, 2),
    mood shop.mood,
    note text,
    price_cents bigint GENERATED ALWAYS AS ((price * 100)::bigint) STORED,
    updated_at timestamptz NOT NULL
);
CREATE INDEX items_prunable_idx ON shop.items (updated_at, id) WHERE owner_id IS NULL;
"""

#: :data:`ARCHIVE` made by its owner, partitioned by the month of archiving: this month's rows
#: in ``items_archive_current``, earlier ones in ``items_archive_earlier``.
PARTITIONED_ARCHIVE = """
CREATE TABLE shop.items_archive (
    id bigint, owner_id bigint, tags text[], attrs jsonb, scores integer[],
    price numeric(10, 2), mood shop.mood, note text, price_cents bigint, updated_at timestamptz,
    _retention_run_id text NOT NULL, _retention_policy text NOT NULL,
    _retention_archived_at timestamptz NOT NULL
) PARTITION BY RANGE (_retention_archived_at);
CREATE TABLE shop.items_archive_earlier PARTITION OF shop.items_archive
    FOR VALUES FROM (MINVALUE) TO (date_trunc('month', now()));
CREATE TABLE shop.items_archive_current PARTITION OF shop.items_archive
    FOR VALUES FROM (date_trunc('month', now())) TO (MAXVALUE);
"""

#: :data:`ARCHIVE` made by its owner with ``LIKE ... INCLUDING ALL``: it keeps the table's
#: ``GENERATED ALWAYS`` identity on ``id`` and its generated ``price_cents`` (its key, which
#: could refuse an archived row, dropped).
ARCHIVE_LIKE_THE_TABLE = """
CREATE TABLE shop.items_archive (LIKE shop.items INCLUDING ALL,
    _retention_run_id text NOT NULL, _retention_policy text NOT NULL,
    _retention_archived_at timestamptz NOT NULL);
ALTER TABLE shop.items_archive DROP CONSTRAINT items_archive_pkey;
"""

#: :data:`ARCHIVE` split by inheritance the old way: a ``BEFORE INSERT`` trigger routes each row
#: into the child ``items_archive_routed`` and returns NULL, so no row lands in the archive
#: itself and an ``INSERT ... RETURNING`` into it returns none.
ROUTED_ARCHIVE = """
CREATE TABLE shop.items_archive (
    id bigint, owner_id bigint, tags text[], attrs jsonb, scores integer[],
    price numeric(10, 2), mood shop.mood, note text, price_cents bigint, updated_at timestamptz,
    _retention_run_id text NOT NULL, _retention_policy text NOT NULL,
    _retention_archived_at timestamptz NOT NULL);
CREATE TABLE shop.items_archive_routed () INHERITS (shop.items_archive);
CREATE FUNCTION shop.route_archived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO shop.items_archive_routed VALUES (NEW.*); RETURN NULL; END $$;
CREATE TRIGGER route_archived BEFORE INSERT ON shop.items_archive FOR EACH ROW
    EXECUTE FUNCTION shop.route_archived();
"""


def policy(batch_size: int = 7, **attributes) -> dict:
    """The attributes of ``shop_items``: guard ``owner_id``, retention read from
    :data:`RETENTION_VAR` (365 when unset), fixed batches of ``batch_size``."""
    return {"name": POLICY, "table": TABLE, "key_column": "id", "age_column": "updated_at",
            "null_columns": ["owner_id"], "archive_table": ARCHIVE,
            "retention_days": "{{ env.SHOP_ITEMS_RETENTION_DAYS }}",
            "batch_size": batch_size, "target_batch_duration": "PT0S", "partitions_start": "2026-01-01",
            **attributes}


def create_items(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(DDL)


_INSERT = sa.text(
    "INSERT INTO shop.items (owner_id, tags, attrs, scores, price, mood, note, updated_at) "
    "VALUES (:owner_id, :tags, CAST(:attrs AS jsonb), :scores, :price, "
    "        CAST(:mood AS shop.mood), :note, :updated_at) RETURNING id")


def add_items(engine: sa.Engine, n: int, *, updated_at: dt.datetime, owner_id: int | None = None,
              step: dt.timedelta = dt.timedelta(seconds=1), note: str | None = None) -> list[int]:
    """Insert ``n`` rows whose values differ from row to row (arrays with NULL elements and
    empty ones, nested ``jsonb`` with a ``null``, NULL columns); their ids."""
    ids = []
    with engine.begin() as conn:
        for i in range(n):
            ids.append(conn.execute(_INSERT, {
                "owner_id": owner_id,
                "tags": [] if i % 5 == 0 else [f"t{i}", None, "é ü"][: 1 + i % 3],
                "attrs": None if i % 7 == 3 else json.dumps(
                    {"n": i, "nested": {"list": [i, None, True]}, "empty": None}),
                "scores": None if i % 4 == 1 else [i, -i, 0],
                "price": None if i % 6 == 2 else f"{i}.{i % 100:02d}",
                "mood": None if i % 3 == 2 else ("glad" if i % 2 else "sad"),
                "note": note if note is not None else (None if i % 2 else f"note {i} ✓"),
                "updated_at": updated_at + i * step,
            }).scalar_one())
    return ids


def rows_of(engine: sa.Engine, table: str, ids: Iterable[int] | None = None) -> dict[int, tuple]:
    """Every column of :data:`COLUMNS` of ``table`` (the table or its archive) by id."""
    schema, name = table.split(".")
    t = sa.table(name, *(sa.column(c) for c in COLUMNS), schema=schema)
    query = sa.select(*t.c)
    if ids is not None:
        query = query.where(t.c.id.in_(list(ids)))
    with engine.connect() as conn:
        return {row.id: tuple(row) for row in conn.execute(query)}


def ids_of(engine: sa.Engine, table: str) -> list[int]:
    """The ids in ``table``, in order, repeated as often as they occur."""
    with engine.connect() as conn:
        return list(conn.exec_driver_sql(f"SELECT id FROM {table} ORDER BY id").scalars())


def archive_stamps(engine: sa.Engine) -> list[tuple]:
    """``(_retention_run_id, _retention_policy)`` of each archived row, and how many."""
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(
            f"SELECT _retention_run_id, _retention_policy, count(*) FROM {ARCHIVE} "
            "GROUP BY 1, 2 ORDER BY 1, 2")]
