"""The least-privilege role of a policy's cleanup: the shipped SQL templates, rendered for the
policy's rule, and helpers that apply them.

Each ``.sql`` file next to this module is a template for one rule: ``{{field}}`` stands for
the rule's table, schema or columns (each quoted as a PostgreSQL identifier), ``:"role"`` for
the role, as ``psql -v role=NAME`` would fill it. ``favorites-maintenance grants`` prints the
rendered text for ``psql -f -``; the helpers here run the same text, so what the tests prove is
what operators run. ``least_privilege_partitions.sql`` is rendered by
:func:`partition_functions_sql`, the text ``favorites-maintenance partition-functions`` prints.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from importlib.resources import files

import sqlalchemy as sa

from favorites_maintenance.retention.archive import (
    ArchiveTarget,
    TableColumn,
    create_archive_sql,
    table_columns,
)
from favorites_maintenance.retention.errors import InvalidArgumentError
from favorites_maintenance.retention.holds import changes_of, create_hold_table_sql
from favorites_maintenance.retention.partition_checks import bypass_query
from favorites_maintenance.retention.partition_phase import DETACH_FUNCTION, DROP_FUNCTION
from favorites_maintenance.retention.rule import RetentionRule, RuleError

SQL_RESOURCE = "least_privilege.sql"
RLS_RESOURCE = "row_level_security.sql"
#: What a policy with an archive needs on top (optional).
ARCHIVE_RESOURCE = "least_privilege_archive.sql"
#: What a policy with drop_expired_partitions needs on top (optional): the owner's functions
#: that detach and drop expired partitions of the policy's table (:func:`partition_functions_sql`).
PARTITIONS_RESOURCE = "least_privilege_partitions.sql"
#: What a policy with a hold_table needs on top (optional): SELECT on the hold table's columns
#: the hold test and the held_rows check read, the table created by the owner.
HOLDS_RESOURCE = "least_privilege_holds.sql"
_PLACEHOLDER = ':"role"'
_TEMPLATE_FIELD = re.compile(r"\{\{(\w+)\}\}")
#: PostgreSQL's longest identifier, in bytes (NAMEDATALEN - 1); a longer one is truncated.
_MAX_IDENTIFIER_BYTES = 63


def _template(resource: str, role: str) -> str:
    """The shipped file ``resource`` with ``:"role"`` replaced by ``role`` quoted as an
    identifier.

    Raises:
        InvalidArgumentError: ``role`` is empty or holds a NUL character.
    """
    if not role or "\x00" in role:
        raise InvalidArgumentError("role must be a non-empty name")
    text = files("favorites_maintenance.retention").joinpath(resource).read_text("utf-8")
    return text.replace(_PLACEHOLDER, _identifier(role))


def _render(resource: str, role: str, fields: dict[str, str]) -> str:
    """The template ``resource`` with ``role`` and every ``{{field}}`` filled in."""
    return _TEMPLATE_FIELD.sub(lambda m: fields[m[1]], _template(resource, role))


def _rule_fields(rule: RetentionRule) -> dict[str, str]:
    """The fields every template takes from ``rule``: its table, schema and columns."""
    guards = [c.name for c in rule.guards]
    return {
        "table": rule.qualified_name,
        "table_sql": _identifier(rule.table.schema) + "." + _identifier(rule.table.name),
        "schema_sql": _identifier(rule.table.schema),
        "key": rule.key.name,
        "age": rule.age.name,
        "age_sql": _identifier(rule.age.name),
        "guard_text": rule.guard_sql or "none (every row old enough is deleted)",
        # The key, the guard and the age column: what every statement of the job reads.
        "read_columns_sql": ", ".join(_identifier(c) for c in
                                      dict.fromkeys([rule.key.name, *guards, rule.age.name])),
    }


def least_privilege_sql(rule: RetentionRule, role: str) -> str:
    """``least_privilege.sql`` rendered for ``rule``: the script creating ``role`` with what
    the job needs on the rule's table (SELECT on the key, guard and age columns and ``ctid``,
    DELETE, UPDATE on the age column for ``FOR UPDATE`` only).

    Raises:
        InvalidArgumentError: ``role`` is empty or holds a NUL character.
    """
    return _render(SQL_RESOURCE, role, _rule_fields(rule))


def row_level_security_sql(rule: RetentionRule, role: str) -> str:
    """``row_level_security.sql`` rendered for ``rule``: the three row-level security policies
    ``role`` needs on the rule's table (SELECT, UPDATE for ``FOR UPDATE`` only, DELETE), each
    admitting the rows of the guard only (every row for a rule with no guard), named
    ``<table>_cleanup_select``, ``_lock`` and ``_delete``.

    Raises:
        InvalidArgumentError: ``role`` is empty or holds a NUL character.
        RuleError: a policy's name would be longer than PostgreSQL's 63 bytes.
    """
    fields = _rule_fields(rule)
    for kind in ("select", "lock", "delete"):
        name = f"{rule.table.name}_cleanup_{kind}"
        if len(name.encode("utf-8")) > _MAX_IDENTIFIER_BYTES:
            raise RuleError(f"table {rule.qualified_name!r}: the row-level security policy "
                            f"{name} is longer than PostgreSQL's {_MAX_IDENTIFIER_BYTES} "
                            "bytes; shorten the table's name")
        fields[f"{kind}_policy"] = _identifier(name)
    fields["guard_sql"] = " AND ".join(
        f"{_identifier(c.name)} IS NULL" for c in rule.guards) or "true"
    return _render(RLS_RESOURCE, role, fields)


def hold_privileges_sql(rule: RetentionRule, role: str) -> str:
    """``least_privilege_holds.sql`` rendered for ``rule`` and its hold table: the hold table
    created if missing (the DDL ``hold init`` runs), SELECT on its ``policy``, ``held_value``,
    ``placed_at`` and ``released_at``, SELECT on its change counter
    (:func:`~favorites_maintenance.retention.holds.changes_of`), and SELECT on the hold column when
    :func:`least_privilege_sql` does not grant it already; nothing that writes a hold.

    Raises:
        InvalidArgumentError: ``role`` is empty or holds a NUL character, or ``rule`` has no
            hold table.
    """
    if rule.hold is None:
        raise InvalidArgumentError(f"the rule of {rule.qualified_name} has no hold table")
    fields = _rule_fields(rule)
    schema, _, name = rule.hold.qualified_name.partition(".")
    column = rule.hold.column
    granted = {rule.key.name, rule.age.name, *(c.name for c in rule.guards)}
    fields.update(
        hold_table=rule.hold.qualified_name, hold_column=column,
        hold_table_sql=_identifier(schema) + "." + _identifier(name),
        hold_changes_sql=_identifier(schema) + "." + _identifier(
            changes_of(rule.hold.table).name),
        create_hold_table=";\n".join(create_hold_table_sql(rule.hold.qualified_name)) + ";",
        hold_column_grant="" if column in granted else (
            f"GRANT SELECT ({_identifier(column)}) ON TABLE {fields['table_sql']} "
            f"TO {_identifier(role)};\n"))
    return _render(HOLDS_RESOURCE, role, fields)


def archive_privileges_sql(rule: RetentionRule, role: str, archive_table: str,
                           columns: tuple[TableColumn, ...]) -> str:
    """``least_privilege_archive.sql`` rendered for ``rule`` and its archive ``archive_table``
    (``schema.table``): SELECT on every column of the rule's table, INSERT for a restore, and
    the archive created by the owner (the DDL a run would run, for a table of ``columns``, as
    :func:`~favorites_maintenance.retention.archive.table_columns` reads them) with SELECT,
    INSERT and DELETE on it.

    Raises:
        InvalidArgumentError: ``role`` is empty or holds a NUL character, or ``archive_table``
            is not ``schema.table`` of identifiers.
    """
    from sqlalchemy.dialects import postgresql

    target = ArchiveTarget(archive_table, "policy", "run")
    fields = _rule_fields(rule)
    fields.update(archive=archive_table,
                  archive_sql=_identifier(target.schema) + "." + _identifier(target.name),
                  create_archive=create_archive_sql(target, columns, postgresql.dialect()))
    return _render(ARCHIVE_RESOURCE, role, fields)


def apply_row_level_security(engine: sa.Engine, role: str, rule: RetentionRule) -> None:
    """Create the row-level security policies ``role`` needs on ``rule``'s table
    (:func:`row_level_security_sql`).

    Args:
        engine: connected as the table's owner.
        role: the cleanup's role (see :func:`apply_least_privilege`).
        rule: the policy's rule.

    Raises:
        InvalidArgumentError, RuleError: as :func:`row_level_security_sql`.
    """
    with engine.begin() as conn:
        conn.exec_driver_sql(row_level_security_sql(rule, role))


def apply_archive_privileges(engine: sa.Engine, role: str, rule: RetentionRule,
                             archive_table: str) -> None:
    """Give ``role`` what a policy of ``rule`` with the archive ``archive_table`` needs on top
    of :func:`apply_least_privilege` (:func:`archive_privileges_sql`, for the table's columns
    as the catalog has them now).

    Args:
        engine: connected as the table's owner.
        role: the cleanup's role.
        rule: the policy's rule.
        archive_table: the policy's ``archive_table``, ``schema.table``.

    Raises:
        InvalidArgumentError: as :func:`archive_privileges_sql`, or the table does not exist.
    """
    with engine.begin() as conn:
        columns = table_columns(conn, rule.qualified_name)
        if columns is None:
            raise InvalidArgumentError(f"table {rule.qualified_name} does not exist")
        conn.exec_driver_sql(archive_privileges_sql(rule, role, archive_table, columns))


def apply_hold_privileges(engine: sa.Engine, role: str, rule: RetentionRule) -> None:
    """Give ``role`` what a policy of ``rule`` with its hold table needs on top of
    :func:`apply_least_privilege` (:func:`hold_privileges_sql`).

    Args:
        engine: connected as the schema's owner (or a superuser).
        role: the cleanup's role.
        rule: the policy's rule, with its hold table (:meth:`RetentionRule.with_hold`).

    Raises:
        InvalidArgumentError: as :func:`hold_privileges_sql`.
        sqlalchemy.exc.DBAPIError: the database refused (the role does not exist, no CREATE
            on the schema).
    """
    with engine.begin() as conn:
        conn.exec_driver_sql(hold_privileges_sql(rule, role))


def partition_functions_sql(rule: RetentionRule, role: str) -> str:
    """The SQL that installs, as the owner of the rule's range-partitioned table, the two
    ``SECURITY DEFINER`` functions the job calls to detach and drop its expired partitions
    (``least_privilege_partitions.sql`` rendered for the rule), with EXECUTE granted to
    ``role`` only.

    For a table ``schema.table`` the functions are ``schema.table_detach_partition(regclass,
    timestamptz, integer)`` and ``schema.table_drop_detached(regclass, interval, integer)``,
    the names the job looks up. Every name reaches the text quoted as a PostgreSQL identifier
    (or as a string literal where the functions compare or format it). A partition is kept
    when it holds a row with ANY of the rule's guard columns NOT NULL; for a rule with no guard
    no row keeps a partition.

    Args:
        rule: the policy's rule (its table, age column and guard columns).
        role: the cleanup's role, granted EXECUTE.

    Returns:
        The script, one transaction's worth of statements, for ``psql -f -`` or
        :func:`apply_partition_functions`.

    Raises:
        InvalidArgumentError: ``role`` is empty or holds a NUL character.
        RuleError: a function's name would be longer than PostgreSQL's 63 bytes (the message
            names the table).
    """
    schema, table = rule.table.schema, rule.table.name
    names = {}
    for key, template in (("detach_function", DETACH_FUNCTION), ("drop_function", DROP_FUNCTION)):
        name = template.format(schema=schema, table=table).split(".", 1)[1]
        if len(name.encode("utf-8")) > _MAX_IDENTIFIER_BYTES:
            raise RuleError(
                f"table {rule.qualified_name!r}: the function {schema}.{name} that "
                f"drop_expired_partitions needs is longer than PostgreSQL's "
                f"{_MAX_IDENTIFIER_BYTES} bytes; shorten the table's name")
        names[key] = _identifier(schema) + "." + _identifier(name)
    guards = [c.name for c in rule.guards]
    if guards:
        kept = " OR ".join(f"{_identifier(g)} IS NOT NULL" for g in guards)
        guard_names = " or ".join(guards)
        guard_text = f"row with {guard_names} NOT NULL"
    else:
        # No guard keeps no row: the check finds nothing and lets the partition go.
        kept, guard_names, guard_text = "false", "", "row the rule keeps (none: it has no guard)"
    fields = {
        **names,
        "table": rule.qualified_name,
        "age": rule.age.name,
        "guard_text": guard_text,
        "parent_literal": _literal(_identifier(schema) + "." + _identifier(table)),
        # What the job writes in, and compares with, a detached table's comment.
        "table_literal": _literal(rule.qualified_name),
        "age_literal": _literal(rule.age.name),
        "kept_condition": _literal(kept),
        "guard_names": _literal(guard_names),
        # What the function checks again under its lock: the job's own check, as text.
        "bypass_query": bypass_query("part", "parent").lstrip("\n"),
    }
    text = _render(PARTITIONS_RESOURCE, role, fields)
    # A name holding "$fn$" would end the functions' bodies early: quote them with a tag the
    # names do not hold.
    values = "".join(fields.values())
    tag, n = "$fn$", 0
    while tag in values:
        n += 1
        tag = f"$fn{n}$"
    return text.replace("$fn$", tag)


def apply_partition_functions(engine: sa.Engine, role: str, rule: RetentionRule) -> None:
    """Install, as the owner of the rule's range-partitioned table, the functions that detach
    and drop its expired partitions for ``role`` (:func:`partition_functions_sql`:
    ``<schema>.<table>_detach_partition`` and ``<schema>.<table>_drop_detached``, ``SECURITY
    DEFINER``, EXECUTE granted to ``role`` only).

    Args:
        engine: connected as the table's owner.
        role: the cleanup's role.
        rule: the policy's rule.

    Raises:
        InvalidArgumentError, RuleError: as :func:`partition_functions_sql`.
    """
    text = partition_functions_sql(rule, role)
    with engine.begin() as conn:
        # The driver's cursor, without parameters: the functions' bodies hold '%' of format().
        conn.connection.cursor().execute(text)


def _identifier(name: str) -> str:
    """``name`` quoted as a PostgreSQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def apply_least_privilege(engine: sa.Engine, role: str, rule: RetentionRule, *,
                          password: str | None = None) -> None:
    """Create ``role`` with the cleanup's privileges on ``rule``'s table
    (:func:`least_privilege_sql`).

    Args:
        engine: connected as the table owner or a superuser.
        role: name of the new role (must not exist).
        rule: the policy's rule.
        password: optional; sent only as a SCRAM-SHA-256 verifier computed here, so the clear
            text never reaches the server, its logs, or the text of an error.

    Raises:
        InvalidArgumentError: as :func:`least_privilege_sql`.
    """
    with engine.begin() as conn:
        conn.exec_driver_sql(least_privilege_sql(rule, role))
        if password is not None:
            conn.execute(sa.text("SELECT set_config('favorites.verifier', :v, true)"),
                         {"v": scram_sha256_verifier(password)})
            conn.execute(sa.text(
                "DO $$ BEGIN EXECUTE format('ALTER ROLE %I PASSWORD %L', "
                f"{_literal(role)}, current_setting('favorites.verifier')); END $$"))


def scram_sha256_verifier(password: str, *, iterations: int = 4096) -> str:
    """The ``SCRAM-SHA-256$...`` verifier PostgreSQL stores for ``password`` (RFC 5802/7677)."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    b64 = lambda b: base64.b64encode(b).decode("ascii")  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
