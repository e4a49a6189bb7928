"""The table a policy is pointed at, checked against what its rule assumes of it.

The production table belongs to another service; the job reads its shape from the catalogs
before the first batch (and ``dry-run`` does the same) instead of assuming it. Below, the
guest-favorites rule's columns name the roles (another rule names its own):

- the age column ``updated_at`` is ``timestamp with time zone``. A ``timestamp without time
  zone`` compared with the UTC cutoff is converted with the session's ``TimeZone``, which moves
  the cutoff by the zone's offset (east of UTC, rows are deleted hours early): refused;
- each guard column (``user_id``) exists and can be NULL (a ``NOT NULL`` guard, by the column,
  a validated ``CHECK (user_id IS NOT NULL)`` or a ``NOT NULL`` domain, can never match, so the
  job would delete nothing and look healthy): refused;
- the key column ``id`` exists and is unique (a primary key, a unique constraint or a valid
  unique index on it alone, or on ``(id, updated_at)`` as a table partitioned by ``updated_at``
  must have it): the keyset and the DELETE match rows by it, so a duplicate key could stand for
  another row: refused;
- the table, or a partition of it, is not in a logical-replication publication that publishes
  deletes while it has no replica identity: PostgreSQL refuses every ``DELETE`` on it
  (SQLSTATE 55000), so the job could never purge it: refused, naming the publication and the
  ``REPLICA IDENTITY`` fix;
- no such publication has a row filter (``WHERE (user_id IS NULL)``, PostgreSQL 15 and later)
  on a column outside the replica identity (the primary key, by default): PostgreSQL refuses
  every ``DELETE`` then too (SQLSTATE 42P10, naming neither the publication nor the column):
  refused, naming the publication, the filter's columns and the fix (``REPLICA IDENTITY FULL``,
  or an identity index that covers them);
- the recommended partial index exists (a plain index on ``(<age>, <key>)`` for a rule with no
  guard): without it each batch scans more than it deletes, so a warning with the ``CREATE
  INDEX`` to run, not a failure. An index left INVALID by a failed ``CREATE INDEX
  CONCURRENTLY`` is maintained but never used, and ``CREATE INDEX ... IF NOT EXISTS`` skips
  it: it counts for nothing (neither as that index nor as proof of a unique key), with a
  warning to drop it and create it again.

The catalogs are readable by every role, so the check needs no privilege the job lacks. It is
one catalog statement (:data:`_TABLE`) and, when the database has a publication that publishes
deletes, two more: a few milliseconds of the daily run, which a reflection of the table through
SQLAlchemy's inspector took tens of.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa

from favorites_maintenance.retention.errors import TableShapeError
from favorites_maintenance.retention.rule import RetentionRule


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


#: The hold table's columns the statements read, found by name (``:t`` is ``schema.table``).
_HOLD_COLUMNS = sa.text(
    "SELECT array_agg(attname::text) FROM pg_attribute WHERE attrelid = to_regclass(:t) "
    "AND attnum > 0 AND NOT attisdropped")


def _check_hold_table(conn: sa.Connection, rule: RetentionRule) -> None:
    """Refuse a hold table that is missing or lacks a column the hold test reads: every
    batch would fail on it."""
    from favorites_maintenance.retention.holds import HELD_VALUE, POLICY, RELEASED_AT

    holds = rule.hold.qualified_name
    found = conn.execute(_HOLD_COLUMNS, {"t": holds}).scalar()
    if found is None:
        raise TableShapeError(f"hold_table {holds} does not exist (or this role cannot see "
                              f"it): create it with favorites-maintenance hold init --policy "
                              f"{rule.hold.policy} (docs/holds.md), or grant the job's role "
                              "SELECT on it")
    missing = [c for c in (POLICY, HELD_VALUE, RELEASED_AT) if c not in found]
    if missing:
        raise TableShapeError(f"hold_table {holds} has no column {missing[0]!r}: it is not a "
                              "hold table as hold init creates it (docs/holds.md)",
                              column=missing[0])


def check_table(conn: sa.Connection, rule: RetentionRule) -> TableFindings:
    """Check the table of ``rule`` on ``conn`` (see the module docstring for the rules).

    Runs a few catalog reads in the connection's current transaction; deletes nothing.

    Returns:
        :class:`TableFindings` (warnings only).

    Raises:
        TableShapeError: the table is missing, or a column is missing or of a shape the rule
            cannot use; the message names the column, its type and the fix.
    """
    table = rule.qualified_name
    schema = rule.table.schema
    key_column, age_column = rule.key.name, rule.age.name
    found = conn.execute(_TABLE, {"t": table}).first()
    if found is None:
        raise TableShapeError(f"table {table} does not exist (or this role cannot see it): "
                              f"point the job at the database holding {table}")
    kind, columns, indexes, keys, check_definitions, publishes_deletes = found
    if kind in ("v", "m"):
        raise TableShapeError(f"{table} is a view: the job deletes from the table itself; "
                              f"point it at the database whose {table} is a table")
    columns = {c["name"]: c for c in columns or ()}
    indexes = [_index(ix) for ix in indexes or ()]

    def column(name: str) -> dict:
        if name not in columns:
            raise TableShapeError(f"{table} has no column {name!r}, which the retention rule "
                                  "reads", column=name)
        return columns[name]

    age = column(age_column)
    if age["base"] != "timestamp with time zone":
        type_name = age["type"].upper() if age["domain"] is None else age["domain"]
        raise TableShapeError(
            f"{table}.{age_column} is {type_name}, but the rule compares it with a UTC instant "
            f"and needs timestamp with time zone (timestamptz): PostgreSQL would convert the "
            f"cutoff with the session's TimeZone and move it by the zone's offset. Fix: ALTER "
            f"TABLE {table} ALTER COLUMN {age_column} TYPE timestamptz USING {age_column} AT "
            f"TIME ZONE 'UTC' (if it holds UTC wall-clock times)", column=age_column)

    _refuse_not_null_guards(rule, column, _not_null_checks(check_definitions or (), rule))

    if rule.hold is not None:
        column(rule.hold.column)
        _check_hold_table(conn, rule)

    if column(key_column)["nullable"]:
        raise TableShapeError(
            f"{table}.{key_column} is nullable: a row without a key can never be matched by the "
            f"purge's DELETE. Fix: ALTER TABLE {table} ALTER COLUMN {key_column} SET NOT NULL",
            column=key_column)
    invalid = [ix for ix in indexes if _invalid(ix)]
    if not _is_unique(keys or (), rule, [ix for ix in indexes if not _invalid(ix)]):
        broken = [ix["name"] for ix in invalid if ix["unique"]
                  and set(ix["column_names"]) in _key_sets(rule)]
        raise TableShapeError(
            f"{table}.{key_column} is not unique (no primary key, unique constraint or valid "
            f"unique index on it alone): the purge matches locked rows by it. "
            + (f"Unique index {schema}.{broken[0]} is INVALID (a CREATE INDEX CONCURRENTLY that "
               f"failed, often on a duplicate key): PostgreSQL does not enforce it. Fix: DROP "
               f"INDEX CONCURRENTLY {schema}.{broken[0]}; then, once no key is duplicated, "
               if broken else "Fix: make it the primary key, or ")
            + f"CREATE UNIQUE INDEX CONCURRENTLY ON {table} ({key_column})",
            column=key_column)
    if publishes_deletes:
        _refuse_filtered_publication(conn, rule)
        _refuse_unpublishable(conn, rule, indexes)

    guard = sorted(_normalised(f"{c.name} IS NULL") for c in rule.guards)

    def recommended(ix: dict) -> bool:
        return (ix["column_names"][:1] == [age_column]
                and _clauses(ix.get("dialect_options", {}).get("postgresql_where")) == guard)

    partial = [ix["column_names"] for ix in indexes if recommended(ix) and not _invalid(ix)]
    has_index = bool(partial)
    warnings = [
        f"index {schema}.{ix['name']} on {table} is INVALID (a CREATE INDEX CONCURRENTLY that "
        f"failed): PostgreSQL keeps it up to date but never uses it, and CREATE INDEX ... IF "
        f"NOT EXISTS skips it. Fix: DROP INDEX CONCURRENTLY {schema}.{ix['name']}; then "
        f"{rule.recommended_index_sql}"
        for ix in invalid if recommended(ix)]
    if not has_index and not warnings:
        # A rule with no guard wants a plain index.
        index = (f"partial index on ({age_column}, {key_column}) WHERE {rule.guard_sql}"
                 if rule.guards else f"index on ({age_column}, {key_column})")
        warnings.append(
            f"{table} has no {index}: each batch reads more than it deletes. Create it (it "
            f"does not block writes): {rule.recommended_index_sql}")
    return TableFindings(table=table, has_recommended_index=has_index, warnings=tuple(warnings),
                         keyset_index=any(c[:2] == [age_column, key_column] for c in partial))


def _refuse_not_null_guards(rule: RetentionRule, column: Callable[[str], dict],
                            checks: dict[str, str]) -> None:
    """Raise :class:`TableShapeError` for a guard column no row can have NULL: NOT NULL, by a
    CHECK constraint (``checks``: column -> constraint) or by its domain. ``column`` reads a
    column's catalog entry by name, raising for a missing one."""
    for guard in rule.guards:
        guard_column = column(guard.name)
        why = None
        if not guard_column["nullable"]:
            why = "is NOT NULL"
        elif guard.name in checks:
            why = f"is NOT NULL by CHECK constraint {checks[guard.name]}"
        elif guard_column["domain_not_null"]:
            why = f"is of domain {guard_column['domain']}, which is NOT NULL"
        if why:
            raise TableShapeError(
                f"{rule.qualified_name}.{guard.name} {why}, so no row can ever pass the guard "
                f"({rule.guard_sql}): the table is not the one the rule is written for",
                column=guard.name)


