"""Shared tools of the reliability tests: real Dagster runs, slow batches, backend sessions."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import (
    create_partitioned_dev_schema,
    dev_favorites,
    drop_dev_schema,
)
from favorites_maintenance.retention.database import APPLICATION_NAME
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.clock import CUTOFF, FRESH, OLD, PARTITION
from favorites_maintenance_tests.helpers.drop_phase import BOUNDS
from favorites_maintenance_tests.helpers.jobs import (
    error_text,
    guest_settings_env,
    materialization,
    run_job,
    step_failure,
)

# Re-exported: the reliability tests import them from here.
__all__ = ["CUTOFF", "FRESH", "OLD", "PARTITION", "error_text", "materialization", "run_job",
           "step_failure"]

UTC = dt.timezone.utc
#: Private values the job must never print (an anonymous id, a note).
SENTINEL_ANON = "5e171ae1-dead-4bee-8000-5e171ae15e17"
SENTINEL_NOTE = "SENTINEL-NOTE-do-not-log-7c1a"


def everything_dagster_recorded(instance, run_id: str) -> str:
    """All text of a run's event log: messages, event payloads, errors and metadata values."""
    parts = []
    for entry in instance.all_logs(run_id):
        parts.append(entry.user_message or "")
        parts.append(entry.message or "")
        event = entry.dagster_event
        if event is None:
            continue
        parts.append(repr(event))
        data = event.event_specific_data
        if getattr(data, "error", None) is not None:
            parts.append(error_text(data.error))
        for attr in ("materialization", "asset_observation"):
            obj = getattr(data, attr, None)
            if obj is not None:
                parts.extend(f"{k}={v.value!r}" for k, v in obj.metadata.items())
    return "\n".join(parts)


def our_backends(engine, *, state: str | None = None) -> list[int]:
    """pids of the job's sessions (``application_name`` = favorites-maintenance)."""
    sql = ("SELECT pid FROM pg_stat_activity WHERE application_name = :app "
           "AND pid <> pg_backend_pid()")
    if state:
        sql += " AND state = :state"
    with engine.connect() as conn:
        return list(conn.execute(sa.text(sql), {"app": APPLICATION_NAME, "state": state})
                    .scalars())


def sleeping_backend(engine, timeout: float = 30.0) -> int:
    """Wait until one of the job's sessions sleeps inside a batch (see ``slow_delete``)."""
    deadline = time.monotonic() + timeout
    sql = sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :app "
                  "AND wait_event = 'PgSleep'")
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            pid = conn.execute(sql, {"app": APPLICATION_NAME}).scalar()
        if pid:
            return pid
        time.sleep(0.02)
    raise AssertionError("no batch of the job reached the slow row")


@contextlib.contextmanager
def slow_delete(engine, *, note: str = "SLOW", seconds: float = 30.0, once: bool = False):
    """Make a batch hang ``seconds`` inside its DELETE when it reaches a row whose note is
    ``note`` (a trigger of the test table, dropped on exit): a deterministic "mid-batch".

    With ``once``, only the first batch to reach the row hangs (a sequence counts, and sequences
    ignore rollbacks): a retry of the killed batch then goes through."""
    sleep = f"PERFORM pg_sleep({seconds});"
    with engine.begin() as conn:
        if once:
            conn.execute(sa.text("CREATE SEQUENCE IF NOT EXISTS favorites.slow_once"))
            conn.execute(sa.text("SELECT setval('favorites.slow_once', 1, false)"))
            sleep = f"IF nextval('favorites.slow_once') = 1 THEN {sleep} END IF;"
        conn.execute(sa.text(f"""
            CREATE OR REPLACE FUNCTION favorites.slow_delete() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                IF OLD.note = '{note}' THEN {sleep} END IF;
                RETURN OLD;
            END $$"""))
        conn.execute(sa.text(
            "CREATE TRIGGER slow_delete BEFORE DELETE ON favorites.favorites "
            "FOR EACH ROW EXECUTE FUNCTION favorites.slow_delete()"))
    try:
        yield
    finally:
        drop_slow_delete(engine)


def delete_trigger(engine, name: str, body: str, *, when: str = "BEFORE",
                   each: str = "ROW") -> None:
    """A PL/pgSQL trigger ``name`` on DELETE of the test table, running ``body`` (the function
    of the same name, in schema ``favorites``). A literal ``%`` in ``body`` is written ``%%``."""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"""
            CREATE FUNCTION favorites.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                {body}
            END $$;
            CREATE TRIGGER {name} {when} DELETE ON favorites.favorites
                FOR EACH {each} EXECUTE FUNCTION favorites.{name}();""")


def mark_slow(engine, offset: int) -> None:
    """Give the row at ``offset`` in batch order (``updated_at, id``) the note ``SLOW``."""
    with engine.begin() as conn:
        conn.execute(sa.update(dev_favorites).values(note="SLOW").where(
            dev_favorites.c.id == sa.select(dev_favorites.c.id)
            .order_by(dev_favorites.c.updated_at, dev_favorites.c.id)
            .offset(offset).limit(1).scalar_subquery()))


def drop_slow_delete(engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TRIGGER IF EXISTS slow_delete ON favorites.favorites"))


def in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, list]:
    """Start ``fn`` in a thread; the list receives its result or its exception."""
    out: list = []

    def target():
        try:
            out.append(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def all_logs(caplog):
    """Capture every Python log record, DEBUG included, of every logger."""
    caplog.set_level(logging.DEBUG)
    for name in ("sqlalchemy", "psycopg", "dagster", "favorites_maintenance"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    return caplog


class Roles:
    """Login roles on the test server, each dropped (with its privileges) after the test."""

    def __init__(self, db_url, engine):
        self.db_url = sa.make_url(db_url)
        self.engine = engine
        self.created: list[str] = []

    def name(self, suffix: str) -> str:
        return f"{self.db_url.database}_{suffix}"

    def create(self, suffix: str, *statements: str, password: str | None = None,
               least_privilege: bool = False, rule=None) -> sa.URL:
        """Create role ``<db>_<suffix>``: by the shipped SQL rendered for ``rule`` (default:
        the dev table's guest-favorites rule) when ``least_privilege``, else ``CREATE ROLE ...
        LOGIN`` plus ``statements`` (``{role}`` is the quoted name). Returns the URL to connect
        as it (trust authentication: the password is carried, not checked)."""
        from favorites_maintenance.local.guest_favorites import GUEST_FAVORITES
        from favorites_maintenance.retention.least_privilege import apply_least_privilege

        role = self.name(suffix)
        self.created.append(role)
        if least_privilege:
            apply_least_privilege(self.engine, role, rule or GUEST_FAVORITES, password=password)
        else:
            with self.engine.begin() as conn:
                conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
                for stmt in statements:
                    conn.exec_driver_sql(stmt.format(role=f'"{role}"'))
        return self.db_url.set(username=role, password=password)

    def drop_all(self) -> None:
        with self.engine.begin() as conn:
            for role in self.created:
                conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                     "WHERE usename = :r"), {"r": role})
                conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
                conn.exec_driver_sql(f'DROP ROLE "{role}"')


@pytest.fixture
def roles(db_url, engine):
    made = Roles(db_url, engine)
    yield made
    made.drop_all()


@pytest.fixture
def table(db_url, engine, monkeypatch):
    """The test database's favorites table, partitioned by month (``BOUNDS`` of
    ``helpers/drop_phase.py``, the drop phase's tests); the code location's variables.
    ``test_partman.py`` has a ``table`` of its own."""
    drop_dev_schema(engine)
    create_partitioned_dev_schema(engine, BOUNDS)
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    return engine
