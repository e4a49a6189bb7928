"""The ``favorites-maintenance`` command line.

- ``demo``: the embedded PostgreSQL, a seeded dev table, one run of the job through Dagster on a
  persistent instance, and a summary of what happened.
- ``dry-run``: how many rows a policy's rule matches now and at its next scheduled run,
  deleting nothing (Laravel's ``--pretend``); ``--all`` policies, ``--json``.

``demo`` and ``dry-run`` take ``--policy NAME`` (default ``guest_favorites``): one of the
policies of ``favorites_maintenance/defs/``.
- ``dev``: the Dagster UI and daemon (``dagster dev``) on the embedded PostgreSQL server, with a
  seeded dev table, until Ctrl-C.
- ``bench``: the purge against the physical limit and the usual alternatives.
- ``restore``: a policy's archived rows back into its table (its ``restore_<policy>_job``).
- ``hold``: place, release and list the holds that keep rows from a policy's runs
  (``hold init`` creates the hold table).
- ``plan``: what a change to the policies (against a git ref or a folder) would newly delete,
  counted on each policy's database; exits 1 when a change widens past a limit.
- ``partition-functions``: the SQL that installs the owner's functions a policy with
  ``drop_expired_partitions`` calls under a least-privileged role, for ``psql -f -``.
"""

from __future__ import annotations

import datetime as dt
import os
import sys

import click
import sqlalchemy as sa

from favorites_maintenance.config.deployment import (
    DeploymentSettings,
    load_deployment_settings,
)
from favorites_maintenance.config.parsers import WEBSERVER_BASE_URL_VAR, SettingsError

UTC = dt.timezone.utc


def _echo(message: str) -> None:
    click.echo(message, err=False)


def _fail(message: str) -> None:
    click.secho(f"error: {message}", fg="red", err=True)
    sys.exit(2)


def _check_deployment_settings() -> DeploymentSettings:
    """The deployment's settings, or exit naming the variable at fault."""
    try:
        return load_deployment_settings()
    except SettingsError as exc:
        _fail(str(exc))


def _policy_option(command):
    return click.option(
        "--policy", "policy_name", default="guest_favorites", show_default=True,
        metavar="NAME", help="The retention policy, by the name its defs.yaml gives it "
             "(favorites_maintenance/defs/<folder>/defs.yaml).",
    )(command)


#: The code location of the commands that read policies (``-m``, else the working folder's
#: ``[tool.dg]`` project): set by :func:`_location_option`.
_location: dict[str, str | None] = {"module_name": None}


def _location_option(command):
    """``-m/--module-name``: the code location whose policies the command reads."""
    def remember(ctx, param, value):
        _location["module_name"] = value
        return value

    return click.option(
        "-m", "--module-name", default=None, metavar="MODULE", expose_value=False,
        callback=remember, is_eager=True,
        help="The code location's module (my_platform.definitions), as Dagster's command line "
             "takes it; default: the [tool.dg] project of the working folder, else, in its own "
             "checkout, this package's policies.")(command)


def _tree():
    """The component tree of the code location the command reads (see
    :func:`~favorites_maintenance.components.policy_tree.project_tree`); exits naming what
    to give when there is none."""
    from favorites_maintenance.components.load_errors import PolicyLoadError
    from favorites_maintenance.components.policy_tree import project_tree

    try:
        return project_tree(_location["module_name"])
    except PolicyLoadError as exc:
        _fail(str(exc))


def _load_policy(name: str, *, local: bool = False):
    """The policy ``name`` of ``favorites_maintenance/defs/`` (its settings validated), loaded
    alone: each broken policy file beside it is named on one line, and the command goes on. Exit
    with the policy's own error when it is the broken one, or naming the valid ones when there is
    no such policy. ``local``: also the policy of the second embedded database of ``demo`` and
    ``dev``."""
    from favorites_maintenance.components.load_errors import PolicyLoadError
    from favorites_maintenance.components.policy_tree import (
        component_tree,
        load_policies,
        policy_files,
    )

    tree = component_tree() if local else _tree()
    files = policy_files(tree)
    policies = {p.name: p for f in files for p in f.policies}
    if local:
        from favorites_maintenance.local.second_database import second_tree

        try:
            policies.update({p.name: p for p in load_policies(second_tree())})
        except PolicyLoadError as exc:
            _fail(str(exc))
    broken = [f for f in files if f.error]
    if name not in policies:
        own = [f.error for f in broken if _declares(f.path, name)]
        if own:
            _fail(own[0])
        _fail(f"--policy {name!r}: no such policy; the policies are "
              f"{', '.join(sorted(policies)) or 'none'} "
              f"({_shown_folder(tree.defs_module_path)}/<policy>/defs.yaml)"
              + "".join(f"\n{f.error}" for f in broken))
    for f in broken:
        _warn_broken(f.error)
    return policies[name]


def _shown_folder(path) -> str:
    """``path`` relative to the working folder when it is under it."""
    from pathlib import Path

    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _warn_broken(error: str) -> None:
    """One line about a broken policy file beside the one a command uses."""
    click.secho(f"warning: {error} (not loaded; the code location does not load until it is "
                "fixed)", fg="yellow", err=True)


def _declares(path, name: str) -> bool:
    """Whether the policy file ``path`` names its policy ``name`` (or, unnamed, its folder)."""
    from favorites_maintenance.components.policy_tree import declared_name

    return declared_name(path) == name