def _key_sets(rule: RetentionRule) -> tuple[set[str], set[str]]:
    # The DELETE matches on (key, age) as well, so a key unique with the age column (the
    # primary key of a table partitioned by it) identifies a row too.
    return {rule.key.name}, {rule.key.name, rule.age.name}


def _invalid(index: dict) -> bool:
    return bool(index.get("dialect_options", {}).get("postgresql_invalid"))


def _is_unique(constraint_keys, rule: RetentionRule, valid_indexes: list[dict]) -> bool:
    """Whether the primary key, a unique constraint (``constraint_keys``: their columns) or a
    valid unique index makes the rule's key unique."""
    keys = [list(cols) for cols in constraint_keys]
    keys += [ix["column_names"] for ix in valid_indexes
             if ix["unique"] and not ix.get("dialect_options", {}).get("postgresql_where")]
    return any(set(cols) in _key_sets(rule) and None not in cols for cols in keys)


#: Everything the check reads of ``:t`` (``schema.table``), in one row (none for a missing
#: table): the relation's kind; its columns (name, whether it may be NULL, its type, the type
#: under a domain without its modifier, the domain's name and whether the domain is NOT
#: NULL); its indexes but the primary key's (name, key columns, NULL for an expression,
#: unique, valid, the predicate); the columns of its primary key and unique constraints; its
#: validated CHECK constraints (name, definition as PostgreSQL prints it); whether the database
#: has a publication that publishes deletes (without one, no publication can refuse them).
_TABLE = sa.text("""
    SELECT c.relkind,
           (SELECT json_agg(json_build_object(
                       'name', a.attname, 'nullable', NOT a.attnotnull,
                       'type', format_type(a.atttypid, a.atttypmod),
                       'base', format_type(CASE WHEN t.typtype = 'd' THEN t.typbasetype
                                                ELSE a.atttypid END, NULL),
                       'domain', CASE WHEN t.typtype = 'd' THEN t.typname END,
                       'domain_not_null', t.typtype = 'd' AND t.typnotnull) ORDER BY a.attnum)
              FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
             WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
           (SELECT json_agg(json_build_object(
                       'name', ic.relname, 'unique', i.indisunique, 'valid', i.indisvalid,
                       'where', pg_get_expr(i.indpred, i.indrelid),
                       'columns', (SELECT json_agg(att.attname ORDER BY k.n)
                                     FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(num, n)
                                     LEFT JOIN pg_attribute att
                                       ON att.attrelid = c.oid AND att.attnum = k.num
                                    WHERE k.n <= i.indnkeyatts)) ORDER BY ic.relname)
              FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid
             WHERE i.indrelid = c.oid AND NOT i.indisprimary),
           (SELECT json_agg((SELECT json_agg(att.attname ORDER BY k.n)
                               FROM unnest(con.conkey) WITH ORDINALITY AS k(num, n)
                               JOIN pg_attribute att
                                 ON att.attrelid = c.oid AND att.attnum = k.num))
              FROM pg_constraint con WHERE con.conrelid = c.oid AND con.contype IN ('p', 'u')),
           (SELECT json_agg(json_build_array(con.conname, pg_get_constraintdef(con.oid))
                            ORDER BY con.conname)
              FROM pg_constraint con
             WHERE con.conrelid = c.oid AND con.contype = 'c' AND con.convalidated),
           EXISTS (SELECT 1 FROM pg_publication WHERE pubdelete)
      FROM pg_class c WHERE c.oid = to_regclass(:t)""")


