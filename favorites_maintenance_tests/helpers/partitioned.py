"""A policy that purges ``favorites.favorites`` one partition per step, and that table
partitioned by month with a backlog spread over several partitions, for the tests of the
partition steps on each executor. The job functions are reconstructable: the executor's step
processes and Celery workers import them from here.
"""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg
import sqlalchemy as sa

from favorites_maintenance.config.policy import Policy
from favorites_maintenance.config.policy_settings import SETTINGS, parse_policy_settings
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.local.guest_favorites import (
    create_partitioned_dev_schema,
    dev_favorites,
    drop_dev_schema,
    month_starts,
)

UTC = dt.UTC
POLICY = "monthly_favorites"
JOB = f"{POLICY}_cleanup_job"
ASSET_KEY = dg.AssetKey(["favorites", f"{POLICY}_cleanup"])
NODE = "favorites__monthly_favorites_cleanup"
BATCH = 20


def partitioned_attributes(**settings) -> dict:
    """The partitioned policy's ``attributes``: the guest-favorites rule on
    ``favorites.favorites``, purged one partition per step, at most two at once, in fixed
    batches of :data:`BATCH` rows; ``settings`` on top (a setting given ``None`` left out)."""
    values = {"max_parallel_partitions": "2", "batch_size": str(BATCH),
              "target_batch_duration": "PT0S", "partitions_start": "2026-01-01", **settings}
    return {"name": POLICY, "table": GUEST_FAVORITES.qualified_name, "key_column": "id",
            "age_column": "updated_at", "null_columns": ["user_id"],
            **{name: value for name, value in values.items() if value is not None}}


def partitioned_policy(**settings) -> Policy:
    """The partitioned policy (see :func:`partitioned_attributes`), validated."""
    values = {name: value for name, value in partitioned_attributes(**settings).items()
              if name in SETTINGS}
    return Policy(POLICY, GUEST_FAVORITES, parse_policy_settings(values, {}))


def partitioned_defs(**settings) -> dg.Definitions:
    """The code location of a defs folder holding the real guest-favorites policy and the
    partitioned one (``settings`` on top), its database from the environment.

    The folder is a temporary one named by its content (:func:`policy_folder`): the executor's
    step processes and Celery workers, which reconstruct the job from here, find the same one.
    """
    from favorites_maintenance.components.policy_tree import code_location
    from favorites_maintenance_tests.helpers.policies import policy_folder

    return code_location(policy_folder(partitioned_attributes(**settings)))


def partitioned_job():
    """The policy's job as the code location defines it, with its own executor."""
    return partitioned_defs().resolve_job_def(JOB)


def retries(n: int) -> dict:
    """Run config: ``n`` retries without delay for every op that reaches the database."""
    config = {"config": {"max_retries": n, "retry_delay_seconds": 0.0}}
    return {"ops": {NODE: {"ops": {"compute_cutoff": config, "plan_partitions": config,
                                   "purge_partition": config}}}}


def monthly_table(engine, db_url, monkeypatch):
    """``favorites.favorites`` partitioned by month from 30 months ago to 3 months ahead, and
    the environment the job reads; returns the engine and the partitions' names."""
    drop_dev_schema(engine)
    now = dt.datetime.now(UTC)
    names = create_partitioned_dev_schema(engine, month_starts(now - dt.timedelta(days=915), 33))
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    return engine, names


def add_rows(engine, *, months_ago: int, guests: int, accounts: int = 0) -> None:
    """``guests`` guest rows and ``accounts`` account rows ``months_ago`` months (of 30 days)
    back, a minute apart."""
    start = dt.datetime.now(UTC) - dt.timedelta(days=30 * months_ago)
    rows = ([{"user_id": None, "anonymous_id": "00000000-0000-4000-8000-000000000001"}] * guests
            + [{"user_id": 7, "anonymous_id": None}] * accounts)
    with engine.begin() as conn:
        conn.execute(sa.insert(dev_favorites), [
            {**row, "item_id": i, "note": None, "created_at": start,
             "updated_at": start + i * dt.timedelta(minutes=1)}
            for i, row in enumerate(rows)])