def _prunable_rows(policy, partition: str | None, engine: sa.Engine):
    """What ``policy``'s rule matches for a run of daily ``partition`` now, by the clock of
    ``engine``'s database server (``None``: a run without a partition), the cutoff as the job
    computes it; exits naming ``--partition`` when it is not one of the policy's days.

    Raises:
        ConnectError: the database's clock could not be read.
    """
    from favorites_maintenance.pipeline.partitions import policy_partitions
    from favorites_maintenance.testing import prunable_rows

    days = policy_partitions(policy)
    if partition is not None and not days.has_partition_key(partition):
        _fail(f"--partition {partition!r} is not a day of policy {policy.name} (YYYY-MM-DD, "
              f"from {days.get_first_partition_key()} to yesterday)")
    try:
        return prunable_rows(policy, partition=partition, database=engine)
    except ValueError as exc:
        _fail(f"--partition {exc}")


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
        _fail(str(exc))
    env = LocalEnvironment(root)
    _echo(_server_start_line(env.state_dir / "pgdata"))
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
        _echo("stopped the embedded PostgreSQL server")
    else:
        _echo("left the embedded PostgreSQL server running for the processes using it"
              + (f" (pid {', '.join(map(str, users))})" if users else ""))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="favorites-maintenance", prog_name="favorites-maintenance")
def main() -> None:
    """Daily retention cleanup of PostgreSQL tables, one policy per table (Dagster +
    PostgreSQL); the first policy prunes stale guest favorites."""


@main.command(short_help="Seed a local database, run the cleanup once, print what it did.")
@click.option("--rows", default=200_000, show_default=True, type=click.IntRange(min=1000),
              help="Rows to seed into the dev table (guest and account rows over three years).")
@click.option("--pretend", is_flag=True,
              help="Seed, then only report how many rows the rule matches; delete nothing.")
@_policy_option
def demo(rows: int, pretend: bool, policy_name: str) -> None:
    """Seed the embedded PostgreSQL and run the cleanup job once through Dagster.

    Starts the embedded PostgreSQL server of this checkout, DROPS AND RECREATES the schema
    favorites (every table in it) in its "favorites" database, seeds favorites.favorites, runs guest_favorites_cleanup_job
    for the latest complete day and prints rows deleted, batches, duration and backlog.

    Everything lives in .favorites-maintenance/ of the checkout (ignored by git): the server's
    data in pgdata/, the Dagster instance in dagster_home/ (the run stays in its history, as
    `dev` shows it). FAVORITES_DATABASE_URL is ignored: demo never touches another database.

    With --policy, the policy's job runs instead, on the policy's own embedded database:
    eu_guest_favorites runs on the second one, favorites_eu, seeded the same way;
    any other policy's table must already exist in the embedded "favorites" database.
    """
    from favorites_maintenance.local.demo import DemoError, run_demo

    _check_deployment_settings()
    policy = _load_policy(policy_name, local=True)
    env = _start_local_environment("demo")
    try:
        run_demo(env, rows=rows, pretend=pretend, policy=policy, echo=_echo)
    except DemoError as exc:
        _fail(str(exc))
    finally:
        _stop_local_environment(env)


@main.command("dry-run", short_help="Count what a policy's rule matches; delete nothing.")
@_location_option
@click.option("--partition", default=None, metavar="YYYY-MM-DD",
              help="Use the cutoff of this daily partition instead of now.")
@_policy_option
@click.option("--all", "all_policies", is_flag=True,
              help="Every policy of favorites_maintenance/defs/ (instead of --policy).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document instead of text (warnings still go to stderr).")
def dry_run(partition: str | None, policy_name: str, all_policies: bool, as_json: bool) -> None:
    """Report how many rows a policy's rule matches, deleting nothing: with the cutoff of now
    (or of --partition), and with the cutoff of the next scheduled run, said with its time.

    Reads each policy's database from the variable its database_url_env names
    (FAVORITES_DATABASE_URL by default) and its settings like the job does, "now" from the
    database server's clock, and counts with the function policy tests use
    (favorites_maintenance.testing). With --all, a policy whose file does not load, or whose
    database or table cannot be read, is reported with its error and the others are still
    counted; the exit code is then 2.
    """
    import json

    from favorites_maintenance.components.policy_tree import declared_name, policy_files

    _check_deployment_settings()
    if all_policies:
        counts = []
        for file in policy_files(_tree()):
            if file.error:
                # One of "all": a script reading the document must see it, not only stderr.
                click.secho(f"error: {file.error} (not loaded; the code location does not "
                            "load until it is fixed)", fg="red", err=True)
                counts.append({"policy": declared_name(file.path), "error": file.error})
            counts += [_dry_run_counts(policy, partition, fail_fast=False)
                       for policy in file.policies]
    else:
        counts = [_dry_run_counts(_load_policy(policy_name), partition, fail_fast=True)]
    if as_json:
        _echo(json.dumps({"policies": counts, "deleted": 0}, indent=2))
    else:
        for count in counts:
            _echo_dry_run(count)
        _echo("nothing deleted (dry run)")
    if any("error" in count for count in counts):
        sys.exit(2)