def _index(found: dict) -> dict:
    """An index as :data:`_TABLE` reads it, in the shape the checks below take."""
    options: dict = {"postgresql_invalid": not found["valid"]}
    if found["where"]:
        options["postgresql_where"] = found["where"]
    return {"name": found["name"], "unique": found["unique"],
            "column_names": list(found["columns"] or ()), "dialect_options": options}


def _not_null_checks(definitions, rule: RetentionRule) -> dict[str, str]:
    """Guard column -> the validated CHECK constraint that makes it NOT NULL (one whose
    expression is ``<guard> IS NOT NULL``, alone or ANDed with others), from ``definitions``
    (``(name, definition)`` pairs)."""
    found = {}
    for name, definition in definitions:
        expression = definition.removeprefix("CHECK ").removesuffix(" NO INHERIT")
        for clause in _top_level_and(expression):
            for guard in rule.guards:
                if clause.lower() == f"{guard.name} is not null":
                    found.setdefault(guard.name, f"{rule.table.schema}.{name}")
    return found


def _top_level_and(expression: str) -> list[str]:
    """The operands of an expression's top-level ``AND``, outer parentheses removed:
    ``((a IS NOT NULL) AND (b > 0))`` -> ``["a IS NOT NULL", "b > 0"]``; an ``OR`` at the top
    level leaves the whole expression as one operand."""
    expression = _unwrap(expression.strip())
    parts, depth, start, i = [], 0, 0, 0
    while i < len(expression):
        char = expression[i]
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "'":  # a literal: its text is not SQL
            i = expression.index("'", i + 1) if "'" in expression[i + 1:] else len(expression)
        elif depth == 0 and expression[i:i + 5].upper() == " AND ":
            parts.append(expression[start:i])
            start = i = i + 5
            continue
        i += 1
    parts.append(expression[start:])
    return [_unwrap(p.strip()) for p in parts]


