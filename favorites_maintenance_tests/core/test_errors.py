"""Database errors described by kind, class and SQLSTATE, never by the text that may quote rows."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
from favorites_maintenance.retention.database import (
    create_engine,
    error_summary,
    transient_error_kind,
)
from favorites_maintenance.retention import measure_backlog
from favorites_maintenance.retention.errors import (
    BacklogError,
    ConnectError,
    RetentionError,
    describe,
)
from favorites_maintenance_tests.helpers.purging import purge_rows


def failing(engine, sql: str) -> sa.exc.DBAPIError:
    with pytest.raises(sa.exc.DBAPIError) as raised:
        with engine.begin() as conn:
            conn.execute(sa.text(sql))
    return raised.value


@pytest.mark.parametrize("sql, kind, sqlstate, message", [
    ("SET LOCAL statement_timeout = '10ms'; SELECT pg_sleep(1)", "statement_timeout", "57014",
     "canceling statement due to statement timeout"),
    ("SELECT * FROM favorites.nowhere", "undefined_table", "42P01",
     'relation "favorites.nowhere" does not exist'),
    ("DO $$ BEGIN RAISE EXCEPTION 'row %', 'PRIVATE' USING DETAIL = 'PRIVATE'; END $$",
     "raise_exception", "P0001", None),
    # A publication's row filter outside the replica identity, created after the run's check.
    ("CREATE PUBLICATION late FOR TABLE favorites.favorites WHERE (user_id IS NULL); "
     "DELETE FROM favorites.favorites", "invalid_column_reference", "42P10",
     'cannot delete from table "favorites"'),
])
def test_kinds_and_what_is_said(engine, sql, kind, sqlstate, message):
    exc = failing(engine, sql)
    error = describe(exc)
    assert (error.kind, error.sqlstate, error.message) == (kind, sqlstate, message)
    assert "PRIVATE" not in str(error)
    assert transient_error_kind(exc) is None  # retrying would fail the same way


@pytest.mark.parametrize("column, sql", [
    ("id", "INSERT INTO favorites.written (id) VALUES (424242)"),
    ("label", "INSERT INTO favorites.written (label) VALUES ('PRIVATE')"),
])
def test_a_value_written_into_a_generated_column_is_told_by_its_column(engine, column, sql):
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE favorites.written (id bigint GENERATED ALWAYS AS IDENTITY, "
            "note text, label text GENERATED ALWAYS AS (upper(note)) STORED)"))
    error = describe(failing(engine, sql))
    assert (error.kind, error.sqlstate, error.column) == ("generated_always", "428C9", column)
    assert str(error) == (f'generated_always: GeneratedAlways (SQLSTATE 428C9): cannot insert a '
                          f'non-DEFAULT value into column "{column}" [column {column}]')
    assert "PRIVATE" not in str(error) and "424242" not in str(error)


def test_a_trigger_quoting_a_row_is_summarised_without_it(engine):
    exc = failing(engine, "DO $$ BEGIN RAISE EXCEPTION 'note: %', 'PRIVATE'; END $$")
    assert "PRIVATE" in str(exc)  # what psycopg and SQLAlchemy would have printed
    assert "PRIVATE" not in error_summary(exc)
    assert transient_error_kind(exc) is None


def test_a_killed_session_is_a_transient_connection_loss(engine):
    with pytest.raises(sa.exc.DBAPIError) as raised:
        with engine.connect() as conn:
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            with engine.connect() as other:
                other.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
            conn.execute(sa.text("SELECT 1"))
    error = describe(raised.value)
    assert error.kind == "connection_lost" and error.transient
    assert transient_error_kind(raised.value) in ("admin_shutdown", "connection_lost")


def test_an_unreachable_server_is_a_transient_connection_loss(db_url):
    unreachable = create_engine(db_url.set(query={"host": "/nonexistent-socket-dir"}))
    with pytest.raises(sa.exc.OperationalError) as refused:
        unreachable.connect()
    assert transient_error_kind(refused.value) == "connection_lost"


def test_the_cores_own_errors_say_whether_a_retry_may_help(db_url, engine):
    unreachable = create_engine(db_url.set(query={"host": "/nonexistent-socket-dir"}))
    cutoff = dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc)
    with pytest.raises(ConnectError) as no_session:
        purge_rows(unreachable, cutoff, batch_size=100, max_run_duration=dt.timedelta(minutes=1))
    with pytest.raises(BacklogError) as no_backlog:
        measure_backlog(unreachable, GUEST_FAVORITES, cutoff)
    for raised in (no_session.value, no_backlog.value):
        assert isinstance(raised, RetentionError) and raised.transient
        assert transient_error_kind(raised) == "connection_lost"
    # A failure that would repeat on retry: the table is gone (the database is this test's).
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE favorites.favorites"))
    with pytest.raises(BacklogError) as missing:
        measure_backlog(engine, GUEST_FAVORITES, cutoff)
    assert missing.value.kind == "undefined_table" and not missing.value.transient
    assert transient_error_kind(missing.value) is None


def test_the_engines_hide_bound_parameters_in_errors(engine):
    with pytest.raises(sa.exc.DBAPIError) as raised:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT CAST(:v AS uuid)"), {"v": "PRIVATE-not-a-uuid"})
    # The server quotes the bad value in its message; the parameters SQLAlchemy would append
    # are hidden, and the description keeps neither (22P02 is not a fixed-template kind).
    assert "SQL parameters hidden" in str(raised.value)
    assert "PRIVATE" not in str(describe(raised.value))
    assert "PRIVATE" not in error_summary(raised.value)
