"""A run's copy of the holds against a real PostgreSQL: the batches test their rows against
it and read only the hold table's change counter; a hold written between two batches, by
``hold place`` or by the application's own INSERT, moves the counter and keeps its row from
the next batch on; a released hold, a disabled trigger and a hold table without the counter
(which keeps reading the holds in every statement) delete nothing a hold keeps."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.retention.hold_copy import copy_holds
from favorites_maintenance.retention.holds import (
    create_hold_table,
    create_hold_table_sql,
    place_hold,
    release_hold,
    typed_holds,
)
from favorites_maintenance_tests.core.test_holds import HOLDS, drop_change_counter, holds_of, run
from favorites_maintenance_tests.core.test_purge import OLD

COUNTER = f"{HOLDS}_changes"


@pytest.fixture
def holds(engine):
    create_hold_table(engine, HOLDS)
    return holds_of()


def changes(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(f"SELECT changes FROM {COUNTER}")).scalar_one()


def insert_hold(engine, value: str) -> None:
    """A hold as the application writes it: a plain INSERT, in its own transaction."""
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {HOLDS} (policy, held_value, placed_by, reason) "
                             "VALUES ('guest_favorites', :v, 'app', 'case')"), {"v": value})


def recorded(engine, run_it) -> list[str]:
    """The SQL of every statement ``run_it()`` sends."""
    statements = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn, cursor, statement, parameters, context, executemany):
        statements.append(statement)

    try:
        run_it()
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    return statements


def test_every_write_of_the_hold_table_moves_its_counter_in_the_writer_s_transaction(
        engine, holds):
    before = changes(engine)
    hold = place_hold(engine, holds, "1", reason="dispute", placed_by="support")
    insert_hold(engine, "2")
    release_hold(engine, holds, hold, released_by="support")
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {HOLDS} WHERE held_value = '2'"))
    assert changes(engine) == before + 4
    with engine.connect() as conn:  # rolled back: the counter stays
        conn.execute(sa.text(f"INSERT INTO {HOLDS} (policy, held_value, placed_by, reason) "
                             "VALUES ('p', '3', 'a', 'r')"))
        conn.rollback()
    assert changes(engine) == before + 4
    with engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {HOLDS}"))
    assert changes(engine) == before + 5
    with engine.begin() as conn:  # a session that fires no ordinary trigger
        conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
        conn.execute(sa.text(f"INSERT INTO {HOLDS} (policy, held_value, placed_by, reason) "
                             "VALUES ('p', '4', 'a', 'r')"))
    assert changes(engine) == before + 6


def test_hold_init_adds_the_counter_to_a_hold_table_made_before_it(engine, rows):
    with engine.begin() as conn:
        for statement in create_hold_table_sql(HOLDS)[:2]:  # the table and index alone
            conn.exec_driver_sql(statement)
    insert_hold(engine, "1")
    create_hold_table(engine, HOLDS)
    create_hold_table(engine, HOLDS)  # again: nothing changes
    assert changes(engine) == 0
    insert_hold(engine, "2")
    assert changes(engine) == 1


def test_the_batches_test_their_rows_against_the_run_s_copy_and_read_only_the_counter(
        engine, rows, holds):
    ids = sorted(rows.add_many(30, updated_at=OLD))
    place_hold(engine, holds, str(ids[4]), reason="dispute", placed_by="support")
    rule = GUEST_FAVORITES.with_hold(holds)
    with engine.begin() as conn:
        copied = copy_holds(conn, typed_holds(conn, holds, rule.qualified_name)[0])
    assert copied.copy is not None and copied.copy.count == 1

    sent = recorded(engine, lambda: run(engine, rule, batch_size=10,
                                        target_batch_duration=dt.timedelta(0)))

    assert rows.ids() == {ids[4]}
    deletes = [sql for sql in sent if sql.lstrip().startswith("DELETE")]
    assert deletes and all("retention_held" in sql and "held_value" not in sql
                           for sql in deletes), deletes
    assert sum(f"FROM {COUNTER}" in sql for sql in sent) >= len(deletes)


def test_a_hold_the_application_inserts_between_two_batches_keeps_its_row(engine, rows, holds):
    """The INSERT moves the counter: the next batch reads the holds again before it runs.
    Without the counter's check, the run's copy would miss the hold and delete the row."""
    ids = sorted(rows.add_many(12, updated_at=OLD))

    def on_batch(batch):
        if batch.batch_no == 1:
            insert_hold(engine, str(ids[8]))

    report = run(engine, GUEST_FAVORITES.with_hold(holds), batch_size=4, on_batch=on_batch,
                 target_batch_duration=dt.timedelta(0))

    assert report.deleted_total == 11 and rows.ids() == {ids[8]}


def test_a_hold_released_during_a_run_leaves_its_row_prunable_by_the_next_run_at_the_latest(
        engine, rows, holds):
    ids = sorted(rows.add_many(12, updated_at=OLD))
    hold = place_hold(engine, holds, str(ids[10]), reason="dispute", placed_by="support")
    first = place_hold(engine, holds, str(ids[1]), reason="dispute", placed_by="support")
    rule = GUEST_FAVORITES.with_hold(holds)

    def on_batch(batch):
        if batch.batch_no == 1:
            release_hold(engine, holds, first, released_by="support")

    run(engine, rule, batch_size=4, on_batch=on_batch, target_batch_duration=dt.timedelta(0))
    assert ids[10] in rows.ids()
    release_hold(engine, holds, hold, released_by="support")
    run(engine, rule)
    assert rows.ids() == set()


def test_with_its_trigger_disabled_the_batches_read_the_holds_again_every_time(
        engine, rows, holds):
    """A write that does not move the counter (the trigger disabled during the run) is
    still seen: without an enabled trigger the counter proves nothing."""
    ids = sorted(rows.add_many(12, updated_at=OLD))

    def on_batch(batch):
        if batch.batch_no == 1:
            with engine.begin() as conn:
                conn.execute(sa.text(f"ALTER TABLE {HOLDS} DISABLE TRIGGER USER"))
            insert_hold(engine, str(ids[9]))

    report = run(engine, GUEST_FAVORITES.with_hold(holds), batch_size=4, on_batch=on_batch,
                 target_batch_duration=dt.timedelta(0))

    assert report.deleted_total == 11 and rows.ids() == {ids[9]}
    # Disabled before the run: no copy, the statements read the holds themselves.
    with engine.begin() as conn:
        hold = typed_holds(conn, holds, GUEST_FAVORITES.qualified_name)[0]
        assert copy_holds(conn, hold).copy is None


def test_a_hold_table_without_the_counter_keeps_reading_the_holds_in_every_statement(
        engine, rows, holds):
    drop_change_counter(engine)
    ids = sorted(rows.add_many(12, updated_at=OLD))
    place_hold(engine, holds, str(ids[2]), reason="dispute", placed_by="support")

    def on_batch(batch):
        if batch.batch_no == 1:
            insert_hold(engine, str(ids[8]))

    sent = recorded(engine, lambda: run(engine, GUEST_FAVORITES.with_hold(holds), batch_size=4,
                                        on_batch=on_batch,
                                        target_batch_duration=dt.timedelta(0)))

    assert rows.ids() == {ids[2], ids[8]}
    deletes = [sql for sql in sent if sql.lstrip().startswith("DELETE")]
    assert deletes and all("held_value" in sql for sql in deletes)
    assert not any(COUNTER in sql for sql in sent)


def test_the_copy_reaches_the_server_as_the_held_values_of_the_column_s_type(engine, rows, holds):
    ids = sorted(rows.add_many(3, updated_at=OLD))
    for value in (ids[0], ids[2]):
        place_hold(engine, holds, str(value), reason="dispute", placed_by="support")
    rule = GUEST_FAVORITES.with_hold(holds)
    with engine.begin() as conn:
        copied = copy_holds(conn, typed_holds(conn, holds, rule.qualified_name)[0])
        held = conn.execute(sa.select(sa.literal_column("h")).select_from(
            sa.text("unnest(CAST(:held AS bigint[])) AS h")), {"held": copied.copy.values})
        assert sorted(held.scalars()) == [ids[0], ids[2]]
    # The copy's values name rows: neither the copy nor its array shows them.
    assert repr(copied.copy) == f"HoldCopy(changes={copied.copy.changes}, count=2)"
    assert repr(copied.copy.values) == "BinaryArray(oid=1016)"  # bigint[]


def test_holds_on_an_array_column_keep_their_rows(engine, rows, holds):
    """An array of arrays is one array of more dimensions, not a list of values: such a
    column gets no copy, and its statements read the holds themselves."""
    ids = sorted(rows.add_many(6, updated_at=OLD))
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE favorites.favorites ADD COLUMN tags integer[]"))
        conn.execute(sa.text("UPDATE favorites.favorites SET tags = ARRAY[id, 7]"))
        conn.execute(sa.text("UPDATE favorites.favorites SET tags = ARRAY[id] WHERE id = :i"),
                     {"i": ids[2]})
    by_tags = holds_of(column="tags")
    for value in (f"{{{ids[1]},7}}", f"{{{ids[2]}}}"):
        place_hold(engine, by_tags, value, reason="dispute", placed_by="support",
                   of_table="favorites.favorites")

    report = run(engine, GUEST_FAVORITES.with_hold(by_tags), batch_size=2)

    assert report.deleted_total == 4 and rows.ids() == {ids[1], ids[2]}


@pytest.mark.parametrize("prepare_threshold", ["0", "1"])
def test_with_server_side_prepared_statements_the_copy_is_bound_and_read_again(
        db_url, rows, prepare_threshold):
    """Prepared from the first or the second execution, the batches still bind the copy
    (typed by its array's oid) and the copy read again after a hold was placed and another
    released between two batches."""
    from favorites_maintenance.retention.database import create_engine

    engine = create_engine(db_url.update_query_dict({"prepare_threshold": prepare_threshold}))
    try:
        create_hold_table(engine, HOLDS)
        holds = holds_of()
        ids = sorted(rows.add_many(16, updated_at=OLD))
        first = place_hold(engine, holds, str(ids[9]), reason="dispute", placed_by="support")

        def on_batch(batch):
            if batch.batch_no == 1:
                release_hold(engine, holds, first, released_by="support")
                place_hold(engine, holds, str(ids[13]), reason="dispute", placed_by="support")

        report = run(engine, GUEST_FAVORITES.with_hold(holds), batch_size=4,
                     on_batch=on_batch, target_batch_duration=dt.timedelta(0))
    finally:
        engine.dispose()
    assert report.deleted_total == 15 and rows.ids() == {ids[13]}
