"""A migration of favorites.favorites between two batches never fails the run, unless it
leaves a shape the rule cannot use.

The DDL runs in another session right after a batch commits (the purge holds no lock then). A
statement prepared before it (psycopg prepares after a few runs when the URL asks it to, and
``prepare_threshold=0`` prepares at once) may come back with "cached plan must not change result
type" or "prepared statement ... does not exist": that batch alone is run again on a new
connection, and every prunable row is deleted.
"""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import RECOMMENDED_INDEX_NAME
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    OLD,
    error_text,
    in_thread,
    mark_slow,
    run_job,
    sleeping_backend,
    slow_delete,
    step_failure,
)

MIGRATIONS = {
    "column-type": "ALTER TABLE favorites.favorites ALTER COLUMN id TYPE integer",
    "add-column": "ALTER TABLE favorites.favorites ADD COLUMN shared boolean DEFAULT false",
    "drop-column": "ALTER TABLE favorites.favorites DROP COLUMN note",
    "drop-index": f"DROP INDEX favorites.{RECOMMENDED_INDEX_NAME}",
    "create-index": "CREATE INDEX favorites_created_at_idx ON favorites.favorites (created_at)",
    "age-column-type": "ALTER TABLE favorites.favorites ALTER COLUMN updated_at "
                       "TYPE timestamp(3) with time zone",
}


@pytest.mark.parametrize("prepare", ["default", "prepare-at-once"])
@pytest.mark.parametrize("migration", list(MIGRATIONS))
def test_a_migration_between_two_batches_does_not_fail_the_run(db_url, engine, rows, migration,
                                                               prepare):
    rows.add_many(1000, updated_at=OLD)
    accounts = set(rows.add_many(50, updated_at=OLD, user_id=2))
    fresh = set(rows.add_many(50, updated_at=CUTOFF + dt.timedelta(days=1)))
    url = db_url if prepare == "default" else db_url.update_query_dict(
        {"prepare_threshold": "0"})
    job_engine = create_engine(url)
    migrated = []

    def migrate_after_batch_3(batch) -> None:
        if batch.batch_no == 3:
            with engine.begin() as conn:
                conn.exec_driver_sql(MIGRATIONS[migration])
            migrated.append(batch.deleted_total)

    try:
        report = purge_rows(job_engine, CUTOFF, batch_size=100, max_run_duration=dt.timedelta(
            minutes=5), on_batch=migrate_after_batch_3)
    finally:
        job_engine.dispose()

    assert migrated == [300]
    assert report.deleted_total == 1000
    assert rows.ids() == accounts | fresh
    if prepare == "prepare-at-once" and migration == "column-type":
        # The prepared statement's result type (the last id) changed: that one batch ran
        # again. (An optimistic batch reads the last updated_at through max(), whose type
        # carries no precision: a change of precision leaves its prepared statement valid.)
        assert report.retried_batches == 1
    else:
        assert report.retried_batches == 0


def test_a_schema_changed_after_every_batch_still_lets_the_run_finish(db_url, engine, rows):
    rows.add_many(300, updated_at=OLD)
    job_engine = create_engine(db_url.update_query_dict({"prepare_threshold": "0"}))
    types = iter(["integer", "bigint"] * 10)

    def migrate_again_and_again(batch) -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql(
                f"ALTER TABLE favorites.favorites ALTER COLUMN id TYPE {next(types)}")

    try:
        # Each new connection prepares afresh, so a change between batches never repeats the
        # error for the same batch: the run still completes.
        report = purge_rows(job_engine, CUTOFF, batch_size=100,
                            max_run_duration=dt.timedelta(minutes=5),
                            on_batch=migrate_again_and_again)
    finally:
        job_engine.dispose()
    assert report.deleted_total == 300
    # Batch 2 runs the keyset statement for the first time; batches 3 and 4 (the empty last one)
    # meet it prepared before a change, and each runs again once.
    assert report.retried_batches == 2
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM favorites.favorites")).scalar() == 0


def test_an_age_column_turned_timestamp_mid_run_is_refused_before_the_next_batch_commits(
        db_url, engine, rows, monkeypatch):
    """A migration between two batches of a run turns updated_at into a timestamp without
    time zone, in a database whose TimeZone is Asia/Tokyo: compared with the cutoff there, a
    row three hours younger than the retention would look six hours older. The run checks the
    table again before the next batch commits, rolls that batch back and stops, naming the
    column; the rows younger than the retention stay."""
    rows.add_many(300, updated_at=OLD)
    young = set(rows.add_many(20, updated_at=CUTOFF + dt.timedelta(hours=3)))
    mark_slow(engine, 150)  # batch 2 of 100 sleeps on it: the migration queues behind it
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{db_url.database}" SET timezone = '
                             "'Asia/Tokyo'")
    migrated = []

    def migrate():
        sleeping_backend(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "ALTER TABLE favorites.favorites ALTER COLUMN updated_at TYPE timestamp "
                "USING updated_at AT TIME ZONE 'UTC'")
        migrated.append(True)

    with slow_delete(engine, seconds=1), dg.instance_for_test() as instance:
        migration, _ = in_thread(migrate)
        result = run_job(db_url, instance, monkeypatch=monkeypatch, batch_size=100)
        migration.join(30)
        [failed] = [e.user_message for e in instance.all_logs(result.run_id)
                    if e.user_message.startswith("run failed")]
        observed = [e.dagster_event.asset_observation_data.asset_observation.metadata
                    for e in instance.all_logs(result.run_id)
                    if e.dagster_event and e.dagster_event.event_type
                    == dg.DagsterEventType.ASSET_OBSERVATION]

    assert migrated and not result.success
    step, error = step_failure(result)
    assert step.endswith("purge")
    text = error_text(error)
    assert "TableChangedError" in text
    assert ("favorites.favorites changed during the run: batch 3 was rolled back and no batch "
            "follows (200 rows deleted before stay deleted)") in text
    assert "favorites.favorites.updated_at is TIMESTAMP WITHOUT TIME ZONE" in text
    assert "batch_no=3 " in failed and "deleted_before=200" in failed
    assert [m["deletedTotal"].value for m in observed] == [200]
    with engine.connect() as conn:
        left = set(conn.exec_driver_sql("SELECT id FROM favorites.favorites").scalars())
    assert young <= left and len(left) == 120