def snapshot(engine) -> dict:
    """Ids of the guest rows older than 366 days (prunable for yesterday's run), of the other
    guest rows, and of the account rows."""
    old = dt.datetime.now(UTC) - dt.timedelta(days=366)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(dev_favorites.c.id, dev_favorites.c.user_id,
                                      dev_favorites.c.updated_at)).all()
    return {"prunable": {r.id for r in rows if r.user_id is None and r.updated_at < old},
            "recent": {r.id for r in rows if r.user_id is None and r.updated_at >= old},
            "accounts": {r.id for r in rows if r.user_id is not None}}


#: The old months of :func:`spread` (months ago, prunable guest rows in it).
OLD_MONTHS = ((25, 45), (20, 30), (18, 50), (15, 25), (13, 10))


def spread(engine, old_months: int = len(OLD_MONTHS)) -> dict:
    """Prunable guest rows in the first ``old_months`` of :data:`OLD_MONTHS` (five by default),
    account rows among them and in the recent months, recent guest rows: a backlog spread over
    several partitions."""
    for months_ago, guests in OLD_MONTHS[:old_months]:
        add_rows(engine, months_ago=months_ago, guests=guests, accounts=3)
    add_rows(engine, months_ago=2, guests=40, accounts=5)
    add_rows(engine, months_ago=0, guests=5, accounts=5)
    return snapshot(engine)


def partitions_of(engine, ids) -> set[str]:
    """The partitions holding the rows ``ids``."""
    with engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT DISTINCT tableoid::regclass::text FROM favorites.favorites "
            "WHERE id = ANY(:ids)"), {"ids": list(ids)}).scalars())


def detached_tables(engine) -> dict[str, dict]:
    """The tables the job detached and still keeps, by name (``schema.name``): each one's
    comment as JSON (``partition``: the partition it was)."""
    with engine.connect() as conn:
        found = conn.execute(sa.text(
            "SELECT format('%s.%s', n.nspname, c.relname), obj_description(c.oid, 'pg_class') "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND NOT c.relispartition "
            "AND obj_description(c.oid, 'pg_class') LIKE '{\"favorites_maintenance\"%'")).all()
    return {name: json.loads(comment) for name, comment in found}


def detached_from(engine) -> set[str]:
    """The partitions (``schema.name``) whose detached tables the job still keeps."""
    return {mark["partition"] for mark in detached_tables(engine).values()
            if mark.get("favorites_maintenance") == "detached"}


def backdate_detach(engine, partition: str, days: int) -> None:
    """Move the instant the job recorded for detaching ``partition`` (``schema.name``, the
    partition's name: the detached table's is found by its comment) ``days`` into the past."""
    [(table, mark)] = [(name, mark) for name, mark in detached_tables(engine).items()
                       if mark.get("partition") == partition]
    mark["at"] = (dt.datetime.fromisoformat(mark["at"]) - dt.timedelta(days=days)).isoformat()
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT set_config('test.note', :n, true)"),
                     {"n": json.dumps(mark)})
        conn.execute(sa.text(f"DO $$ BEGIN EXECUTE format('COMMENT ON TABLE {table} IS %L',"
                             " current_setting('test.note')); END $$"))


def erasure_log(engine) -> None:
    """An application's erasure log on the table: an AFTER DELETE statement trigger on
    ``favorites.favorites`` that records how many rows each DELETE removed (its transition
    table)."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE favorites.erasure_log (deleted bigint NOT NULL)"))
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.log_erasure() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN INSERT INTO favorites.erasure_log SELECT count(*) FROM erased; "
            "RETURN NULL; END $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER log_erasure AFTER DELETE ON favorites.favorites "
            "REFERENCING OLD TABLE AS erased FOR EACH STATEMENT "
            "EXECUTE FUNCTION favorites.log_erasure()"))