def _unwrap(expression: str) -> str:
    """``expression`` without the parentheses that enclose all of it."""
    while expression.startswith("(") and expression.endswith(")"):
        depth = 0
        for i, char in enumerate(expression):
            depth += char == "("
            depth -= char == ")"
            if depth == 0 and i < len(expression) - 1:
                return expression  # "(a) AND (b)": the first pair closes early
        expression = expression[1:-1].strip()
    return expression


#: Leaves of ``:t`` (the table itself when it is not partitioned) that a publication publishing
#: deletes covers (through the leaf or an ancestor) while they lack a replica identity:
#: relation, ``relreplident``, the publications.
_UNPUBLISHABLE = sa.text("""
    SELECT format('%I.%I', n.nspname, c.relname), c.relreplident,
           array_agg(DISTINCT p.pubname ORDER BY p.pubname)
      FROM (SELECT to_regclass(:t) AS oid
            UNION SELECT relid FROM pg_partition_tree(to_regclass(:t)) WHERE isleaf) AS leaf
      JOIN pg_class c ON c.oid = leaf.oid AND c.relkind <> 'p'
      JOIN pg_namespace n ON n.oid = c.relnamespace
      JOIN pg_publication_tables pt
        ON to_regclass(format('%I.%I', pt.schemaname, pt.tablename)) IN (
           SELECT leaf.oid UNION SELECT relid FROM pg_partition_ancestors(leaf.oid))
      JOIN pg_publication p ON p.pubname = pt.pubname AND p.pubdelete
     WHERE c.relreplident <> 'f'
       AND NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisvalid
                       AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                               WHEN 'i' THEN i.indisreplident
                                               ELSE false END)
     GROUP BY 1, 2 ORDER BY 1
""")

_IDENTITY = {"d": "REPLICA IDENTITY DEFAULT and no primary key",
             "n": "REPLICA IDENTITY NOTHING",
             "i": "REPLICA IDENTITY USING INDEX of an index that is gone or invalid"}


