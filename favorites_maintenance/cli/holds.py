"""``hold``: place, release and list the holds that keep rows from a policy's runs
(``hold init`` creates the hold table)."""

from __future__ import annotations

import datetime as dt

import click
import sqlalchemy as sa

from favorites_maintenance.cli.common import (
    echo,
    fail,
    load_policy,
    location_option,
    policy_engine,
)

UTC = dt.timezone.utc


@click.group(short_help="Place, release and list a policy's holds.")
def hold() -> None:
    """Holds keep rows from a policy's runs, whatever their age, until released: a row whose
    hold column (the policy's hold_column, default its key) has the value of an active hold of
    the policy is never deleted, archived or detached with its partition (docs/holds.md).

    Each command works on the hold table the policy's defs.yaml names (hold_table), in the
    policy's own database (the variable its database_url_env names).
    """


def _holds_of(policy_name: str):
    """The policy's holds, an engine on its database and the variable that names the database,
    or exit naming what is missing."""
    policy = load_policy(policy_name)
    if policy.rule.hold is None:
        variable = policy.labels.get("hold_table")
        where = (f"set {variable} to schema.table" if variable else
                 "add hold_table: schema.table (and hold_column when a hold matches another "
                 "column than the key) to its defs.yaml")
        fail(f"--policy {policy.name}: the policy names no hold table; {where}, then run "
              "hold init (docs/holds.md)")
    engine, _ = policy_engine(policy)
    return policy.rule.hold, engine, policy.database_url_env


def _hold_database_error(holds, exc, variable: str) -> None:
    """Exit with a database error of a hold command, its fix named."""
    from favorites_maintenance.retention.errors import ErrorKind, describe

    error = describe(exc) if isinstance(exc, sa.exc.DBAPIError) else exc.error
    # The database was not reached, whatever the hold table.
    unreachable = {ErrorKind.CONNECTION_LOST, ErrorKind.AUTHENTICATION_FAILED,
                   ErrorKind.UNKNOWN_DATABASE, ErrorKind.TLS_ERROR, ErrorKind.TOO_MANY_CONNECTIONS}
    hint = ""
    if getattr(error, "kind", None) in unreachable:
        hint = f"; check {variable} and that the server runs"
    elif getattr(error, "kind", None) is ErrorKind.PERMISSION_DENIED:
        hint = f"; grant the role SELECT, INSERT and UPDATE on {holds.qualified_name}"
    elif "does not exist" in str(error):
        hint = (f"; create it with favorites-maintenance hold init --policy {holds.policy}")
    fail(f"hold table {holds.qualified_name}: {error}{hint}")


@hold.command("init", short_help="Create the policy's hold table if it does not exist.")
@location_option
@click.option("--policy", "policy_name", required=True, metavar="NAME",
              help="The policy whose hold_table to create.")
@click.option("--print-sql", is_flag=True,
              help="Print the DDL instead of running it (for psql, as the schema's owner).")
def hold_init(policy_name: str, print_sql: bool) -> None:
    """Create the hold table the policy names, and its partial index on the active holds, if
    they do not exist (CREATE TABLE IF NOT EXISTS: safe to run again)."""
    from favorites_maintenance.retention.errors import ConnectError
    from favorites_maintenance.retention.holds import create_hold_table, create_hold_table_sql

    if print_sql:
        policy = load_policy(policy_name)
        if policy.rule.hold is None:
            _holds_of(policy_name)  # exits naming the missing hold_table
        click.echo(";\n".join(create_hold_table_sql(policy.rule.hold.qualified_name)) + ";")
        return
    holds, engine, variable = _holds_of(policy_name)
    try:
        create_hold_table(engine, holds.qualified_name)
    except (sa.exc.DBAPIError, ConnectError) as exc:
        _hold_database_error(holds, exc, variable)
    finally:
        engine.dispose()
    echo(f"hold table {holds.qualified_name} ready")


@hold.command("place", short_help="Place a hold; print its id.")
@location_option
@click.option("--policy", "policy_name", required=True, metavar="NAME",
              help="The policy whose runs the hold stops.")
@click.option("--key", "value", required=True, metavar="VALUE",
              help="The value of the policy's hold column (its key by default) to hold; - "
                   "reads it from standard input (one line), out of the process list.")
@click.option("--reason", required=True, metavar="TEXT",
              help="Why (a ticket, a case): kept with the hold.")
@click.option("--by", "placed_by", default=None, metavar="WHO",
              help="Who places it (default: the user running the command).")
