"""``favorites-maintenance demo``: seed the embedded database, run a policy's job once
through Dagster, print what it did."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.config.deployment import require_database_url
from favorites_maintenance.config.policy import Policy
from favorites_maintenance.local.dev import seed_progress
from favorites_maintenance.local.environment import LocalEnvironment
from favorites_maintenance.local.guest_favorites import (
    GUEST_FAVORITES,
    SCHEMA,
    create_dev_schema,
    drop_dev_schema,
)
from favorites_maintenance.local.second_database import local_code_location
from favorites_maintenance.local.seed import seed_favorites, summarize
from favorites_maintenance.pipeline.partitions import (
    partition_cutoff,
    policy_partitions,
    read_now,
)
from favorites_maintenance.pipeline.run_report import RunReport
from favorites_maintenance.retention.backlog import measure_backlog
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.errors import BacklogError, TableShapeError
from favorites_maintenance.retention.holds import create_hold_table
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.table_check import check_table

UTC = dt.timezone.utc


def guard_counts(engine: sa.Engine, rule: RetentionRule) -> tuple[int, int]:
    """Rows of ``rule``'s table its guard matches (every guard column NULL: deletable once
    old enough), and rows it protects (any guard column set: never deleted)."""
    # A rule with no guard (null_columns: []) matches every row and protects none.
    matched = sa.and_(*(c.is_(None) for c in rule.guards)) if rule.guards else sa.true()
    stmt = sa.select(sa.func.count().filter(matched),
                     sa.func.count().filter(sa.not_(matched))).select_from(rule.table)
    with engine.connect() as conn:
        guarded, protected = conn.execute(stmt).one()
    return guarded, protected


class DemoError(Exception):
    """The demo could not run or its run failed; the message says why, in one line."""


def _seed(engine: sa.Engine, policy: Policy, rows: int, echo: Callable[[str], None]):
    """Recreate the dev table (and the policy's hold table, with its schema when missing) and
    seed ``rows`` rows over three years; return the seed's summary (rows, guest rows, account
    rows)."""
    hold = policy.rule.hold.qualified_name if policy.rule.hold is not None else None
    echo(f"recreating favorites.favorites in the embedded {engine.url.database!r} database and "
         f"seeding {rows:,} rows over three years ...")
    t0 = time.monotonic()
    drop_dev_schema(engine)
    create_dev_schema(engine)
    if hold is not None:
        schema = policy.rule.hold.table.schema
        # In the dev table's schema, the hold table went with it, and its holds.
        echo(f"  hold table {hold}: "
             + ("recreated with the schema, no holds" if schema == SCHEMA
                else "kept as it is (created if missing)"))
        # A schema of its own, as in production, may not exist yet in the embedded database.
        with engine.begin() as conn:
            conn.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
        create_hold_table(engine, hold)
    before = seed_favorites(engine, rows, now=dt.datetime.now(UTC),
                            on_progress=seed_progress(rows, echo))
    echo(f"  seeded in {time.monotonic() - t0:.1f} s: {before.rows:,} rows, "
         f"{before.guest_rows:,} guest, {before.account_rows:,} account")
    return before


def _echo_run(run: RunReport, echo: Callable[[str], None]) -> None:
    """The figures of a succeeded run, one per line, as its metadata records them."""
    echo(f"  rows deleted      {run.deleted_total:>12,}")
    largest = run.batch_size_max or run.batch_size
    mode = f"{run.batch_size_mode}: " if run.batch_size_mode else ""
    first = run.batch_size_first or run.batch_size
    echo(f"  batches           {run.batches:>12,}  ({mode}batch size {first:,}"
         + (f" first, {largest:,} largest)" if largest != first else ")"))
    echo(f"  duration          {run.duration_ms:>12,} ms")
    echo(f"  backlog remaining {run.backlog_remaining:>12,}  (stop reason: "
         f"{run.stop_reason})")
    if run.held_rows is not None:
        echo(f"  held rows         {run.held_rows:>12,}  (past the cutoff, kept by active holds)")
    if run.throttled_by != "none":
        # db_unhealthy is a success: the backlog waits for the next run.
        echo(f"  paused            {run.paused_ms:>12,} ms  ({run.throttled_by})")


def run_demo(env: LocalEnvironment, *, rows: int, pretend: bool, policy: Policy,
             echo: Callable[[str], None], tree: dg.ComponentTree | None = None) -> None:
    """Seed (guest favorites only), count, run the policy's job once through Dagster on
    ``env``'s instance and print what it did with ``echo``. ``tree``: the component tree
    declaring ``policy`` (default: ``favorites_maintenance/defs/``); the second database's
    policy is found either way.

    Raises:
        DemoError: the policy has no complete day yet (nothing seeded), the table is not
            usable, the run failed, or account rows changed.
    """
    # The policy's own database (FAVORITES_DATABASE_URL, or the second one's variable): both
    # are databases of the embedded server.
    url = require_database_url(policy.database_url_env)
    retention_days = policy.settings.retention_days
    partition = policy_partitions(policy).get_last_partition_key()
    if partition is None:  # the run could not record what it deleted: the job refuses it
        raise DemoError(f"policy {policy.name} has no day to run yet: its partitions start "
                        f"on {policy.settings.partitions_start.isoformat()} "
                        f"({policy.label('partitions_start')}), and a day is one once it has "
                        "ended (UTC); run the demo once that day has ended, or set an earlier "
                        "partitions_start")
    # Holds do not change which table there is to seed.
    seeded = policy.rule.with_hold(None) == GUEST_FAVORITES
    engine = create_engine(url)
    try:
        if seeded:
            before = _seed(engine, policy, rows, echo)
        else:
            echo(f"policy {policy.name}: {policy.rule.qualified_name} is used as it is "
                  "(only favorites.favorites has a dev table to seed)")

        cutoff = partition_cutoff(partition, retention_days, now=read_now(engine).database)
        try:
            # The same check of the table the job makes before its first batch.
            with engine.connect() as conn:
                check_table(conn, policy.rule)
            prunable = measure_backlog(engine, policy.rule, cutoff)
        except (TableShapeError, BacklogError) as exc:
            raise DemoError(f"{exc}; demo --policy {policy.name} needs "
                            f"{policy.rule.qualified_name} in the embedded {url.database!r} "
                            "database (README, \"Adding a retention policy\")") from None
        guarded = None if seeded else guard_counts(engine, policy.rule)
        if guarded is not None:
            echo(f"  {policy.rule.qualified_name}: {guarded[0]:,} rows with "
                 f"{policy.rule.guard_sql or 'no guard'}, {guarded[1]:,} protected by the guard")
        echo(f"  partition {partition}: cutoff {cutoff.isoformat()} "
              f"(retention {retention_days} days); the rule matches {prunable.remaining:,} rows")
        if pretend:
            echo("pretend: nothing deleted")
            return

        echo(f"running {policy.job_name} for partition {partition} "
              f"(Dagster instance: {env.dagster_home}) ...")
        # The policy alone: a broken policy file beside it does not stop the demo.
        job = local_code_location(tree, only=policy.name).resolve_job_def(policy.job_name)
        with dg.DagsterInstance.get() as instance:
            result = job.execute_in_process(
                partition_key=partition, instance=instance, raise_on_error=False,
                run_config={"loggers": {"console": {"config": {"log_level": "INFO"}}}},
            )
        after = summarize(engine) if seeded else guard_counts(engine, policy.rule)
    finally:
        engine.dispose()

    if not result.success:
        raise DemoError(f"run {result.run_id} failed; see the run in the Dagster UI "
              "(favorites-maintenance dev) or the log above")
    [materialization] = result.get_asset_materialization_events()
    echo("")
    echo(f"run {result.run_id} succeeded")
    _echo_run(RunReport.from_metadata(materialization.materialization.metadata), echo)
    if not seeded:
        guard = policy.rule.guard_sql or "no guard"
        echo(f"  rows of the guard {guarded[0]:>12,} -> {after[0]:,}  ({guard})")
        echo(f"  protected rows    {guarded[1]:>12,} -> {after[1]:,}  (NOT ({guard}))"
             + ("  (unchanged)" if guarded[1] == after[1] else "  (CHANGED!)"))
        if guarded[1] != after[1]:
            raise DemoError(f"rows the guard protects changed in {policy.rule.qualified_name}")
        return
    echo(f"  guest rows        {before.guest_rows:>12,} -> {after.guest_rows:,}")
    echo(f"  account rows      {before.account_rows:>12,} -> {after.account_rows:,}"
          + ("  (unchanged)" if before.account_rows == after.account_rows else "  (CHANGED!)"))
    if before.account_rows != after.account_rows:
        raise DemoError("account rows changed")
