"""``demo`` and ``dev``: the embedded PostgreSQL server of the checkout, seeded, with one run
of a policy's job (``demo``) or the Dagster UI and daemon until Ctrl-C (``dev``)."""

from __future__ import annotations

import os

import click

from favorites_maintenance.cli.common import (
    check_deployment_settings,
    echo,
    fail,
    load_policy,
    location_option,
    location_tree,
    policy_option,
    warn_broken,
)
from favorites_maintenance.config.deployment import load_deployment_settings
from favorites_maintenance.config.parsers import WEBSERVER_BASE_URL_VAR


@click.command(short_help="Seed a local database, run the cleanup once, print what it did.")
@click.option("--rows", default=200_000, show_default=True, type=click.IntRange(min=1000),
              help="Rows to seed into the dev table (guest and account rows over three years).")
@click.option("--pretend", is_flag=True,
              help="Seed, then only report how many rows the rule matches; delete nothing.")
@policy_option
@location_option
def demo(rows: int, pretend: bool, policy_name: str) -> None:
    """Seed the embedded PostgreSQL and run the cleanup job once through Dagster.

    Starts the embedded PostgreSQL server of this checkout, DROPS AND RECREATES the schema
    favorites (every table in it) in its "favorites" database, seeds favorites.favorites, runs guest_favorites_cleanup_job
    for the latest complete day and prints rows deleted, batches, duration, backlog, and the
    guest and account rows before and after.

    Everything lives in .favorites-maintenance/ of the checkout (ignored by git): the server's
    data in pgdata/, the Dagster instance in dagster_home/ (the run stays in its history, as
    `dev` shows it). FAVORITES_DATABASE_URL is ignored: demo never touches another database.

    With --policy, the policy's job runs instead, on the policy's own embedded database:
    eu_guest_favorites runs on the second one, favorites_eu, seeded the same way;
    any other policy's table must already exist in the embedded "favorites" database.
    With -m, the policies are those of that code location (a project of your own) instead of
    this package's; the server and the instance are still the checkout's.
    """
    from favorites_maintenance.local.demo import DemoError, run_demo

    check_deployment_settings()
    policy = load_policy(policy_name, local=True)
    env = _start_local_environment("demo")
    try:
        run_demo(env, rows=rows, pretend=pretend, policy=policy, echo=echo,
                 tree=location_tree())
    except DemoError as exc:
        fail(str(exc))
    finally:
        _stop_local_environment(env)


@click.command(short_help="Run the Dagster UI and daemon on a local database until Ctrl-C.")
@click.option("--port", default=3000, show_default=True, type=click.IntRange(1, 65535),
              help="Port of the Dagster UI on 127.0.0.1.")
@click.option("--rows", default=200_000, show_default=True, type=click.IntRange(min=1000),
              help="Rows to seed into the dev table when it is empty (or with --reseed).")
@click.option("--reseed", is_flag=True,
              help="Drop and recreate the dev table and seed it again, e.g. after a demo "
                   "deleted its prunable rows.")
@click.option("--debug", is_flag=True,
              help="Also print DEBUG lines of runs (every step event and purge batch) in this "
                   "terminal; the UI's run log has them either way.")