def _refuse_unpublishable(conn: sa.Connection, rule: RetentionRule, indexes: list[dict]) -> None:
    """Raise :class:`TableShapeError` when a publication makes PostgreSQL refuse every DELETE
    on the table or one of its partitions (see the module docstring)."""
    found = conn.execute(_UNPUBLISHABLE, {"t": rule.qualified_name}).first()
    if found is None:
        return
    relation, identity, publications = found
    named = ", ".join(publications)
    key_index = next((ix["name"] for ix in indexes if ix["unique"] and not _invalid(ix)
                      and ix["column_names"] == [rule.key.name]
                      and not ix.get("dialect_options", {}).get("postgresql_where")), None)
    using = (f"USING INDEX {key_index}" if key_index and relation == rule.qualified_name
             else "USING INDEX <a unique index on NOT NULL columns>")
    raise TableShapeError(
        f"{rule.qualified_name} cannot be purged: {relation} is in publication"
        f"{'s' if len(publications) > 1 else ''} {named}, which publish"
        f"{'' if len(publications) > 1 else 'es'} deletes, but has no replica identity "
        f"({_IDENTITY.get(identity, identity)}), so PostgreSQL refuses every DELETE on it "
        f"(SQLSTATE 55000). Fix, as the table's owner: ALTER TABLE {relation} REPLICA IDENTITY "
        f"{using} (or REPLICA IDENTITY FULL, which logs whole rows), or leave it out of the "
        f"publication (ALTER PUBLICATION {publications[0]} DROP TABLE {relation})")


#: The first leaf of ``:t`` (as in :data:`_UNPUBLISHABLE`) whose deletes a publication publishes
#: through a row filter on a column outside the leaf's replica identity, and that publication:
#: the leaf, the publication, the filter as PostgreSQL prints it, the filter's columns outside
#: the replica identity, those of its columns that may be NULL on the leaf (no identity index
#: can hold them), the replica identity (``relreplident``), its index's name and key columns
#: (none for ``NOTHING``, or ``DEFAULT`` without a primary key). The filter PostgreSQL applies
#: to a partition is its own or, with ``publish_via_partition_root``, that of its topmost
#: ancestor in the publication; its columns are the ``Var`` nodes of the stored expression
#: (``:var``), matched to the leaf by name. ``REPLICA IDENTITY FULL`` covers every column.
#: PostgreSQL 15 and later.
_FILTERED = sa.text("""
    WITH leaf AS (
        SELECT c.oid, c.relreplident, c.relispartition,
               format('%I.%I', n.nspname, c.relname) AS name
          FROM (SELECT to_regclass(:t) AS oid
                UNION SELECT relid FROM pg_partition_tree(to_regclass(:t)) WHERE isleaf) AS l
          JOIN pg_class c ON c.oid = l.oid AND c.relkind <> 'p'
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relreplident <> 'f'),
    filtered AS (
        SELECT leaf.oid, leaf.name, leaf.relreplident, p.pubname, r.prrelid AS declared,
               r.prqual
          FROM leaf
          JOIN pg_publication p ON p.pubdelete AND NOT p.puballtables
          CROSS JOIN LATERAL (
              SELECT coalesce((
                  SELECT a.relid
                    FROM pg_partition_ancestors(leaf.oid) WITH ORDINALITY AS a(relid, level)
                   WHERE p.pubviaroot AND leaf.relispartition AND a.relid <> leaf.oid
                     AND (EXISTS (SELECT 1 FROM pg_publication_rel pr
                                   WHERE pr.prpubid = p.oid AND pr.prrelid = a.relid)
                          OR EXISTS (SELECT 1 FROM pg_publication_namespace pn
                                      JOIN pg_class ac ON ac.oid = a.relid
                                     WHERE pn.pnpubid = p.oid
                                       AND pn.pnnspid = ac.relnamespace))
                   ORDER BY a.level DESC LIMIT 1), leaf.oid) AS relid) AS published
          JOIN pg_publication_rel r
            ON r.prpubid = p.oid AND r.prrelid = published.relid AND r.prqual IS NOT NULL),
    identity AS (
        SELECT f.oid, ic.relname AS index_name,
               array_agg(att.attname ORDER BY k.n) AS columns
          FROM (SELECT DISTINCT oid, relreplident FROM filtered) AS f
          JOIN pg_index i ON i.indrelid = f.oid AND i.indisvalid
                         AND CASE f.relreplident WHEN 'd' THEN i.indisprimary
                                                 WHEN 'i' THEN i.indisreplident
                                                 ELSE false END
          JOIN pg_class ic ON ic.oid = i.indexrelid
          CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(num, n)
          JOIN pg_attribute att ON att.attrelid = f.oid AND att.attnum = k.num
         WHERE k.n <= i.indnkeyatts
         GROUP BY f.oid, ic.relname)
    SELECT f.name, f.pubname, pg_get_expr(f.prqual, f.declared),
           array_agg(DISTINCT coalesce(col.attname, 'a whole-row reference')
                     ORDER BY coalesce(col.attname, 'a whole-row reference'))
               FILTER (WHERE own.attname IS NULL
                          OR NOT own.attname = ANY (coalesce(identity.columns, '{}'))),
           coalesce(array_agg(DISTINCT col.attname ORDER BY col.attname)
                        FILTER (WHERE NOT coalesce(own.attnotnull, false)), '{}'),
           f.relreplident, identity.index_name, identity.columns
      FROM filtered f
      LEFT JOIN identity ON identity.oid = f.oid
      CROSS JOIN LATERAL regexp_matches(f.prqual::text, :var, 'g') AS v(attno)
      LEFT JOIN pg_attribute col
        ON col.attrelid = f.declared AND col.attnum = v.attno[1]::int2
      LEFT JOIN pg_attribute own
        ON own.attrelid = f.oid AND own.attname = col.attname AND NOT own.attisdropped
     GROUP BY f.name, f.pubname, f.prqual, f.declared, f.relreplident, identity.index_name,
              identity.columns
    HAVING bool_or(own.attname IS NULL
                   OR NOT own.attname = ANY (coalesce(identity.columns, '{}')))
     ORDER BY 1, 2
     LIMIT 1
""")


