"""The least-privilege role of the cleanup: the shipped SQL and a helper that applies it.

``least_privilege.sql`` (next to this module) is written for ``psql -v role=NAME -f``; the
helper substitutes the role name (quoted as an identifier) and runs the same text, so what the
tests prove is what operators run.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from importlib.resources import files

import sqlalchemy as sa

from favorites_maintenance.retention.errors import InvalidArgumentError

SQL_RESOURCE = "least_privilege.sql"
RLS_RESOURCE = "row_level_security.sql"
#: What a policy with an archive needs on top (optional; the guest-favorites policy has none).
ARCHIVE_RESOURCE = "least_privilege_archive.sql"
#: What a policy with drop_expired_partitions needs on top (optional): the owner's functions
#: that detach and drop expired partitions of ``favorites.favorites``.
PARTITIONS_RESOURCE = "least_privilege_partitions.sql"
_PLACEHOLDER = ':"role"'


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


def apply_partition_functions(engine: sa.Engine, role: str) -> None:
    """Install, as the owner of a range-partitioned ``favorites.favorites``, the functions that
    detach and drop its expired partitions for ``role`` (``least_privilege_partitions.sql``:
    ``favorites.favorites_detach_partition`` and ``favorites.favorites_drop_detached``,
    ``SECURITY DEFINER``, EXECUTE granted to ``role`` only).

    Args:
        engine: connected as the table's owner.
        role: the cleanup's role.
    """
    with engine.begin() as conn:
        # The driver's cursor, without parameters: the functions' bodies hold '%' of format().
        conn.connection.cursor().execute(least_privilege_sql(role, PARTITIONS_RESOURCE))


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