def dev(port: int, rows: int, reseed: bool, debug: bool) -> None:
    """Run the Dagster UI and daemon on the embedded PostgreSQL server until Ctrl-C.

    The server holds Dagster's storage, the favorites database and a second one,
    favorites_eu, with the policy eu_guest_favorites on it (dev only): two policies on
    two databases. The dev tables are created and seeded when empty (--reseed: always; the
    second database gets a tenth of --rows). Data lives in .favorites-maintenance/ of the
    checkout. An exported FAVORITES_DATABASE_URL is ignored: dev only ever touches its embedded
    databases. The terminal gets INFO and above (--debug: everything), without colour when it
    is not a terminal.
    """
    from favorites_maintenance.local.dev import (asset_page, dagster_dev_command,
                                                 ensure_pool_limits, prepare_dev_table,
                                                 run_dagster_dev, ui_address)
    from favorites_maintenance.local.processes import port_is_free
    from favorites_maintenance.local.second_database import (EU_DATABASE, EU_POLICY,
                                                             EU_URL_VAR, prepare_eu_table,
                                                             second_tree, write_workspace)
    from favorites_maintenance.retention.database import create_engine

    from favorites_maintenance.components.policy_tree import load_policies, policy_files

    check_deployment_settings()
    for broken in [f for f in policy_files() if f.error]:
        warn_broken(broken.error)
    if not port_is_free(port):
        fail(f"port {port} on 127.0.0.1 is in use; pick another with --port")
    env = _start_local_environment("dev")
    try:
        engine = create_engine(load_deployment_settings().require_database_url())
        try:
            prepare_dev_table(engine, rows, echo, reseed=reseed)
        finally:
            engine.dispose()
        prepare_eu_table(max(1000, rows // 10), echo, reseed=reseed)
        # The valid policies (a broken file is the code location's load error, in the UI),
        # and the second database's.
        policies = [*(p for f in policy_files() for p in f.policies),
                    *load_policies(second_tree())]
        limits = ensure_pool_limits(policies)
        echo(f"Dagster instance: {env.dagster_home} (pools "
              + ", ".join(f"{pool}: {limit}" for pool, limit in limits.items())
              + " run at a time)")
        # A failed run's alert links to its page in this UI.
        os.environ[WEBSERVER_BASE_URL_VAR] = ui_address(port)
        echo("starting the Dagster webserver and daemon ...")
        [eu] = [p for p in policies if p.name == EU_POLICY]

        def serving() -> None:  # said once the UI answers, not before
            echo(f"Dagster UI: {ui_address(port)}  (asset page: {asset_page(port)})")
            echo(f"second database: {EU_DATABASE} ({EU_URL_VAR}), policy {eu.name} "
                  f"(asset page: {ui_address(port)}/assets/{'/'.join(eu.asset_key_path)})")
            echo("press Ctrl-C to stop the UI, the daemon and the database server")

        code = run_dagster_dev(dagster_dev_command(write_workspace(env.state_dir), port),
                               cwd=env.dagster_home, echo=echo, debug=debug,
                               ready_url=f"{ui_address(port)}/server_info", on_ready=serving)
    finally:
        _stop_local_environment(env)
    if code:
        fail(f"dagster dev exited with code {code}")


def _start_local_environment(command: str):
    """Start the embedded server and DAGSTER_HOME of the checkout for ``command``."""
    from favorites_maintenance.local.environment import (
        LocalEnvironment,
        NotACheckoutError,
        project_root,
    )

    try:
        root = project_root()
    except NotACheckoutError as exc:
        fail(str(exc))
    env = LocalEnvironment(root)
    echo(_server_start_line(env.state_dir / "pgdata"))
    env.start()
    if env.replaced_database_url:
        click.secho(f"note: FAVORITES_DATABASE_URL is ignored by {command}, which only ever "
                    "touches its embedded database", fg="yellow", err=True)
    if env.ignored_variables:
        click.secho(f"note: {', '.join(env.ignored_variables)} ignored by {command}: a local "
                    "run pushes no metrics and exports no traces", fg="yellow", err=True)
    return env


def _server_start_line(pgdata) -> str:
    """What starting the local environment on ``pgdata`` will do: start a server, or attach to
    the one running there (whose users, or the ended process that left it, are named)."""
    from favorites_maintenance.local.embedded import server_state

    state = server_state(pgdata) if pgdata.is_dir() else None
    if state is None or not state.running:
        return f"starting the embedded PostgreSQL server ({pgdata})"
    line = f"attaching to the embedded PostgreSQL server already running on {pgdata} (pid {state.pid}"
    if state.users:
        return line + f", used by pid {', '.join(map(str, state.users))})"
    left_by = f" by pid {', '.join(map(str, state.gone))}" if state.gone else ""
    return line + f"; left running{left_by}, which has ended: stopped when this command ends)"


def _stop_local_environment(env) -> None:
    """Leave the embedded server and say whether it stopped or who still uses it."""
    users = env.server.found.users if env.server is not None and env.server.found else ()
    if env.stop():
        echo("stopped the embedded PostgreSQL server")
    else:
        echo("left the embedded PostgreSQL server running for the processes using it"
              + (f" (pid {', '.join(map(str, users))})" if users else ""))