#: A column reference in a stored expression (``{VAR :varno 1 :varattno 2 ...}``): its number.
_VAR_ATTNO = r":varattno (-?\d+)"


def _refuse_filtered_publication(conn: sa.Connection, rule: RetentionRule) -> None:
    """Raise :class:`TableShapeError` when a publication's row filter makes PostgreSQL refuse
    every DELETE on the table or one of its partitions (see the module docstring). Row filters
    exist from PostgreSQL 15: nothing to read before."""
    if (conn.dialect.server_version_info or (0,)) < (15,):
        return
    found = conn.execute(_FILTERED, {"t": rule.qualified_name, "var": _VAR_ATTNO}).first()
    if found is None:
        return
    relation, publication, row_filter, columns, nullable, identity, index, key = found
    named = ", ".join(columns)
    if identity == "d" and index:
        has = f"the primary key: {', '.join(key)}"
    elif identity == "i" and index:
        has = f"index {index}: {', '.join(key)}"
    else:
        has = _IDENTITY.get(identity, identity)
    one = len(columns) == 1
    # An identity index is unique on NOT NULL columns: it can cover no column that may be NULL.
    index_fix = (f" (the WAL then logs whole rows; no index can serve instead, as "
                 f"{', '.join(nullable)} may be NULL)" if nullable else
                 " (the WAL then logs whole rows), or REPLICA IDENTITY USING INDEX of a unique "
                 "index on NOT NULL columns that include every column of the filter")
    raise TableShapeError(
        f"{rule.qualified_name} cannot be purged: publication {publication} publishes the "
        f"deletes of {relation} with the row filter {row_filter}, on column{'' if one else 's'} "
        f"{named}, which {'is' if one else 'are'} not part of its replica identity ({has}), so "
        f"PostgreSQL refuses every DELETE on it (SQLSTATE 42P10). Fix, as the table's owner: "
        f"ALTER TABLE {relation} REPLICA IDENTITY FULL{index_fix}; or, with the owners of the "
        f"publication's subscribers, a row filter on the replica identity's columns only",
        column=columns[0])


def _normalised(predicate: str | None) -> str:
    return " ".join((predicate or "").lower().replace("(", " ").replace(")", " ").split())


def _clauses(predicate: str | None) -> list[str]:
    """An index predicate as its sorted ``AND`` clauses, normalised."""
    return sorted(c.strip() for c in _normalised(predicate).split(" and ") if c.strip())
