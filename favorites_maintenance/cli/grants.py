"""``grants``: the SQL that gives a policy's job its least-privilege role, rendered for the
policy's table and columns, for ``psql -f -``."""

from __future__ import annotations

import click
import sqlalchemy as sa

from favorites_maintenance.cli.common import fail, load_policy, location_option, policy_engine


@click.command(short_help="Print the SQL of a policy's least-privilege role, for psql.")
@location_option
@click.option("--policy", "policy_name", required=True, metavar="NAME",
              help="The policy whose table, key, guard and age columns the grants name.")
@click.option("--role", required=True, metavar="ROLE",
              help="The job's role, created by the script (it must not exist yet).")
@click.option("--row-level-security", is_flag=True,
              help="Also the row-level security policies the role needs on a table with "
                   "row-level security enabled.")
def grants(policy_name: str, role: str, row_level_security: bool) -> None:
    """Print the SQL that creates ROLE with only what the policy's job needs on its table:
    SELECT on the key, guard and age columns (and ctid), DELETE, and UPDATE on the age column
    for FOR UPDATE SKIP LOCKED only. A policy with a hold_table also gets its hold table
    (created if missing) and SELECT on the columns the hold test reads; a policy with an
    archive_table gets the archive, created as the first run would create it, for which the
    table's columns are read from the policy's database (its database_url_env). Pipe it to psql
    as the table's owner:

        favorites-maintenance grants --policy NAME --role ROLE | psql -f - URL

    The role's password is not set: give it one as your platform manages secrets
    (docs/table.md).
    """
    from favorites_maintenance.retention.errors import InvalidArgumentError
    from favorites_maintenance.retention.least_privilege import (
        hold_privileges_sql,
        least_privilege_sql,
        row_level_security_sql,
    )
    from favorites_maintenance.retention.rule import RuleError

    policy = load_policy(policy_name)
    rule = policy.rule
    try:
        parts = [least_privilege_sql(rule, role)]
        if row_level_security:
            parts.append(row_level_security_sql(rule, role))
        if rule.hold is not None:
            parts.append(hold_privileges_sql(rule, role))
        if policy.archive_table is not None:
            parts.append(_archive_sql(policy, role))
    except RuleError as exc:
        fail(f"policy {policy.name}: {exc}")
    except InvalidArgumentError as exc:
        fail(f"--role: {exc}")
    click.echo("\n".join(parts), nl=False)


def _archive_sql(policy, role: str) -> str:
    """The archive's grants and DDL for ``policy``, its table's columns read from its database;
    exits naming the variable when they cannot be read."""
    from favorites_maintenance.config.parsers import safe_url
    from favorites_maintenance.retention.archive import table_columns
    from favorites_maintenance.retention.errors import ConnectError, describe
    from favorites_maintenance.retention.least_privilege import archive_privileges_sql

    engine, url = policy_engine(
        policy, needed_for=f"the archive's DDL needs the columns of {policy.rule.qualified_name}")
    try:
        with engine.connect() as conn:
            columns = table_columns(conn, policy.rule.qualified_name)
    except (ConnectError, sa.exc.DBAPIError) as exc:
        reason = exc.error if isinstance(exc, ConnectError) else describe(exc)
        fail(f"could not read the columns of {policy.rule.qualified_name}: {reason} (database "
             f"{safe_url(url)}: check {policy.database_url_env})")
    finally:
        engine.dispose()
    if columns is None:
        fail(f"table {policy.rule.qualified_name} does not exist in {safe_url(url)}: create it "
             "before its archive")
    return archive_privileges_sql(policy.rule, role, policy.archive_table, columns)
