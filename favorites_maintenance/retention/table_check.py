"""The table a policy is pointed at, checked against what its rule assumes of it.

The production table belongs to another service; the job reads its shape from the catalogs
before the first batch (and ``dry-run`` does the same) instead of assuming it. Below, the
guest-favorites rule's columns name the roles (another rule names its own):

- the age column ``updated_at`` is ``timestamp with time zone``. A ``timestamp without time
  zone`` compared with the UTC cutoff is converted with the session's ``TimeZone``, which moves
  the cutoff by the zone's offset (east of UTC, rows are deleted hours early): refused;
- each guard column (``user_id``) exists and is nullable (a ``NOT NULL`` guard can never match, so
  the job would delete nothing and look healthy): refused;
- the key column ``id`` exists and is unique (a primary key, a unique constraint or a unique
  index on it alone, or on ``(id, updated_at)`` as a table partitioned by ``updated_at`` must
  have it): the keyset and the DELETE match rows by it, so a duplicate key could stand for
  another row: refused;
- the recommended partial index exists (a plain index on ``(<age>, <key>)`` for a rule with no
  guard): without it each batch scans more than it deletes, so a warning with the ``CREATE
  INDEX`` to run, not a failure.

The catalogs are readable by every role, so the check needs no privilege the job lacks.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import DOMAIN, TIMESTAMP

from favorites_maintenance.retention.errors import TableShapeError
from favorites_maintenance.retention.rule import GUEST_FAVORITES, RetentionRule


@dataclass(frozen=True)
class TableFindings:
    """What the check found that is not an error.

    Attributes:
        table: the table checked, ``schema.name``.
        has_recommended_index: whether a partial index on ``(<age>, ...)`` with the rule's
            guard as its predicate exists.
        keyset_index: whether such an index is on ``(<age>, <key>, ...)``: it hands a batch its
            rows in keyset order, with no sort.
        warnings: one sentence each, fit for a log line (the missing index and its fix).
    """

    table: str
    has_recommended_index: bool
    warnings: tuple[str, ...] = ()
    keyset_index: bool = False


def check_table(conn: sa.Connection, rule: RetentionRule = GUEST_FAVORITES) -> TableFindings:
    """Check the table of ``rule`` on ``conn`` (see the module docstring for the rules).

    Runs a few catalog reads in the connection's current transaction; deletes nothing.

    Returns:
        :class:`TableFindings` (warnings only).

    Raises:
        TableShapeError: the table is missing, or a column is missing or of a shape the rule
            cannot use; the message names the column, its type and the fix.
    """
    table = rule.qualified_name
    name, schema = rule.table.name, rule.table.schema
    key_column, age_column = rule.key.name, rule.age.name
    inspector = sa.inspect(conn)
    if (name in inspector.get_view_names(schema=schema)
            or name in inspector.get_materialized_view_names(schema=schema)):
        raise TableShapeError(f"{table} is a view: the job deletes from the table itself; "
                              f"point it at the database whose {table} is a table")
    try:
        columns = {c["name"]: c for c in inspector.get_columns(name, schema=schema)}
    except sa.exc.NoSuchTableError:
        raise TableShapeError(f"table {table} does not exist (or this role cannot see it): "
                              f"point the job at the database holding {table}") from None

    def column(name: str) -> dict:
        if name not in columns:
            raise TableShapeError(f"{table} has no column {name!r}, which the retention rule "
                                  "reads", column=name)
        return columns[name]

    age = column(age_column)
    age_type = age["type"]
    base_type = age_type.data_type if isinstance(age_type, DOMAIN) else age_type
    if not (isinstance(base_type, TIMESTAMP) and base_type.timezone):
        type_name = age_type.compile(dialect=conn.dialect)
        raise TableShapeError(
            f"{table}.{age_column} is {type_name}, but the rule compares it with a UTC instant "
            f"and needs timestamp with time zone (timestamptz): PostgreSQL would convert the "
            f"cutoff with the session's TimeZone and move it by the zone's offset. Fix: ALTER "
            f"TABLE {table} ALTER COLUMN {age_column} TYPE timestamptz USING {age_column} AT "
            f"TIME ZONE 'UTC' (if it holds UTC wall-clock times)", column=age_column)

    for guard in rule.guards:
        if not column(guard.name)["nullable"]:
            raise TableShapeError(
                f"{table}.{guard.name} is NOT NULL, so no row can ever be a guest row "
                f"({rule.guard_sql}): the table is not the one the rule is written for",
                column=guard.name)

    if column(key_column)["nullable"]:
        raise TableShapeError(
            f"{table}.{key_column} is nullable: a row without a key can never be matched by the "
            f"purge's DELETE. Fix: ALTER TABLE {table} ALTER COLUMN {key_column} SET NOT NULL",
            column=key_column)
    if not _is_unique(inspector, rule):
        raise TableShapeError(
            f"{table}.{key_column} is not unique (no primary key, unique constraint or unique "
            f"index on it alone): the purge matches locked rows by it. Fix: make it the primary "
            f"key, or CREATE UNIQUE INDEX CONCURRENTLY ON {table} ({key_column})",
            column=key_column)

    guard = sorted(_normalised(f"{c.name} IS NULL") for c in rule.guards)
    partial = [ix["column_names"]
               for ix in inspector.get_indexes(name, schema=schema)
               if ix["column_names"][:1] == [age_column]
               and _clauses(ix.get("dialect_options", {}).get("postgresql_where")) == guard]
    has_index = bool(partial)
    # A rule with no guard wants a plain index.
    index = (f"partial index on ({age_column}, {key_column}) WHERE {rule.guard_sql}"
             if rule.guards else f"index on ({age_column}, {key_column})")
    warnings = () if has_index else (
        f"{table} has no {index}: "
        f"each batch reads more than it deletes. Create it (it does not block writes): "
        f"{rule.recommended_index_sql}",)
    return TableFindings(table=table, has_recommended_index=has_index, warnings=warnings,
                         keyset_index=any(c[:2] == [age_column, key_column] for c in partial))


def _is_unique(inspector, rule: RetentionRule) -> bool:
    schema, table = rule.table.schema, rule.table.name
    # The DELETE matches on (key, age) as well, so a key unique with the age column (the
    # primary key of a table partitioned by it) identifies a row too.
    allowed = ({rule.key.name}, {rule.key.name, rule.age.name})
    keys = [inspector.get_pk_constraint(table, schema=schema).get("constrained_columns") or []]
    keys += [uc["column_names"] for uc in inspector.get_unique_constraints(table, schema=schema)]
    keys += [ix["column_names"] for ix in inspector.get_indexes(table, schema=schema)
             if ix["unique"] and not ix.get("dialect_options", {}).get("postgresql_where")]
    return any(set(cols) in allowed and None not in cols for cols in keys)


def _normalised(predicate: str | None) -> str:
    return " ".join((predicate or "").lower().replace("(", " ").replace(")", " ").split())


def _clauses(predicate: str | None) -> list[str]:
    """An index predicate as its sorted ``AND`` clauses, normalised."""
    return sorted(c.strip() for c in _normalised(predicate).split(" and ") if c.strip())
