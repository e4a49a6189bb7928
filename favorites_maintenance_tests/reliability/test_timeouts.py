"""Timeouts: a short server-side limit cancels a batch, and the run says so.

The limits a DBA puts on the job's role are the ones in force: the job's own per-batch
``statement_timeout``/``lock_timeout`` may tighten them, never loosen them. A batch cancelled
by ``statement_timeout`` is taken again in smaller batches, down to one row; a row whose delete
alone runs past the limit is skipped and named, and the run fails only when nothing can
progress.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import dev_favorites
from favorites_maintenance.retention import TableCheckError
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    OLD,
    in_thread,
    mark_slow,
    materialization,
    run_job,
    sleeping_backend,
    slow_delete,
    step_failure,
)

MINUTE = dt.timedelta(minutes=1)
guest = dev_favorites.c.user_id.is_(None)


def slow_row_id(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(dev_favorites.c.id)
                            .where(dev_favorites.c.note == "SLOW")).scalar_one()


def test_a_short_statement_timeout_of_the_role_is_in_force(engine, rows, roles):
    url = roles.create("short", least_privilege=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER ROLE "{url.username}" SET statement_timeout = \'200ms\'')
    rows.add_many(300, updated_at=OLD)
    mark_slow(engine, 150)  # batch 2 of 100
    as_role = create_engine(url)
    try:
        with slow_delete(engine, seconds=3):
            report = purge_rows(as_role, CUTOFF, batch_size=100, max_run_duration=MINUTE)
    finally:
        as_role.dispose()
    # The role's 200 ms cancelled every batch holding the row (not the job's own 30 s, which
    # would have let its 3 s delete finish): the row alone was skipped, the others deleted.
    assert (report.deleted_total, report.skipped_rows) == (299, 1)
    [cause] = report.skipped_causes
    assert cause.startswith("statement_timeout (SQLSTATE 57014) from function "
                            "favorites.slow_delete(): deleting this one row takes longer than "
                            "statement_timeout (DELETE triggers slow_delete "
                            "(favorites.slow_delete()))")
    assert rows.ids() == {slow_row_id(engine)}


def test_a_short_lock_timeout_of_the_role_is_kept(engine, rows, roles):
    url = roles.create("impatient", least_privilege=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER ROLE "{url.username}" SET lock_timeout = \'100ms\'')
    rows.add_many(10, updated_at=OLD)
    as_role = create_engine(url)
    migration = engine.connect()
    try:
        migration.begin()
        migration.exec_driver_sql("LOCK TABLE favorites.favorites IN ACCESS EXCLUSIVE MODE")
        t0 = time.monotonic()
        # The first statement to need the table's lock is the check of its shape, bounded like
        # the batches.
        with pytest.raises(TableCheckError) as raised:
            purge_rows(as_role, CUTOFF, batch_size=100, max_run_duration=MINUTE,
                       lock_timeout=dt.timedelta(seconds=60))
        elapsed = time.monotonic() - t0
    finally:
        migration.rollback()
        migration.close()
        as_role.dispose()
    assert raised.value.kind == "lock_not_available"
    assert elapsed < 30  # the role's 100 ms, not the run's minute
    assert rows.count() == 10


def test_the_jobs_own_statement_timeout_applies_when_the_role_has_none(engine, rows):
    rows.add_many(50, updated_at=OLD)
    mark_slow(engine, 10)
    with slow_delete(engine, seconds=3):
        report = purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=MINUTE,
                            statement_timeout=dt.timedelta(milliseconds=300))
    assert (report.deleted_total, report.skipped_rows) == (49, 1)
    assert report.skipped_causes[0].startswith("statement_timeout (SQLSTATE 57014)")
    assert rows.ids() == {slow_row_id(engine)}


def test_a_run_where_no_row_finishes_within_the_statement_timeout_fails_naming_it(
        engine, rows, roles, monkeypatch):
    url = roles.create("short", least_privilege=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER ROLE "{url.username}" SET statement_timeout = \'200ms\'')
    rows.add_many(30, updated_at=OLD)
    with engine.begin() as conn:
        # Every row's delete takes 3 s: nothing can progress, and the run must not look like
        # an empty one.
        conn.execute(sa.update(dev_favorites).values(note="SLOW"))
    with slow_delete(engine, seconds=3), dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch)
        assert not result.success
        assert materialization(result) is None
        step, error = step_failure(result)
        failed = [e.user_message for e in instance.all_logs(result.run_id)
                  if e.user_message.startswith("run failed")]
    assert step.endswith("purge")
    text = error.message + (error.cause.message if error.cause else "")
    assert "SkippedRowsError" in text and "looks blocked" in text
    assert "statement_timeout (SQLSTATE 57014)" in text
    # 1000 rows halved down to three (nine batches), then ten single rows.
    assert len(failed) == 1 and "batch_no=19 " in failed[0] and "statement_timeout" in failed[0]
    assert rows.count() == 30


def cascade_children(engine, guests: list[int], per_guest: int, *, heavy: int | None = None,
                     heavy_children: int = 0) -> None:
    """``per_guest`` rows of ``favorites.shares`` for each guest row, deleted with it by
    ``ON DELETE CASCADE``, each delete taking 2 ms (a trigger of the child table); ``heavy``
    gets ``heavy_children`` of them."""
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE TABLE favorites.shares (id bigserial PRIMARY KEY, favorite_id bigint
                CONSTRAINT shares_favorite_fk REFERENCES favorites.favorites(id)
                ON DELETE CASCADE);
            CREATE INDEX ON favorites.shares (favorite_id);
            CREATE FUNCTION favorites.share_removed() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep(0.002); RETURN OLD; END $$;
            CREATE TRIGGER share_removed BEFORE DELETE ON favorites.shares
                FOR EACH ROW EXECUTE FUNCTION favorites.share_removed();""")
        conn.execute(sa.text(
            "INSERT INTO favorites.shares (favorite_id) SELECT g FROM unnest(CAST(:ids AS "
            "bigint[])) AS g, LATERAL generate_series(1, CASE WHEN g = :heavy THEN :many "
            "ELSE :each END)"), {"ids": guests, "heavy": heavy or -1, "many": heavy_children,
                                 "each": per_guest})