def _dry_run_counts(policy, partition: str | None, *, fail_fast: bool) -> dict:
    """What ``policy``'s rule matches in its database with the cutoff of now (the database
    server's clock) or of ``partition``, and with the next scheduled run's, as a JSON-ready
    dict (instants in ISO 8601 UTC, counts in rows), counted with the function policy tests use
    (:mod:`favorites_maintenance.testing`); a database error is its ``error`` (with
    ``fail_fast``: the command exits with it)."""
    from favorites_maintenance.config.deployment import require_database_url
    from favorites_maintenance.config.parsers import safe_url
    from favorites_maintenance.pipeline.schedules import next_scheduled_run
    from favorites_maintenance.retention.database import create_engine, limit_transaction
    from favorites_maintenance.retention.errors import (
        ConnectError,
        ReplicationRoleError,
        TableShapeError,
        describe,
    )
    from favorites_maintenance.retention.statements import assert_triggers_fire
    from favorites_maintenance.testing import PrunableRows

    rule, variable = policy.rule, policy.database_url_env
    report = {"policy": policy.name, "database_variable": variable, "database": None,
              "table": rule.qualified_name, "guard": rule.guard_sql or "no guard",
              "age_column": rule.age.name, "retention_days": policy.settings.retention_days}
    error = None
    try:
        url = require_database_url(variable)
    except SettingsError as exc:
        error = str(exc)
    else:
        report["database"] = safe_url(url)
        engine = create_engine(url)
        try:
            # "now" is the database server's clock, as for the job.
            prunable = _prunable_rows(policy, partition, engine)
            now = prunable.clock.database if prunable.clock else dt.datetime.now(UTC)
            at, next_partition, next_cutoff = next_scheduled_run(policy, now)
            with engine.connect() as conn, conn.begin():
                # Bounded like the job's reads: never queued without limit behind a lock.
                limit_transaction(conn)
                # The same checks of the session and the table the job makes before its
                # first batch.
                assert_triggers_fire(conn)
                findings = prunable.check(conn)
                count, oldest_age = prunable.count(conn)
                held = prunable.held(conn)
                upcoming = (PrunableRows(policy, next_cutoff).count(conn)[0]
                            if next_cutoff is not None else None)
        except (TableShapeError, ReplicationRoleError) as exc:
            error = str(exc)
        except (ConnectError, sa.exc.DBAPIError) as exc:
            reason = exc.error if isinstance(exc, ConnectError) else describe(exc)
            error = (f"could not read {rule.qualified_name}: {reason} (database "
                     f"{safe_url(url)}: check {variable}, the server and the table)")
        finally:
            engine.dispose()
    if error is not None:
        if fail_fast:
            _fail(error)
        click.secho(f"error: policy {policy.name}: {error}", fg="red", err=True)
        return {**report, "error": error}
    clock = prunable.clock.warning if prunable.clock is not None else None
    for warning in ((clock,) if clock else ()) + tuple(findings.warnings):
        click.secho(f"warning: {warning}", fg="yellow", err=True)
    report["now"] = {"at": now.isoformat(), "partition": partition,
                     "cutoff": prunable.cutoff.isoformat(), "prunable": count,
                     "oldest": oldest_age.isoformat() if oldest_age else None}
    if policy.rule.hold is not None:
        # Prunable by age and guard, kept by an active hold: counted apart, never deleted.
        report["now"]["held"] = held
    report["next_run"] = {"at": at.isoformat(), "cron": policy.settings.cron,
                          "partition": next_partition,
                          "cutoff": next_cutoff.isoformat() if next_cutoff else None,
                          "prunable": upcoming}
    return report


def _echo_dry_run(count: dict) -> None:
    """The text form of one policy's dry run (of a policy file that does not load: its
    name and error)."""
    if "table" not in count:
        _echo(f"policy     {count['policy']} (not loaded)")
        _echo(f"error      {count['error']}")
        return
    _echo(f"database   {count['database'] or 'unset'} ({count['database_variable']})")
    _echo(f"policy     {count['policy']} ({count['table']}, {count['guard']})")
    if "error" in count:
        _echo(f"error      {count['error']}")
        return
    now, upcoming = count["now"], count["next_run"]
    _echo(f"cutoff     {now['cutoff']} (retention {count['retention_days']} days)")
    _echo(f"prunable   {now['prunable']:,} rows (oldest {count['age_column']}: "
          f"{now['oldest'] or 'none'})")
    if "held" in now:
        _echo(f"held       {now['held']:,} {'row' if now['held'] == 1 else 'rows'} past the "
              "cutoff kept by an active hold (not deleted)")
    if upcoming["partition"] is None:
        _echo(f"next run   {upcoming['at']} ({upcoming['cron']}): no complete day of the "
              "policy's partitions yet")
    else:
        _echo(f"next run   {upcoming['at']} ({upcoming['cron']}), partition "
              f"{upcoming['partition']}: cutoff {upcoming['cutoff']}, {upcoming['prunable']:,} "
              "rows prunable")


@main.command(short_help="Show what a change to the policies will delete; delete nothing.")
@_location_option
@click.option("--base", required=True, metavar="REF|FOLDER",
              help="What the policies are compared with: a git ref of the repository (main, "
                   "origin/main, a commit), read at that commit, or a folder of policy files.")
@click.option("--max-newly-prunable", default=0, show_default=True, type=click.IntRange(min=0),
              help="Exit 1 when a policy would newly delete more rows than this (its table "
                   "and its archive; an added policy: its first backlog).")
