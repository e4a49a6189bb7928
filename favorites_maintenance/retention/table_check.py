"""The table the job is pointed at, checked against what the rule assumes of it.

The production table belongs to the favorites service; the job reads its shape from the
catalogs before the first batch (and ``dry-run`` does the same) instead of assuming it:

- the age column ``updated_at`` is ``timestamp with time zone``. A ``timestamp without time
  zone`` compared with the UTC cutoff is converted with the session's ``TimeZone``, which moves
  the cutoff by the zone's offset (east of UTC, rows are deleted hours early): refused;
- the guard column ``user_id`` exists and is nullable (a ``NOT NULL`` guard can never match, so
  the job would delete nothing and look healthy): refused;
- the key column ``id`` exists and is unique (a primary key, a unique constraint or a unique
  index on it alone, or on ``(id, updated_at)`` as a table partitioned by ``updated_at`` must
  have it): the keyset and the DELETE match rows by it, so a duplicate key could stand for
  another row: refused;
- the recommended partial index exists: without it each batch scans more than it deletes, so
  a warning with the ``CREATE INDEX`` to run, not a failure.

The catalogs are readable by every role, so the check needs no privilege the job lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import DOMAIN, TIMESTAMP

from favorites_maintenance.retention.errors import TableShapeError
from favorites_maintenance.retention.rule import favorites
from favorites_maintenance.retention.schema import RECOMMENDED_INDEX_SQL

KEY_COLUMN = "id"
GUARD_COLUMN = "user_id"
AGE_COLUMN = "updated_at"


@dataclass(frozen=True)
class TableFindings:
    """What the check found that is not an error.

    Attributes:
        table: the table checked, ``schema.name``.
        has_recommended_index: whether a partial index on ``(updated_at, ...)`` with the
            predicate ``user_id IS NULL`` exists.
        keyset_index: whether such an index is on ``(updated_at, id, ...)``: it hands a batch its
            rows in keyset order, with no sort.
        warnings: one sentence each, fit for a log line (the missing index and its fix).
    """

    table: str
    has_recommended_index: bool
    warnings: tuple[str, ...] = ()
    keyset_index: bool = False


def check_table(conn: sa.Connection) -> TableFindings:
    """Check ``favorites.favorites`` on ``conn`` (see the module docstring for the rules).

    Runs a few catalog reads in the connection's current transaction; deletes nothing.

    Returns:
        :class:`TableFindings` (warnings only).

    Raises:
        TableShapeError: the table is missing, or a column is missing or of a shape the rule
            cannot use; the message names the column, its type and the fix.
    """
    table = f"{favorites.schema}.{favorites.name}"
    inspector = sa.inspect(conn)
    if (favorites.name in inspector.get_view_names(schema=favorites.schema)
            or favorites.name in inspector.get_materialized_view_names(schema=favorites.schema)):
        raise TableShapeError(f"{table} is a view: the job deletes from the table itself; "
                              "point it at the database whose favorites.favorites is a table")
    try:
        columns = {c["name"]: c for c in inspector.get_columns(favorites.name,
                                                                 schema=favorites.schema)}
    except sa.exc.NoSuchTableError:
        raise TableShapeError(f"table {table} does not exist (or this role cannot see it): "
                              "point the job at the favorites database") from None

    def column(name: str) -> dict:
        if name not in columns:
            raise TableShapeError(f"{table} has no column {name!r}, which the retention rule "
                                  "reads", column=name)
        return columns[name]

    age = column(AGE_COLUMN)
    age_type = age["type"]
    base_type = age_type.data_type if isinstance(age_type, DOMAIN) else age_type
    if not (isinstance(base_type, TIMESTAMP) and base_type.timezone):
        type_name = age_type.compile(dialect=conn.dialect)
        raise TableShapeError(
            f"{table}.{AGE_COLUMN} is {type_name}, but the rule compares it with a UTC instant "
            f"and needs timestamp with time zone (timestamptz): PostgreSQL would convert the "
            f"cutoff with the session's TimeZone and move it by the zone's offset. Fix: ALTER "
            f"TABLE {table} ALTER COLUMN {AGE_COLUMN} TYPE timestamptz USING {AGE_COLUMN} AT "
            f"TIME ZONE 'UTC' (if it holds UTC wall-clock times)", column=AGE_COLUMN)

    if not column(GUARD_COLUMN)["nullable"]:
        raise TableShapeError(
            f"{table}.{GUARD_COLUMN} is NOT NULL, so no row can ever be a guest row "
            f"({GUARD_COLUMN} IS NULL): the table is not the one the rule is written for",
            column=GUARD_COLUMN)

    if column(KEY_COLUMN)["nullable"]:
        raise TableShapeError(
            f"{table}.{KEY_COLUMN} is nullable: a row without a key can never be matched by the "
            f"purge's DELETE. Fix: ALTER TABLE {table} ALTER COLUMN {KEY_COLUMN} SET NOT NULL",
            column=KEY_COLUMN)
    if not _is_unique(inspector, KEY_COLUMN):
        raise TableShapeError(
            f"{table}.{KEY_COLUMN} is not unique (no primary key, unique constraint or unique "
            f"index on it alone): the purge matches locked rows by it. Fix: make it the primary "
            f"key, or CREATE UNIQUE INDEX CONCURRENTLY ON {table} ({KEY_COLUMN})",
            column=KEY_COLUMN)

    partial = [ix["column_names"]
               for ix in inspector.get_indexes(favorites.name, schema=favorites.schema)
               if ix["column_names"][:1] == [AGE_COLUMN]
               and _normalised(ix.get("dialect_options", {}).get("postgresql_where"))
               == f"{GUARD_COLUMN} is null"]
    has_index = bool(partial)
    warnings = () if has_index else (
        f"{table} has no partial index on ({AGE_COLUMN}, {KEY_COLUMN}) WHERE {GUARD_COLUMN} IS "
        f"NULL: each batch reads more than it deletes. Create it (it does not block writes): "
        f"{RECOMMENDED_INDEX_SQL}",)
    return TableFindings(table=table, has_recommended_index=has_index, warnings=warnings,
                         keyset_index=any(c[:2] == [AGE_COLUMN, KEY_COLUMN] for c in partial))


def _is_unique(inspector, name: str) -> bool:
    schema, table = favorites.schema, favorites.name
    # The DELETE matches on (id, updated_at) as well, so a key unique with the age column (the
    # primary key of a table partitioned by it) identifies a row too.
    allowed = ({name}, {name, AGE_COLUMN})
    keys = [inspector.get_pk_constraint(table, schema=schema).get("constrained_columns") or []]
    keys += [uc["column_names"] for uc in inspector.get_unique_constraints(table, schema=schema)]
    keys += [ix["column_names"] for ix in inspector.get_indexes(table, schema=schema)
             if ix["unique"] and not ix.get("dialect_options", {}).get("postgresql_where")]
    return any(set(cols) in allowed and None not in cols for cols in keys)


def _normalised(predicate: str | None) -> str:
    return " ".join((predicate or "").lower().replace("(", " ").replace(")", " ").split())
