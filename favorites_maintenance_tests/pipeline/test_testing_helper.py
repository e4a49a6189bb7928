"""``favorites_maintenance.testing``: the keys a rule would delete at an instant, the cutoff
derived as the job derives it, nothing deleted; and ``dry-run`` counting the same rows.
Against a real PostgreSQL, and through the job itself where it is compared with it."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from favorites_maintenance.cli import main
from favorites_maintenance.pipeline.partitions import daily_partitions
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.retention.errors import InvalidArgumentError, TableShapeError
from favorites_maintenance.testing import prunable_keys, prunable_rows
from favorites_maintenance_tests.helpers.jobs import (
    guest_settings_env,
    run_job,
    run_report,
)

UTC = dt.timezone.utc
MICRO = dt.timedelta(microseconds=1)
NOW = dt.datetime(2026, 6, 16, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def guest_defaults(monkeypatch):
    """The guest-favorites policy at its defaults (365 days), whatever the environment says."""
    guest_settings_env(monkeypatch)


def test_the_cutoff_is_now_minus_the_retention_strictly_and_nothing_is_deleted(rows):
    cutoff = NOW - dt.timedelta(days=365)
    just_older = rows.add(updated_at=cutoff - MICRO)
    rows.add(updated_at=cutoff)  # exactly at the cutoff: kept
    rows.add(updated_at=cutoff + MICRO)
    rows.add(updated_at=cutoff - dt.timedelta(days=30), user_id=5)  # an account row
    oldest = rows.add(updated_at=cutoff - dt.timedelta(days=30))
    before = rows.ids()

    assert prunable_rows("guest_favorites", now=NOW).cutoff == cutoff
    # In the order the job's batches take them: oldest first.
    assert prunable_keys("guest_favorites", rows.engine, now=NOW) == [oldest, just_older]
    assert rows.ids() == before


def test_rows_of_the_callers_open_transaction_count_and_it_stays_open(engine):
    with engine.connect() as conn:
        conn.execute(sa.text(
            "INSERT INTO favorites.favorites (anonymous_id, item_id, updated_at) "
            "VALUES (gen_random_uuid(), 1, :at)"), {"at": NOW - dt.timedelta(days=400)})
        assert len(prunable_keys("guest_favorites", conn, now=NOW)) == 1
        assert conn.in_transaction()
        conn.rollback()
    assert prunable_keys("guest_favorites", engine, now=NOW) == []


def test_the_keys_of_a_partition_are_what_its_run_deletes_and_what_dry_run_counts(
        db_url, rows, monkeypatch):
    partition = "2026-06-15"
    cutoff = daily_partitions.time_window_for_partition_key(partition).end \
        - dt.timedelta(days=365)
    ids = {rows.add(updated_at=cutoff - MICRO), rows.add(updated_at=cutoff),
           rows.add(updated_at=cutoff - dt.timedelta(days=3)),
           rows.add(updated_at=cutoff - dt.timedelta(days=3), user_id=9)}
    keys = prunable_keys("guest_favorites", rows.engine, partition=partition)
    assert len(keys) == 2

    env = {DATABASE_URL_VAR: db_url.render_as_string(hide_password=False)}
    dry = CliRunner().invoke(main, ["dry-run", "--policy", "guest_favorites",
                                    "--partition", partition], env=env)
    assert dry.exit_code == 0, dry.output
    assert f"cutoff     {cutoff.isoformat()} (retention 365 days)" in dry.output
    assert "prunable   2 rows" in dry.output

    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, partition=partition, monkeypatch=monkeypatch)
        assert result.success and run_report(result).deleted_total == 2
    assert rows.ids() == ids - set(keys)


def test_what_it_refuses(engine, rows):
    with pytest.raises(KeyError, match="no policy 'guest_carts'; the policies are "):
        prunable_keys("guest_carts", engine, now=NOW)
    with pytest.raises(InvalidArgumentError, match="now must be a timezone-aware datetime"):
        prunable_keys("guest_favorites", engine, now=dt.datetime(2026, 6, 16))
    with pytest.raises(ValueError, match="'2026-13-01' is not a daily partition key"):
        prunable_keys("guest_favorites", engine, partition="2026-13-01")
    # A table the job would refuse is refused here too, before any row is read.
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE favorites.favorites ALTER COLUMN updated_at "
                             "TYPE timestamp USING updated_at AT TIME ZONE 'UTC'"))
    with pytest.raises(TableShapeError, match="favorites.favorites.updated_at is TIMESTAMP WITHOUT"):
        prunable_keys("guest_favorites", engine, now=NOW)