def hold_place(policy_name: str, value: str, reason: str, placed_by: str | None) -> None:
    """Place a hold of the policy on --key and print its id (and nothing else). From its
    commit on, no batch deletes a row it covers; a run in flight skips it from its next
    batch on. A key no row has now is held all the same (its row may be inserted later),
    with a warning on stderr."""
    import getpass

    from favorites_maintenance.retention.errors import ConnectError, InvalidArgumentError
    from favorites_maintenance.retention.holds import (
        ROW_CHECK_TIMEOUT_MS,
        a_row_has,
        place_hold,
    )

    if value == "-":
        with click.open_file("-") as stdin:
            value = stdin.readline().rstrip("\r\n")
    holds, engine, variable = _holds_of(policy_name)
    table = load_policy(policy_name).rule.qualified_name
    try:
        hold_id = place_hold(engine, holds, value, reason=reason,
                             placed_by=placed_by or getpass.getuser(), of_table=table)
        try:
            matched = a_row_has(engine, table, holds.column, value)
        except (sa.exc.DBAPIError, ConnectError):
            # The hold is committed: its id must reach the operator, who would place it again.
            matched = None
    except InvalidArgumentError as exc:
        fail(str(exc).replace("hold key", "--key").replace("hold reason", "--reason")
              .replace("hold by", "--by"))
    except (sa.exc.DBAPIError, ConnectError) as exc:
        _hold_database_error(holds, exc, variable)
    finally:
        engine.dispose()
    # The key itself is not repeated: it names a row, and stderr ends up in logs.
    if matched is False:
        click.echo(f"warning: no row of {table} has this {holds.column} now: the hold is "
                   "placed and keeps such a row once it exists; check the key if it should "
                   "be there", err=True)
    elif matched is None:
        click.echo(f"warning: could not tell whether a row of {table} has this "
                   f"{holds.column} (no SELECT on the table, or it took over "
                   f"{ROW_CHECK_TIMEOUT_MS // 1000} s): the hold is placed", err=True)
    echo(str(hold_id))


@hold.command("release", short_help="Release a hold by its id.")
@location_option
@click.option("--policy", "policy_name", required=True, metavar="NAME",
              help="The policy the hold belongs to.")
@click.option("--id", "hold_id", required=True, type=click.IntRange(min=1), metavar="ID",
              help="The hold's id, as hold place printed it.")
@click.option("--by", "released_by", default=None, metavar="WHO",
              help="Who releases it (default: the user running the command).")
def hold_release(policy_name: str, hold_id: int, released_by: str | None) -> None:
    """Release an active hold. Its rows are prunable again at the policy's next run, by the
    rule as it stands, unless another active hold covers them. The hold stays in the table,
    with when and by whom it was released."""
    import getpass

    from favorites_maintenance.retention.errors import ConnectError
    from favorites_maintenance.retention.holds import release_hold

    holds, engine, variable = _holds_of(policy_name)
    try:
        released = release_hold(engine, holds, hold_id,
                                released_by=released_by or getpass.getuser())
    except (sa.exc.DBAPIError, ConnectError) as exc:
        _hold_database_error(holds, exc, variable)
    finally:
        engine.dispose()
    if not released:
        fail(f"--id {hold_id}: no active hold of policy {holds.policy} has this id (released "
              f"already, another policy's, or unknown); hold list --policy {holds.policy} "
              "shows the active ones")
    echo(f"hold {hold_id} released")


@hold.command("list", short_help="List a policy's active holds.")
@location_option
@click.option("--policy", "policy_name", required=True, metavar="NAME",
              help="The policy whose holds to list.")
@click.option("--all", "include_released", is_flag=True, help="Released holds too.")
@click.option("--show-keys", is_flag=True,
              help="Print each hold's held value too (left out by default: it names a row).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
def hold_list(policy_name: str, include_released: bool, show_keys: bool, as_json: bool) -> None:
    """List the policy's active holds (with --all, released ones too), oldest first: id, when
    and by whom placed, why, and when and by whom released. The held values are printed only
    with --show-keys."""
    import json

    from favorites_maintenance.retention.errors import ConnectError
    from favorites_maintenance.retention.holds import list_holds

    holds, engine, variable = _holds_of(policy_name)
    try:
        found = list_holds(engine, holds, include_released=include_released)
    except (sa.exc.DBAPIError, ConnectError) as exc:
        _hold_database_error(holds, exc, variable)
    finally:
        engine.dispose()
    listed = [{"id": h.hold_id, **({"key": h.held_value} if show_keys else {}),
               "placed_at": h.placed_at.astimezone(UTC).isoformat(), "placed_by": h.placed_by,
               "reason": h.reason,
               "released_at": h.released_at.astimezone(UTC).isoformat() if h.released_at
               else None, "released_by": h.released_by} for h in found]
    if as_json:
        echo(json.dumps({"policy": holds.policy, "hold_table": holds.qualified_name,
                          "holds": listed}, indent=2))
        return
    if not listed:
        echo(f"no {'' if include_released else 'active '}holds of policy {holds.policy}")
    for h in listed:
        state = (f"released {h['released_at']} by {h['released_by']}" if h["released_at"]
                 else "active")
        key = f"  key {h['key']}" if show_keys else ""
        echo(f"{h['id']:>8}  placed {h['placed_at']} by {h['placed_by']}  {state}{key}  "
              f"reason: {h['reason']}")
