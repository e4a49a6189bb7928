"""The least-privilege role of the cleanup: the shipped SQL and a helper that applies it.

``least_privilege.sql`` (next to this module) is written for ``psql -v role=NAME -f``; the
helper substitutes the role name (quoted as an identifier) and runs the same text, so what the
tests prove is what operators run. ``least_privilege_partitions.sql`` is a template rendered
for a policy's rule by :func:`partition_functions_sql`, the text ``favorites-maintenance
partition-functions`` prints.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from importlib.resources import files

import sqlalchemy as sa

from favorites_maintenance.retention.errors import InvalidArgumentError
from favorites_maintenance.retention.partition_phase import DETACH_FUNCTION, DROP_FUNCTION
from favorites_maintenance.retention.rule import RetentionRule, RuleError

SQL_RESOURCE = "least_privilege.sql"
RLS_RESOURCE = "row_level_security.sql"
#: What a policy with an archive needs on top (optional; the guest-favorites policy has none).
ARCHIVE_RESOURCE = "least_privilege_archive.sql"
#: What a policy with drop_expired_partitions needs on top (optional): the owner's functions
#: that detach and drop expired partitions of the policy's table. A template, rendered for a
#: rule by :func:`partition_functions_sql`.
PARTITIONS_RESOURCE = "least_privilege_partitions.sql"
#: What a policy with a hold_table needs on top (optional): SELECT on the hold table's columns
#: the hold test and the held_rows check read, the table created by the owner.
HOLDS_RESOURCE = "least_privilege_holds.sql"
_PLACEHOLDER = ':"role"'
_TEMPLATE_FIELD = re.compile(r"\{\{(\w+)\}\}")
#: PostgreSQL's longest identifier, in bytes (NAMEDATALEN - 1); a longer one is truncated.
_MAX_IDENTIFIER_BYTES = 63


def least_privilege_sql(role: str, resource: str = SQL_RESOURCE) -> str:
    """A shipped SQL file (``least_privilege.sql`` by default) with ``:"role"`` replaced by
    ``role`` quoted as an identifier."""
    if not role or "\x00" in role:
        raise InvalidArgumentError("role must be a non-empty name")
    quoted = '"' + role.replace('"', '""') + '"'
    text = files("favorites_maintenance.retention").joinpath(resource).read_text("utf-8")
    return text.replace(_PLACEHOLDER, quoted)


def apply_row_level_security(engine: sa.Engine, role: str) -> None:
    """Create the row-level security policies ``role`` needs on ``favorites.favorites``
    (``row_level_security.sql``: SELECT, UPDATE for ``FOR UPDATE`` only, and DELETE, each
    admitting guest rows only).

    Args:
        engine: connected as the table's owner.
        role: the cleanup's role (see :func:`apply_least_privilege`).
    """
    with engine.begin() as conn:
        conn.exec_driver_sql(least_privilege_sql(role, RLS_RESOURCE))


def apply_archive_privileges(engine: sa.Engine, role: str) -> None:
    """Give ``role`` what a policy on ``favorites.favorites`` with the archive
    ``favorites.favorites_archive`` needs on top of :func:`apply_least_privilege`
    (``least_privilege_archive.sql``: SELECT on every column, INSERT for a restore, the archive
    created by the owner with SELECT, INSERT and DELETE on it).

    Args:
        engine: connected as the table's owner.
        role: the cleanup's role.
    """
    with engine.begin() as conn:
        conn.exec_driver_sql(least_privilege_sql(role, ARCHIVE_RESOURCE))


def apply_hold_privileges(engine: sa.Engine, role: str) -> None:
    """Give ``role`` what a policy on ``favorites.favorites`` with the hold table
    ``favorites.retention_holds`` (holds on ``id``) needs on top of
    :func:`apply_least_privilege` (``least_privilege_holds.sql``: the hold table created by
    the owner if missing, and SELECT on its ``policy``, ``held_value``, ``placed_at`` and
    ``released_at``; nothing that writes a hold).

    Args:
        engine: connected as the schema's owner (or a superuser).
        role: the cleanup's role.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused (the role does not exist, no CREATE
            on the schema).
    """
    with engine.begin() as conn:
        conn.exec_driver_sql(least_privilege_sql(role, HOLDS_RESOURCE))


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
    }
    text = _TEMPLATE_FIELD.sub(lambda m: fields[m[1]], least_privilege_sql(role,
                                                                          PARTITIONS_RESOURCE))
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


def apply_least_privilege(engine: sa.Engine, role: str, *, password: str | None = None) -> None:
    """Create ``role`` with the cleanup's privileges on the database of ``engine``.

    Args:
        engine: connected as the table owner or a superuser.
        role: name of the new role (must not exist).
        password: optional; sent only as a SCRAM-SHA-256 verifier computed here, so the clear
            text never reaches the server, its logs, or the text of an error.
    """
    with engine.begin() as conn:
        conn.exec_driver_sql(least_privilege_sql(role))
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
