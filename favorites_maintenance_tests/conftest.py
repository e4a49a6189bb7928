"""Fixtures: one embedded PostgreSQL server for the session, a fresh database per test."""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import os
import tempfile
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.embedded import EmbeddedPostgres
from favorites_maintenance.local.guest_favorites import create_dev_schema, dev_favorites
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance_tests.helpers.migration_scripts import read_migration_scripts_once

UTC = dt.timezone.utc
_counter = itertools.count()


def pytest_configure(config):
    """Each test process (every xdist worker too) reads Dagster's storage migrations once,
    not once per Dagster instance it opens (``helpers/migration_scripts.py``)."""
    read_migration_scripts_once()


@pytest.fixture(scope="session")
def pg_server():
    """The embedded server, in a temporary folder deleted at the end of the session."""
    root = Path(tempfile.mkdtemp(prefix="favorites-tests-"))
    os.chmod(root, 0o755)  # the server runs as another OS user when the tests run as root
    server = EmbeddedPostgres(root / "pgdata", delete_on_exit=True).start()
    yield server
    server.stop()


@pytest.fixture
def db_url(pg_server):
    """URL of a new, empty database holding the dev table and the recommended index."""
    name = f"t{os.getpid()}_{next(_counter)}"
    url = pg_server.ensure_database(name)
    engine = create_engine(url)
    create_dev_schema(engine)
    engine.dispose()
    yield url
    pg_server.drop_database(name)


@pytest.fixture
def dagster_storage_url(pg_server) -> str:
    """``postgresql+psycopg2://`` URL of a new database for a Dagster instance's storage."""
    name = f"dagster{os.getpid()}_{next(_counter)}"
    url = pg_server.ensure_database(name)
    yield url.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    pg_server.drop_database(name)


@pytest.fixture
def engine(db_url):
    """An engine on the per-test database, disposed after the test."""
    eng = create_engine(db_url)
    yield eng
    eng.dispose()


class Rows:
    """Insert and inspect rows of the dev table by readable names."""

    def __init__(self, engine: sa.Engine):
        self.engine = engine

    def add(self, *, updated_at: dt.datetime, user_id: int | None = None,
            note: str | None = None, anonymous_id: str | None = None) -> int:
        """Insert one row; guest rows get an anonymous id. Returns its id."""
        if user_id is None and anonymous_id is None:
            anonymous_id = "00000000-0000-4000-8000-000000000001"
        with self.engine.begin() as conn:
            return conn.execute(
                sa.insert(dev_favorites).returning(dev_favorites.c.id),
                {"user_id": user_id, "anonymous_id": anonymous_id, "item_id": 1,
                 "note": note, "created_at": updated_at, "updated_at": updated_at},
            ).scalar_one()

    def add_many(self, n: int, *, updated_at: dt.datetime, user_id: int | None = None,
                 step: dt.timedelta = dt.timedelta(seconds=1)) -> list[int]:
        """Insert ``n`` rows whose ``updated_at`` grows by ``step`` from ``updated_at``."""
        anon = None if user_id is not None else "00000000-0000-4000-8000-000000000002"
        params = [{"user_id": user_id, "anonymous_id": anon, "item_id": i, "note": None,
                   "created_at": updated_at + i * step, "updated_at": updated_at + i * step}
                  for i in range(n)]
        with self.engine.begin() as conn:
            conn.execute(sa.insert(dev_favorites), params)
            return list(conn.execute(sa.select(dev_favorites.c.id)
                                     .order_by(dev_favorites.c.id.desc()).limit(n)).scalars())

    def ids(self) -> set[int]:
        """Ids of every row still present."""
        with self.engine.connect() as conn:
            return set(conn.execute(sa.select(dev_favorites.c.id)).scalars())

    def count(self, where=None) -> int:
        stmt = sa.select(sa.func.count()).select_from(dev_favorites)
        if where is not None:
            stmt = stmt.where(where)
        with self.engine.connect() as conn:
            return conn.execute(stmt).scalar_one()

    def accounts(self) -> int:
        """Rows with ``user_id IS NOT NULL``."""
        return self.count(dev_favorites.c.user_id.is_not(None))


@pytest.fixture
def rows(engine) -> Rows:
    return Rows(engine)


@contextlib.contextmanager
def slow_batches(engine, seconds: float, *, per_row: bool = False):
    """Every batch's DELETE takes at least ``seconds`` (a statement-level BEFORE DELETE trigger
    that sleeps, dropped on exit): the time budget runs out during the first batch, for real.
    With ``per_row``, every deleted row takes at least ``seconds`` instead (a row-level one):
    a batch costs in proportion to its rows, as a table with a heavy trigger does."""
    level = "ROW" if per_row else "STATEMENT"
    with engine.begin() as conn:
        # A row-level BEFORE trigger returning NULL would skip the row: it returns OLD.
        conn.execute(sa.text(
            "CREATE FUNCTION favorites.slow_batch() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN PERFORM pg_sleep({seconds}); RETURN OLD; END $$"))
        conn.execute(sa.text(
            "CREATE TRIGGER slow_batch BEFORE DELETE ON favorites.favorites "
            f"FOR EACH {level} EXECUTE FUNCTION favorites.slow_batch()"))
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TRIGGER IF EXISTS slow_batch ON favorites.favorites"))
            conn.execute(sa.text("DROP FUNCTION IF EXISTS favorites.slow_batch()"))


#: The VACUUM running on the test table, if any: one row (its pid) or none.
VACUUM_PROGRESS = sa.text("""
    SELECT pid FROM pg_stat_progress_vacuum
     WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND relid = 'favorites.favorites'::regclass""")


@pytest.fixture
def slow_vacuum(db_url, engine):
    """A manual VACUUM of the table that runs until the test ends it (a cost delay on every
    page of a few MB of account rows), on a connection of its own; yields ``start()`` and
    ``end()``, which cancels it and waits for it."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO favorites.favorites (user_id, item_id, note) "
            "SELECT 99, g, repeat('b', 1000) FROM generate_series(1, 5000) g"))
    vacuum_engine = create_engine(db_url)
    pid: list[int] = []

    def run():
        with vacuum_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            pid.append(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
            conn.execute(sa.text("SET vacuum_cost_limit = 1"))
            conn.execute(sa.text("SET vacuum_cost_delay = 100"))
            try:
                conn.execute(sa.text(
                    "VACUUM (DISABLE_PAGE_SKIPPING, INDEX_CLEANUP ON) favorites.favorites"))
            except sa.exc.DBAPIError:
                pass  # canceled by end()

    thread = threading.Thread(target=run, daemon=True)

    def end():
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_cancel_backend(:p)"), {"p": pid[0]})
        thread.join(30)
        assert not thread.is_alive()

    def start():
        thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                if conn.execute(VACUUM_PROGRESS).first():
                    return
            time.sleep(0.05)
        raise AssertionError("the VACUUM never showed in pg_stat_progress_vacuum")

    yield start, end
    if thread.is_alive():
        end()
    vacuum_engine.dispose()
