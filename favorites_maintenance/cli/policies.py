"""The commands on one policy's table: ``dry-run`` (what its rule matches, nothing deleted),
``partition-functions`` (the owner's functions' SQL) and ``restore`` (archived rows back)."""

from __future__ import annotations

import datetime as dt
import sys

import click
import sqlalchemy as sa

from favorites_maintenance.cli.common import (
    check_deployment_settings,
    echo,
    fail,
    load_policy,
    location_option,
    location_tree,
    policy_option,
    policy_engine,
    prunable_rows_at,
)
from favorites_maintenance.config.parsers import SettingsError

UTC = dt.timezone.utc


@click.command("dry-run", short_help="Count what a policy's rule matches; delete nothing.")
@location_option
@click.option("--partition", default=None, metavar="YYYY-MM-DD",
              help="Use the cutoff of this daily partition instead of now.")
@policy_option
@click.option("--all", "all_policies", is_flag=True,
              help="Every policy of the code location (see -m) instead of --policy.")
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
    counted; the exit code is then 2. With --json, a policy whose database or table cannot be
    read is in the document with its error, and the exit code is 2.
    """
    import json

    from favorites_maintenance.components.policy_tree import declared_name, policy_files

    if all_policies and policy_name is not None:
        # Counting every policy would pass over the name, mistyped or not, without a word.
        raise click.UsageError("--all and --policy exclude each other: give one of them")
    check_deployment_settings()
    if all_policies:
        counts = []
        for file in policy_files(location_tree()):
            if file.error:
                # One of "all": a script reading the document must see it, not only stderr.
                click.secho(f"error: {file.error} (not loaded; the code location does not "
                            "load until it is fixed)", fg="red", err=True)
                counts.append({"policy": declared_name(file.path), "error": file.error})
            counts += [_dry_run_counts(policy, partition, fail_fast=False)
                       for policy in file.policies]
    else:
        # With --json a script reads stdout: the error goes into the document, as with --all.
        counts = [_dry_run_counts(load_policy(policy_name), partition, fail_fast=not as_json)]
    if as_json:
        echo(json.dumps({"policies": counts, "deleted": 0}, indent=2))
    else:
        for count in counts:
            _echo_dry_run(count)
        echo("nothing deleted (dry run)")
    if any("error" in count for count in counts):
        sys.exit(2)


def _dry_run_counts(policy, partition: str | None, *, fail_fast: bool) -> dict:
    """What ``policy``'s rule matches in its database with the cutoff of now (the database
    server's clock) or of ``partition``, and with the next scheduled run's, as a JSON-ready
    dict (instants in ISO 8601 UTC, counts in rows), counted with the function policy tests use
    (:mod:`favorites_maintenance.testing`); a database error is its ``error`` (with
    ``fail_fast``: the command exits with it)."""
    from favorites_maintenance.config.parsers import safe_url
    from favorites_maintenance.pipeline.schedules import next_scheduled_run
    from favorites_maintenance.retention.database import limit_transaction
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
        engine, url = policy_engine(policy, fail_fast=fail_fast)
    except SettingsError as exc:
        error = str(exc)
    else:
        report["database"] = safe_url(url)
        try:
            # "now" is the database server's clock, as for the job.
            prunable = prunable_rows_at(policy, partition, engine)
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
            fail(error)
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
        echo(f"policy     {count['policy']} (not loaded)")
        echo(f"error      {count['error']}")
        return
    echo(f"database   {count['database'] or 'unset'} ({count['database_variable']})")
    echo(f"policy     {count['policy']} ({count['table']}, {count['guard']})")
    if "error" in count:
        echo(f"error      {count['error']}")
        return
    now, upcoming = count["now"], count["next_run"]
    echo(f"cutoff     {now['cutoff']} (retention {count['retention_days']} days)")
    echo(f"prunable   {now['prunable']:,} rows (oldest {count['age_column']}: "
          f"{now['oldest'] or 'none'})")
    if "held" in now:
        echo(f"held       {now['held']:,} {'row' if now['held'] == 1 else 'rows'} past the "
              "cutoff kept by an active hold (not deleted)")
    if upcoming["partition"] is None:
        echo(f"next run   {upcoming['at']} ({upcoming['cron']}): no complete day of the "
              "policy's partitions yet")
    else:
        echo(f"next run   {upcoming['at']} ({upcoming['cron']}), partition "
              f"{upcoming['partition']}: cutoff {upcoming['cutoff']}, {upcoming['prunable']:,} "
              "rows prunable")


@click.command("partition-functions",
              short_help="Print the SQL of a policy's partition functions, for psql.")
@location_option
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

    policy = load_policy(policy_name)
    if not policy.settings.drop_expired_partitions:
        fail(f"--policy {policy.name}: drop_expired_partitions is not true in its defs.yaml, "
              "so its job detaches no partition and calls no function; set "
              "drop_expired_partitions: true first")
    try:
        sql = partition_functions_sql(policy.rule, role)
    except RuleError as exc:
        fail(f"policy {policy.name}: {exc}")
    except InvalidArgumentError as exc:
        fail(f"--role: {exc}")
    click.echo(sql, nl=False)


@click.command(short_help="Move a policy's archived rows back into its table.")
@location_option
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

    check_deployment_settings()
    policy = load_policy(policy_name)
    if policy.archive_table is None:
        fail(f"--policy {policy_name}: the policy keeps no archive (no archive_table in its "
              "defs.yaml), so there is nothing to restore; its deleted rows are gone (restore "
              "from a backup: docs/runbook.md)")
    config = {"run_id": run_id, "since": since, "until": until, "pretend": pretend,
              "allow_prunable": allow_prunable, "batch_size": batch_size}
    try:
        selection_of(RestoreConfig(**config))
    except ValueError as exc:
        fail(str(exc).replace("run_id", "--run-id").replace("since", "--since")
              .replace("until", "--until"))
    if not os.environ.get("DAGSTER_HOME", "").strip():
        fail("DAGSTER_HOME is not set: restore runs the policy's restore job on the "
              "deployment's Dagster instance, so that its run is in the history and never "
              "beside a purge of the policy; export the DAGSTER_HOME the daemon uses")
    try:
        require_database_url(policy.database_url_env)
    except SettingsError as exc:
        fail(str(exc))
    defs = code_location(location_tree())
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
    echo(f"run {result.run_id} {state} ({policy.restore_job_name}"
          + (", pretend: nothing moved" if pretend else "") + ")")
    for label, key in (("archived rows selected", "selectedRows"),
                       ("restorable", "restorableRows"), ("restored", "restoredRows"),
                       ("key exists again", "keyExistsRows"),
                       ("left in the archive", "leftInArchive"),
                       ("prunable under the rule", "prunableRows"),
                       ("failed", "failedRows")):
        if key in shown:
            echo(f"  {label:<24}{shown[key]:>10,}")
    if not result.success:
        error = failures[0].error if failures else None
        fail(error.message.strip() if error is not None else "the restore run failed")