def shares(engine) -> int:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM favorites.shares").scalar_one()


def test_a_cascade_heavier_than_the_statement_timeout_drains_in_smaller_batches(
        engine, rows, roles, monkeypatch):
    """Each guest row has ten ON DELETE CASCADE children of 2 ms each under a 1 s
    statement_timeout: a batch of 1000 can never finish. It is taken again smaller until
    batches fit; one row whose own cascade runs past the limit is skipped and named."""
    url = roles.create("cascading", least_privilege=True)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'ALTER ROLE "{url.username}" SET statement_timeout = \'1s\'')
    guests = sorted(rows.add_many(150, updated_at=OLD))
    accounts = set(rows.add_many(5, updated_at=OLD, user_id=3))
    heavy = guests[100]
    cascade_children(engine, guests, 10, heavy=heavy, heavy_children=600)  # 1.2 s alone

    with dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch)
        warnings = [e.user_message for e in instance.all_logs(result.run_id)
                    if e.level == logging.WARNING]

    assert result.success
    meta = materialization(result)
    assert (meta["deletedTotal"], meta["skippedRows"], meta["backlogRemaining"]) == (149, 1, 1)
    assert meta["skippedCauses"] == (
        "statement_timeout (SQLSTATE 57014) from function favorites.share_removed(): "
        "deleting this one row takes longer than statement_timeout (foreign keys "
        "favorites.shares_favorite_fk on favorites.shares (ON DELETE CASCADE))")
    assert rows.ids() == {heavy} | accounts
    assert shares(engine) == 600  # the skipped row's children, and no other
    assert any("ran past statement_timeout" in w and "smaller batches" in w for w in warnings)
    assert any(f"skipped row id={heavy} " in w for w in warnings)
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert not checks["no_rows_skipped"].passed


def test_a_migration_lock_after_the_purge_fails_the_backlog_instead_of_hanging_the_run(
        db_url, engine, rows, monkeypatch):
    rows.add_many(50, updated_at=OLD)
    mark_slow(engine, 10)
    holding, released = [], []

    def migrate():
        # Queued behind the purge's batch, granted when it commits: then held for 8 s.
        sleeping_backend(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("LOCK TABLE favorites.favorites IN ACCESS EXCLUSIVE MODE")
            holding.append(time.monotonic())
            conn.exec_driver_sql("SELECT pg_sleep(8)")
        released.append(time.monotonic())

    with slow_delete(engine, seconds=1), dg.instance_for_test() as instance:
        migration, _ = in_thread(migrate)
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
        ended = time.monotonic()
        observed = [e.dagster_event.asset_observation_data.asset_observation.metadata
                    for e in instance.all_logs(result.run_id)
                    if e.dagster_event and e.dagster_event.event_type
                    == dg.DagsterEventType.ASSET_OBSERVATION]
        migration.join(20)
    assert holding  # the lock was really taken between the purge and the backlog
    # The run ended while the lock was still held: it gave up on it, never waited it out.
    assert not result.success and ended < released[0]
    step, error = step_failure(result)
    assert step.endswith("measure_backlog")
    assert "lock_not_available" in error.message + (error.cause.message if error.cause else "")
    # The rows the purge deleted are still reported, though the run could not finish.
    assert [m["deletedTotal"].value for m in observed] == [50]
    assert rows.count() == 0
