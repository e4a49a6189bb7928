"""The cleanup job through a real PgBouncer in transaction mode, its pool kept busy by others.

Behind a transaction pooler consecutive transactions of one client connection may run on
different server connections: nothing may outlive a transaction on the server (a server-side
prepared statement, a plain ``SET``, a session lock). Three other clients loop short
transactions through the same pool while the job deletes 3,000 rows in 30 batches, so the job's
transactions land on different server connections, or on ones the other clients used between
them.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import dagster as dg
import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from favorites_maintenance.cli import main
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.pgbouncer import PgBouncer, require_pgbouncer
from favorites_maintenance_tests.helpers.jobs import (
    ASSET_KEY, TEST_PARTITIONS_START, failure_text, guest_variable, load_code_location)
from favorites_maintenance_tests.reliability.conftest import (
    OLD, PARTITION, materialization, run_job)

UTC = dt.timezone.utc
PRUNABLE = 3000
BATCH_SIZE = 100
BUSY_CLIENTS = 3
#: Neither prunable for PARTITION nor overdue for the freshness check on the day the test runs.
RECENT = dt.datetime.now(UTC) - dt.timedelta(days=30)
#: Upper bound of the busy clients' life, should the test never stop them.
BUSY_LIMIT_S = 60.0
#: The freshness SLO check of the guest-favorites asset (a public name).
FRESHNESS_CHECK = dg.AssetCheckKey(ASSET_KEY, "no_guest_row_older_than_retention_plus_one_day")


@pytest.fixture(params=[
    pytest.param({"pool_size": 4}, id="pool-of-4"),
    # Fewer server connections than busy clients: every transaction may queue for one.
    pytest.param({"pool_size": 2}, id="pool-of-2-behind-3-busy-clients"),
])
def pooler(request, pg_server, db_url):
    """A PgBouncer (transaction mode) serving the test's database; stopped by its pid after."""
    binary = require_pgbouncer()
    # Idle server connections are handed out oldest first, not last released first: the job's
    # consecutive transactions then change server connection even when the busy clients are
    # starved of CPU and leave both idle (a last-released-first pool would hand the job the
    # same one each time).
    bouncer = PgBouncer(binary, pg_server, sa.make_url(db_url).database,
                        settings={"server_round_robin": 1}, **request.param)
    with bouncer:
        yield bouncer


class BusyClients:
    """``n`` threads, each on its own connection through the pooler, looping short
    transactions (``SELECT pg_sleep(0.01)``) until :meth:`stop` or :data:`BUSY_LIMIT_S`."""

    def __init__(self, conninfo: str, n: int):
        self.conninfo = conninfo
        self.stop_event = threading.Event()
        self.transactions = [0] * n
        #: Server backends (pg_backend_pid()) the busy clients' transactions ran on.
        self.backends: set[int] = set()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True)
                        for i in range(n)]

    def start(self, timeout: float = 10.0) -> "BusyClients":
        """Start the threads; return once each has committed a transaction."""
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + timeout
        while not all(self.transactions) and not self.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(self.transactions), f"busy clients did not start: {self.errors}"
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        for thread in self.threads:
            if thread.is_alive():  # a test that failed before start() left them unstarted
                thread.join(timeout)

    def _loop(self, i: int) -> None:
        deadline = time.monotonic() + BUSY_LIMIT_S
        try:
            # Not the product's engine: these clients prepare nothing, whatever the job does.
            with psycopg.connect(self.conninfo, autocommit=True, prepare_threshold=None,
                                 connect_timeout=5, application_name="favorites-busy-client"
                                 ) as conn:
                while not self.stop_event.is_set() and time.monotonic() < deadline:
                    with conn.transaction():
                        self.backends.add(conn.execute(
                            "SELECT pg_backend_pid() FROM pg_sleep(0.01)").fetchone()[0])
                    self.transactions[i] += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.errors.append(exc)


@pytest.fixture
def busy_clients(pooler):
    clients = BusyClients(pooler.conninfo(), BUSY_CLIENTS)
    yield clients
    clients.stop()


def record_deleting_backends(engine) -> None:
    """Log the server backend (``pg_backend_pid()``) that deletes each row."""
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE TABLE favorites.deleted_by (pid int NOT NULL);
            CREATE FUNCTION favorites.record_deleter() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO favorites.deleted_by VALUES (pg_backend_pid());
                RETURN OLD;
            END $$;
            CREATE TRIGGER record_deleter AFTER DELETE ON favorites.favorites
                FOR EACH ROW EXECUTE FUNCTION favorites.record_deleter();""")


def deleting_backends(engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.exec_driver_sql("SELECT DISTINCT pid FROM favorites.deleted_by").scalars())


def dry_run(url: sa.URL) -> str:
    """``dry-run`` of :data:`PARTITION` through the pooler, a day of the policy whatever ran
    before (the variable of its first day set as the job's runs set it)."""
    result = CliRunner().invoke(main, ["dry-run", "--partition", PARTITION], env={
        DATABASE_URL_VAR: url.render_as_string(hide_password=False),
        guest_variable("partitions_start"): TEST_PARTITIONS_START.isoformat()})
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


def test_the_job_deletes_every_prunable_row_through_a_busy_transaction_pooler(
        pooler, busy_clients, engine, rows, monkeypatch):
    rows.add_many(PRUNABLE, updated_at=OLD)
    accounts = set(rows.add_many(200, updated_at=OLD, user_id=7))
    recent = set(rows.add_many(200, updated_at=RECENT))
    record_deleting_backends(engine)

    assert "prunable   3,000 rows" in dry_run(pooler.url)

    busy_clients.start()
    with dg.instance_for_test() as instance:
        result = run_job(pooler.url, instance, monkeypatch=monkeypatch, batch_size=BATCH_SIZE)
    busy_clients.stop()

    assert result.success, failure_text(result)
    assert rows.ids() == accounts | recent
    meta = materialization(result)
    assert meta["deletedTotal"] == PRUNABLE
    assert meta["batches"] == PRUNABLE // BATCH_SIZE
    assert meta["backlogRemaining"] == 0
    # Every asset check of the job ran in the run, through the pooler, and passed.
    checks = {e.asset_check_key: e for e in result.get_asset_check_evaluations()}
    assert set(checks) == load_code_location(
        monkeypatch=monkeypatch).resolve_asset_graph().asset_check_keys
    assert FRESHNESS_CHECK in checks
    assert all(check.passed for check in checks.values()), checks
    # The job's batches ran on server connections of the pool that other clients used between
    # them (or on several): nothing the job left on a connection could have survived there.
    deleting = deleting_backends(engine)
    assert 1 <= len(deleting) <= pooler.pool_size
    assert len(deleting) >= 2 or deleting & busy_clients.backends, (deleting,
                                                                     busy_clients.backends)
    # The pool was shared all along: the other clients kept committing, without an error.
    assert not busy_clients.errors, busy_clients.errors
    assert all(n > 1 for n in busy_clients.transactions), busy_clients.transactions

    out = dry_run(pooler.url)
    assert "prunable   0 rows" in out and f"127.0.0.1:{pooler.port}" in out