@click.option("--allow-widening", is_flag=True,
              help="Report widening changes without failing on them.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
def plan(base: str, max_newly_prunable: int, allow_widening: bool, as_json: bool) -> None:
    """Compare the policies of the code location with those of --base: for every policy
    added, removed or changed, count on its own database (read only) the rows its new rule
    would delete now that the old one keeps, and the rows it stops deleting; list the settings
    that changed, the partitions newly past the cutoff (drop_expired_partitions) and the
    archived rows a shorter archive retention deletes.

    Exit codes: 0, nothing widens past --max-newly-prunable (or --allow-widening); 1, a policy
    would newly delete more rows than that; 2, the base, a policy or a database could not be
    read (the other policies are still counted).
    """
    import json

    from favorites_maintenance.components.load_errors import PolicyLoadError
    from favorites_maintenance.components.policy_tree import load_policies
    from favorites_maintenance.plan import PlanBaseError, base_policies, compare, count

    _check_deployment_settings()
    tree = _tree()
    try:
        head = load_policies(tree)
        old = base_policies(base, tree)
    except (PolicyLoadError, PlanBaseError) as exc:
        _fail(str(exc))
    lines = [count(line, before, after) for line, before, after in compare(old, head)]
    widening = [line for line in lines if line.widening > max_newly_prunable]
    if as_json:
        _echo(json.dumps({"base": base, "policies": [line.as_json() for line in lines],
                          "max_newly_prunable": max_newly_prunable,
                          "widening": [line.name for line in widening]}, indent=2))
    else:
        for line in lines:
            _echo_plan(line)
    for line in lines:
        if line.error:
            click.secho(f"error: {line.error}", fg="red", err=True)
    if widening and not allow_widening:
        click.secho(f"error: {', '.join(line.name for line in widening)}: would newly delete "
                    f"more than --max-newly-prunable {max_newly_prunable} rows; check the "
                    "change, then pass --allow-widening (or raise the limit) to accept it",
                    fg="red", err=True)
    if any(line.error for line in lines):
        sys.exit(2)
    if widening and not allow_widening:
        sys.exit(1)


def _echo_plan(line) -> None:
    """The text form of one policy's plan line."""
    _echo(f"{line.change:<10} {line.name}" + (f" ({line.database})" if line.database else ""))
    for name, values in line.settings_changed.items():
        _echo(f"           {name}: {values['from'] or 'unset'} -> {values['to'] or 'unset'}")
    if line.change == "unchanged":
        return

    def rows(count: int | None) -> str:
        return "not counted" if count is None else f"{count:,} rows"

    _echo(f"           newly prunable {rows(line.newly_prunable)}, no longer prunable "
          f"{rows(line.no_longer_prunable)}")
    if line.partitions_newly_expired:
        _echo(f"           partitions newly detached: {', '.join(line.partitions_newly_expired)}")
    if line.archive_newly_prunable:
        _echo(f"           archived rows newly past the archive retention: "
              f"{line.archive_newly_prunable:,}")


@main.command("partition-functions",
              short_help="Print the SQL of a policy's partition functions, for psql.")
@_location_option
@click.option("--policy", "policy_name", required=True, metavar="NAME",
              help="The policy (with drop_expired_partitions: true) whose table the functions "
                   "detach and drop partitions of.")
@click.option("--role", required=True, metavar="ROLE",
              help="The job's role, the only one granted EXECUTE on the functions.")
def partition_functions(policy_name: str, role: str) -> None:
    """Print the SQL that installs, as the owner of a policy's range-partitioned table, the two
    SECURITY DEFINER functions its job calls to detach and drop expired partitions when its
    role may not alter the table: <schema>.<table>_detach_partition and
    <schema>.<table>_drop_detached, written for the policy's table, age column and guard
    columns, with EXECUTE granted to --role only. Pipe it to psql as the table's owner:

        favorites-maintenance partition-functions --policy NAME --role ROLE | psql -f - URL

    Connects to no database (docs/partitioned-tables.md).
    """
    from favorites_maintenance.retention.errors import InvalidArgumentError
    from favorites_maintenance.retention.least_privilege import partition_functions_sql
    from favorites_maintenance.retention.rule import RuleError

    policy = _load_policy(policy_name)
    if not policy.settings.drop_expired_partitions:
        _fail(f"--policy {policy.name}: drop_expired_partitions is not true in its defs.yaml, "
              "so its job detaches no partition and calls no function; set "
              "drop_expired_partitions: true first")
    try:
        sql = partition_functions_sql(policy.rule, role)
    except RuleError as exc:
        _fail(f"policy {policy.name}: {exc}")
    except InvalidArgumentError as exc:
        _fail(f"--role: {exc}")
    click.echo(sql, nl=False)


@main.command(short_help="Move a policy's archived rows back into its table.")
@_location_option
@click.option("--run-id", default=None, metavar="RUN_ID",
              help="Restore the rows this run of the policy's job archived.")
@click.option("--since", default=None, metavar="INSTANT",
              help="Instead of --run-id: the rows archived from this ISO 8601 instant "
                   "(with its offset, e.g. 2026-06-15T00:00:00Z) ...")
@click.option("--until", default=None, metavar="INSTANT",
              help="... until this one (exclusive; default now).")
@click.option("--pretend", is_flag=True, help="Count what would be restored; move nothing.")
@click.option("--allow-prunable", is_flag=True,
              help="Restore rows the deployed rule would delete again at the next run.")
@click.option("--batch-size", default=1000, show_default=True,
              type=click.IntRange(1, 100_000), help="Rows per batch transaction.")
@click.option("--policy", "policy_name", required=True, metavar="NAME",
              help="The policy whose archive to restore from (it needs an archive_table).")
def restore(run_id: str | None, since: str | None, until: str | None, pretend: bool,
            allow_prunable: bool, batch_size: int, policy_name: str) -> None:
    """Move archived rows of a policy back into its table, in batch transactions.

    Runs the policy's restore_<policy>_job through Dagster on the deployment's instance
    (DAGSTER_HOME), so the run is in its history, and on the policy's own database (the
    variable its database_url_env names). Rows whose key exists in the table again stay in the
    archive and are counted. Rows the deployed rule would delete again are counted, and refused
    unless --allow-prunable. It refuses to start while a run of the policy is in progress.
    Only counts are printed, never an archived value.
    """
    import os

    import dagster as dg

    from favorites_maintenance.config.deployment import require_database_url
    from favorites_maintenance.components.policy_tree import code_location
    from favorites_maintenance.pipeline.restore import RestoreConfig, selection_of

    _check_deployment_settings()
    policy = _load_policy(policy_name)
    if policy.archive_table is None:
        _fail(f"--policy {policy_name}: the policy keeps no archive (no archive_table in its "
              "defs.yaml), so there is nothing to restore; its deleted rows are gone (restore "
              "from a backup: docs/runbook.md)")
    config = {"run_id": run_id, "since": since, "until": until, "pretend": pretend,
              "allow_prunable": allow_prunable, "batch_size": batch_size}
    try:
        selection_of(RestoreConfig(**config))
    except ValueError as exc:
        _fail(str(exc).replace("run_id", "--run-id").replace("since", "--since")
              .replace("until", "--until"))
    if not os.environ.get("DAGSTER_HOME", "").strip():
        _fail("DAGSTER_HOME is not set: restore runs the policy's restore job on the "
              "deployment's Dagster instance, so that its run is in the history and never "
              "beside a purge of the policy; export the DAGSTER_HOME the daemon uses")
    try:
        require_database_url(policy.database_url_env)
    except SettingsError as exc:
        _fail(str(exc))
    defs = code_location(_tree())
    job = defs.resolve_job_def(policy.restore_job_name)
    with dg.DagsterInstance.get() as instance:
        result = job.execute_in_process(
            run_config={"ops": {f"restore_{policy.name}": {"config": config}}},
            instance=instance, raise_on_error=False)
    outputs = [e.step_output_data.metadata for e in result.all_events
               if e.event_type_value == "STEP_OUTPUT"]
    failures = [e.event_specific_data for e in result.all_events
                if e.event_type_value == "STEP_FAILURE"]
    figures = outputs[0] if outputs else (
        failures[0].user_failure_data.metadata if failures and failures[0].user_failure_data
        else {})
    shown = {key: getattr(value, "value", value) for key, value in figures.items()}
    state = "succeeded" if result.success else "failed"
    _echo(f"run {result.run_id} {state} ({policy.restore_job_name}"
          + (", pretend: nothing moved" if pretend else "") + ")")
    for label, key in (("archived rows selected", "selectedRows"),
                       ("restorable", "restorableRows"), ("restored", "restoredRows"),
                       ("key exists again", "keyExistsRows"),
                       ("left in the archive", "leftInArchive"),
                       ("prunable under the rule", "prunableRows"),
                       ("failed", "failedRows")):
        if key in shown:
            _echo(f"  {label:<24}{shown[key]:>10,}")
    if not result.success:
        error = failures[0].error if failures else None
        _fail(error.message.strip() if error is not None else "the restore run failed")


@main.command(short_help="Run the Dagster UI and daemon on a local database until Ctrl-C.")
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

    _check_deployment_settings()
    for broken in [f for f in policy_files() if f.error]:
        _warn_broken(broken.error)
    if not port_is_free(port):
        _fail(f"port {port} on 127.0.0.1 is in use; pick another with --port")
    env = _start_local_environment("dev")
    try:
        engine = create_engine(load_deployment_settings().require_database_url())
        try:
            prepare_dev_table(engine, rows, _echo, reseed=reseed)
        finally:
            engine.dispose()
        prepare_eu_table(max(1000, rows // 10), _echo, reseed=reseed)
        # The valid policies (a broken file is the code location's load error, in the UI),
        # and the second database's.
        policies = [*(p for f in policy_files() for p in f.policies),
                    *load_policies(second_tree())]
        limits = ensure_pool_limits(policies)
        _echo(f"Dagster instance: {env.dagster_home} (pools "
              + ", ".join(f"{pool}: {limit}" for pool, limit in limits.items())
              + " run at a time)")
        # A failed run's alert links to its page in this UI.
        os.environ[WEBSERVER_BASE_URL_VAR] = ui_address(port)
        _echo("starting the Dagster webserver and daemon ...")
        [eu] = [p for p in policies if p.name == EU_POLICY]

        def serving() -> None:  # said once the UI answers, not before
            _echo(f"Dagster UI: {ui_address(port)}  (asset page: {asset_page(port)})")
            _echo(f"second database: {EU_DATABASE} ({EU_URL_VAR}), policy {eu.name} "
                  f"(asset page: {ui_address(port)}/assets/{'/'.join(eu.asset_key_path)})")
            _echo("press Ctrl-C to stop the UI, the daemon and the database server")

        code = run_dagster_dev(dagster_dev_command(write_workspace(env.state_dir), port),
                               cwd=env.dagster_home, echo=_echo, debug=debug,
                               ready_url=f"{ui_address(port)}/server_info", on_ready=serving)
    finally:
        _stop_local_environment(env)
    if code:
        _fail(f"dagster dev exited with code {code}")


def _bench_partitioned(server, rows: int, out) -> None:
    """The ``partitioned`` scenario of ``bench``: its figures on the console, its JSON in
    ``out``; fails when a strategy did not remove exactly the prunable rows."""
    from favorites_maintenance.bench.partitioned import run_partitioned_bench

    report = run_partitioned_bench(server, rows, out=out, echo=_echo)
    rows_run, drops = report["strategies"]["rows"], report["strategies"]["drops"]
    _echo(f"drops against row deletes: "
          f"{_times(rows_run['seconds'], drops['seconds'], 'faster', 'slower', 'as fast')}, "
          f"{_times(rows_run['wal_bytes'], drops['wal_bytes'], 'less WAL', 'more WAL', 'as much WAL')}; "
          f"results written to {out}")
    if not all(r["correct"] for r in report["strategies"].values()):
        _fail("partitioned: a strategy did not remove exactly the prunable rows")


def _bench_policies(count: int, idle_seconds: float, warmup_seconds: float, out) -> None:
    """The ``policies`` scenario of ``bench``: its figures on the console, its JSON in
    ``out``."""
    from favorites_maintenance.bench.policies import run_policies_bench

    try:
        run_policies_bench(count, idle_seconds=idle_seconds, warmup_seconds=warmup_seconds,
                           out=out, echo=_echo)
    except RuntimeError as exc:
        _fail(f"policies: {exc}")
    _echo(f"results written to {out}")


def _bench_launch(server, count: int, databases: int, lead_seconds: float, out) -> None:
    """The ``launch`` scenario of ``bench``: its figures on the console, its JSON in ``out``;
    fails when a run did not succeed, when two runs of one database overlapped or when a
    table was left with other rows than the rule keeps."""
    from favorites_maintenance.bench.launch import run_launch_bench
    from favorites_maintenance.local.environment import NotACheckoutError, project_root

    try:
        instance_yaml = project_root() / "dagster.yaml"
    except NotACheckoutError as exc:
        _fail(f"launch: {exc}; the scenario runs the checkout's dagster.yaml, run it there")
    try:
        report = run_launch_bench(server, count, databases, instance_yaml, out=out, echo=_echo,
                                  lead_seconds=lead_seconds)
    except RuntimeError as exc:
        _fail(f"launch: {exc}")
    _echo(f"results written to {out}")
    if set(report["runs"]) != {"SUCCESS"}:
        _fail(f"launch: not every run succeeded: {report['runs']}")
    if max(report["max_concurrent_per_database"].values(), default=0) > 1:
        _fail("launch: two runs of one database were in progress at once: "
              f"{report['max_concurrent_per_database']}")
    if report["rows_left"] != report["rows_kept"]:
        _fail(f"launch: rows left {report['rows_left']}, the rule keeps {report['rows_kept']}")


def _times(deletes: float, drops: float, better: str, worse: str, same: str) -> str:
    """``11.7x faster``, ``10.8x slower`` or ``about as fast``: the drops' figure against the
    row deletes', worded so that the ratio is never below 1 (a small data set's drops cost more
    than its deletes, and "0.1x faster" read as a gain)."""
    deletes, drops = max(deletes, 1e-9), max(drops, 1e-9)
    if max(deletes, drops) / min(deletes, drops) < 1.05:
        return f"about {same}"
    if deletes > drops:
        return f"{deletes / drops:.1f}x {better}"
    return f"{drops / deletes:.1f}x {worse}"


@main.command(short_help="Benchmark the purge against one DELETE and the usual alternatives.")
@click.option("--rows", default=2_000_000, show_default=True, type=click.IntRange(min=10_000),
              help="Size of the seeded data set (the memory check also runs at 10% of it).")
@click.option("--strategies", default="A,A_paced,B,C,D,A2,A4", show_default=True,
              help="Comma-separated subset of A, A_paced (A with sleep_ratio set and batches "
                   "of at most 1000 rows), B, C, D, A2, A4, J (the job through Dagster), A_durable (A with synchronous_commit on), "
                   "A_fixed (A with an explicit batch size: no batch above it), A_lock_first "
                   "(A locking every batch's rows before deleting them), A_archive (A moving "
                   "every row into an archive table), A_keyset and A_page (A in keyset order, "
                   "in page order, whatever the backlog) and B_index (B through the rule's "
                   "index), run in that order.")
@click.option("--scenarios", default="backlog", show_default=True,
              help="Comma-separated subset of backlog (every prunable row of the data set), "
                   "daily (A, B, B_index, C and J on one day's newly expired rows of a "
                   "data set whose backlog was cleared) and partitioned (the table "
                   "partitioned by month over 36 months, two thirds wholly expired, --rows "
                   "rows: dropping the expired partitions against deleting their rows; its "
                   "JSON goes to partitioned.json beside --out) and policies (--policies "
                   "generated policies: the code location's build time, its sensors, schedules "
                   "and jobs, one tick of each sensor, the idle CPU of a code server and a "
                   "daemon; no database; its JSON goes to policies.json beside --out) and "
                   "launch (--policies generated policies on --launch-databases databases, one "
                   "schedule tick starting them all under dagster.yaml's run queue: the time "
                   "the queue takes to drain and the most runs of one database at once; its "
                   "JSON goes to launch.json beside --out).")
@click.option("--policies", "policy_count", default=100, show_default=True,
              type=click.IntRange(min=1), help="Generated policies of the policies scenario.")
@click.option("--launch-databases", default=3, show_default=True, type=click.IntRange(min=1),
              help="Databases the launch scenario spreads its policies over.")
@click.option("--launch-lead-seconds", default=240.0, show_default=True,
              type=click.FloatRange(min=60),
              help="How far ahead the launch scenario sets its tick: the code server must serve "
                   "and the daemon see the schedules before it.")
@click.option("--policies-idle-seconds", default=60.0, show_default=True,
              type=click.FloatRange(min=1),
              help="Window over which the policies scenario reads the idle CPU.")
@click.option("--policies-warmup-seconds", default=30.0, show_default=True,
              type=click.FloatRange(min=0),
              help="How long the daemon runs before that window.")
@click.option("--daily-rows", default=10_000_000, show_default=True,
              type=click.IntRange(min=10_000),
              help="Size of the daily scenario's data set (the backlog's, reused, when equal "
                   "to --rows).")
@click.option("--paced-sleep-ratio", default=3.0, show_default=True,
              type=click.FloatRange(min=0, max=100), help="sleep_ratio of A_paced.")
@click.option("--idle-seconds", default=5.0, show_default=True, type=click.FloatRange(min=0.5),
              help="Idle window of the user workload before each purge.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help="Full-size runs per strategy, in rounds; the median-throughput run is "
                   "reported (use 3 on a busy machine).")
@click.option("--out", default="bench-results/purge.json", show_default=True,
              type=click.Path(dir_okay=False), help="Where the JSON results go.")
@click.option("--pgdata", default=None, type=click.Path(file_okay=False),
              help="Data folder of the bench's own server "
                   "[default: .favorites-maintenance/bench/pgdata in the checkout].")
def bench(rows: int, strategies: str, scenarios: str, policy_count: int, launch_databases: int,
          launch_lead_seconds: float, policies_idle_seconds: float, policies_warmup_seconds: float, daily_rows: int,
          paced_sleep_ratio: float, idle_seconds: float, repeat: int, out: str,
          pgdata: str | None) -> None:
    """Benchmark the purge (A) against one DELETE (B), Laravel's ctid loop (C), naive SKIP
    LOCKED batches (D) and A in 2 and 4 processes, on the embedded PostgreSQL."""
    from pathlib import Path

    from favorites_maintenance import bench as bench_mod
    from favorites_maintenance.local.environment import (
        STATE_DIR,
        NotACheckoutError,
        project_root,
    )

    chosen = [s.strip().upper() for s in strategies.split(",") if s.strip()]
    known = {s.upper(): s for s in bench_mod.STRATEGIES + bench_mod.EXTRA_STRATEGIES}
    unknown = [s for s in chosen if s not in known]
    chosen = [known.get(s, s) for s in chosen]
    if unknown or not chosen:
        _fail(f"--strategies: unknown {unknown or strategies!r}; choose from "
              f"{', '.join(bench_mod.STRATEGIES + bench_mod.EXTRA_STRATEGIES)}")
    chosen_scenarios = [s.strip().lower() for s in scenarios.split(",") if s.strip()]
    known_scenarios = (*bench_mod.SCENARIOS, "partitioned", "policies", "launch")
    if not chosen_scenarios or set(chosen_scenarios) - set(known_scenarios):
        _fail(f"--scenarios: unknown {scenarios!r}; choose from {', '.join(known_scenarios)}")
    if "policies" in chosen_scenarios:  # needs no database server
        chosen_scenarios.remove("policies")
        _bench_policies(policy_count, policies_idle_seconds, policies_warmup_seconds,
                        Path(out).with_name("policies.json"))
        if not chosen_scenarios:
            return
    try:
        folder = Path(pgdata) if pgdata else project_root() / STATE_DIR / "bench" / "pgdata"
    except NotACheckoutError as exc:
        _fail(f"{exc}; or give --pgdata")
    _echo(f"starting the bench's embedded PostgreSQL server ({folder})")
    server = bench_mod.start_server(folder)
    if "launch" in chosen_scenarios:
        chosen_scenarios.remove("launch")
        try:
            _bench_launch(server, policy_count, launch_databases, launch_lead_seconds,
                          Path(out).with_name("launch.json"))
        finally:
            if not chosen_scenarios:
                server.stop()
        if not chosen_scenarios:
            return
    if "partitioned" in chosen_scenarios:
        chosen_scenarios.remove("partitioned")
        try:
            _bench_partitioned(server, rows, Path(out).with_name("partitioned.json"))
        finally:
            if not chosen_scenarios:
                server.stop()
        if not chosen_scenarios:
            return
    try:
        report = bench_mod.run_bench(server, bench_mod.BenchConfig(
            rows=rows, strategies=chosen, idle_seconds=idle_seconds, repeat=repeat, out=Path(out),
            echo=_echo, scenarios=chosen_scenarios, daily_rows=daily_rows,
            paced_sleep_ratio=paced_sleep_ratio))
    finally:
        server.stop()
    _echo("")
    _echo(bench_mod.format_table(report))
    _echo(f"results written to {out}")
    wrong = [name for name, r in report["strategies"].items()
             if not (r["correct"] and r["correct_10pct"])]
    wrong += [f"daily {name}" for name, r in (report.get("daily") or {}).get("strategies",
                                                                          {}).items()
              if not r["correct"]]
    if wrong:
        _fail(f"strategies {', '.join(wrong)} did not delete exactly the prunable rows")


@main.group(short_help="Place, release and list a policy's holds.")
def hold() -> None:
    """Holds keep rows from a policy's runs, whatever their age, until released: a row whose
    hold column (the policy's hold_column, default its key) has the value of an active hold of
    the policy is never deleted, archived or detached with its partition (docs/holds.md).

    Each command works on the hold table the policy's defs.yaml names (hold_table), in the
    policy's own database (the variable its database_url_env names).
    """


def _holds_of(policy_name: str):
    """The policy's holds and an engine on its database, or exit naming what is missing."""
    from favorites_maintenance.config.deployment import require_database_url
    from favorites_maintenance.retention.database import create_engine

    policy = _load_policy(policy_name)
    if policy.rule.hold is None:
        variable = policy.labels.get("hold_table")
        where = (f"set {variable} to schema.table" if variable else
                 "add hold_table: schema.table (and hold_column when a hold matches another "
                 "column than the key) to its defs.yaml")
        _fail(f"--policy {policy.name}: the policy names no hold table; {where}, then run "
              "hold init (docs/holds.md)")
    try:
        url = require_database_url(policy.database_url_env)
    except SettingsError as exc:
        _fail(str(exc))
    return policy.rule.hold, create_engine(url)


def _hold_database_error(holds, exc) -> None:
    """Exit with a database error of a hold command, its fix named."""
    from favorites_maintenance.retention.errors import ErrorKind, describe

    error = describe(exc) if isinstance(exc, sa.exc.DBAPIError) else exc.error
    hint = ""
    if getattr(error, "kind", None) is ErrorKind.PERMISSION_DENIED:
        hint = f"; grant the role SELECT, INSERT and UPDATE on {holds.qualified_name}"
    elif "does not exist" in str(error):
        hint = (f"; create it with favorites-maintenance hold init --policy {holds.policy}")
    _fail(f"hold table {holds.qualified_name}: {error}{hint}")


@hold.command("init", short_help="Create the policy's hold table if it does not exist.")
@_location_option
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
        policy = _load_policy(policy_name)
        if policy.rule.hold is None:
            _holds_of(policy_name)  # exits naming the missing hold_table
        click.echo(";\n".join(create_hold_table_sql(policy.rule.hold.qualified_name)) + ";")
        return
    holds, engine = _holds_of(policy_name)
    try:
        create_hold_table(engine, holds.qualified_name)
    except (sa.exc.DBAPIError, ConnectError) as exc:
        _hold_database_error(holds, exc)
    finally:
        engine.dispose()
    _echo(f"hold table {holds.qualified_name} ready")


@hold.command("place", short_help="Place a hold; print its id.")
@_location_option
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
        value = click.get_text_stream("stdin").readline().rstrip("\r\n")
    holds, engine = _holds_of(policy_name)
    table = _load_policy(policy_name).rule.qualified_name
    try:
        hold_id = place_hold(engine, holds, value, reason=reason,
                             placed_by=placed_by or getpass.getuser(), of_table=table)
        try:
            matched = a_row_has(engine, table, holds.column, value)
        except (sa.exc.DBAPIError, ConnectError):
            # The hold is committed: its id must reach the operator, who would place it again.
            matched = None
    except InvalidArgumentError as exc:
        _fail(str(exc).replace("hold key", "--key").replace("hold reason", "--reason")
              .replace("hold by", "--by"))
    except (sa.exc.DBAPIError, ConnectError) as exc:
        _hold_database_error(holds, exc)
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
    _echo(str(hold_id))


@hold.command("release", short_help="Release a hold by its id.")
@_location_option
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

    holds, engine = _holds_of(policy_name)
    try:
        released = release_hold(engine, holds, hold_id,
                                released_by=released_by or getpass.getuser())
    except (sa.exc.DBAPIError, ConnectError) as exc:
        _hold_database_error(holds, exc)
    finally:
        engine.dispose()
    if not released:
        _fail(f"--id {hold_id}: no active hold of policy {holds.policy} has this id (released "
              f"already, another policy's, or unknown); hold list --policy {holds.policy} "
              "shows the active ones")
    _echo(f"hold {hold_id} released")


@hold.command("list", short_help="List a policy's active holds.")
@_location_option
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

    holds, engine = _holds_of(policy_name)
    try:
        found = list_holds(engine, holds, include_released=include_released)
    except (sa.exc.DBAPIError, ConnectError) as exc:
        _hold_database_error(holds, exc)
    finally:
        engine.dispose()
    listed = [{"id": h.hold_id, **({"key": h.held_value} if show_keys else {}),
               "placed_at": h.placed_at.astimezone(UTC).isoformat(), "placed_by": h.placed_by,
               "reason": h.reason,
               "released_at": h.released_at.astimezone(UTC).isoformat() if h.released_at
               else None, "released_by": h.released_by} for h in found]
    if as_json:
        _echo(json.dumps({"policy": holds.policy, "hold_table": holds.qualified_name,
                          "holds": listed}, indent=2))
        return
    if not listed:
        _echo(f"no {'' if include_released else 'active '}holds of policy {holds.policy}")
    for h in listed:
        state = (f"released {h['released_at']} by {h['released_by']}" if h["released_at"]
                 else "active")
        key = f"  key {h['key']}" if show_keys else ""
        _echo(f"{h['id']:>8}  placed {h['placed_at']} by {h['placed_by']}  {state}{key}  "
              f"reason: {h['reason']}")
