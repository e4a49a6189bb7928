"""Dagster's own storage failing for a moment never tears the batch loop or loses the count.

The purge reads the run's status once a second (a stop request) and logs its progress to the
run's event log, both in Dagster's storage, a PostgreSQL database of its own. While that
database refuses connections (or its runs table is away), a status read counts as "no stop
requested" and a log line goes to the process log: the purge goes on, and ``deletedTotal``
is every row it deleted.
"""

from __future__ import annotations

import threading
import time

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance_tests.reliability.conftest import (
    OLD,
    delete_trigger,
    materialization,
    run_job,
)

PRUNABLE = 3000
BATCH_SIZE = 10
#: How long each kind of outage lasts, in seconds. dagster-postgres retries a refused
#: connection for about 6 s (0.2 s doubled five times) before it raises: a refusal only reaches
#: the op when it lasts longer.
OUTAGE_S = {"refuses-connections": 15.0, "runs-table-missing": 4.0}


def slow_batches(engine, seconds: float) -> None:
    """Every DELETE statement takes ``seconds`` longer, so the purge outlasts the outage."""
    delete_trigger(engine, "slow_statement", f"PERFORM pg_sleep({seconds}); RETURN NULL;",
                   when="AFTER", each="STATEMENT")


class Outage:
    """Break Dagster's storage for ``OUTAGE_S[kind]`` seconds once ``after_rows`` rows are deleted."""

    def __init__(self, admin: sa.Engine, favorites: sa.Engine, storage_db: str, kind: str,
                 after_rows: int):
        self.admin, self.favorites, self.storage_db = admin, favorites, storage_db
        self.kind, self.after_rows = kind, after_rows
        self.began_at_remaining: int | None = None
        self.ended_at_remaining: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _remaining(self) -> int:
        with self.favorites.connect() as conn:
            return conn.exec_driver_sql("SELECT count(*) FROM favorites.favorites").scalar_one()

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        while self._remaining() > PRUNABLE - self.after_rows:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        self.began_at_remaining = self._remaining()
        self._break()
        time.sleep(OUTAGE_S[self.kind])
        self._repair()
        self.ended_at_remaining = self._remaining()

    def _break(self) -> None:
        if self.kind == "refuses-connections":
            with self.admin.connect() as conn:
                conn.exec_driver_sql(
                    f'ALTER DATABASE "{self.storage_db}" WITH ALLOW_CONNECTIONS false')
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{self.storage_db}'")
        else:
            with self._storage().begin() as conn:
                conn.exec_driver_sql("ALTER TABLE runs RENAME TO runs_away")

    def _repair(self) -> None:
        if self.kind == "refuses-connections":
            with self.admin.connect() as conn:
                conn.exec_driver_sql(
                    f'ALTER DATABASE "{self.storage_db}" WITH ALLOW_CONNECTIONS true')
        else:
            with self._storage().begin() as conn:
                conn.exec_driver_sql("ALTER TABLE runs_away RENAME TO runs")

    def _storage(self) -> sa.Engine:
        return sa.create_engine(self.admin.url.set(database=self.storage_db),
                                poolclass=sa.pool.NullPool)


@pytest.mark.parametrize("kind", ["refuses-connections", "runs-table-missing"])
def test_a_storage_outage_mid_purge_loses_no_row_from_the_count(
        pg_server, db_url, engine, rows, monkeypatch, kind, caplog):
    rows.add_many(PRUNABLE, updated_at=OLD)
    accounts = set(rows.add_many(20, updated_at=OLD, user_id=1))
    slow_batches(engine, 0.04)
    storage_db = f"dagster_{sa.make_url(db_url).database}"
    storage = pg_server.ensure_database(storage_db).set(drivername="postgresql+psycopg2")
    admin = sa.create_engine(pg_server.url("postgres"), isolation_level="AUTOCOMMIT")
    overrides = {"storage": {"postgres": {
        "postgres_url": storage.render_as_string(hide_password=False)}}}
    try:
        with dg.instance_for_test(overrides=overrides) as instance:
            outage = Outage(admin, engine, storage_db, kind, after_rows=50 * BATCH_SIZE)
            outage.thread.start()
            result = run_job(db_url, instance, monkeypatch=monkeypatch, batch_size=BATCH_SIZE)
            outage.thread.join(30)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{storage_db}" WITH ALLOW_CONNECTIONS true')
        admin.dispose()

    # The outage really fell in the middle of the purge.
    assert outage.began_at_remaining is not None and outage.ended_at_remaining is not None
    assert PRUNABLE - outage.began_at_remaining < 1000
    assert outage.ended_at_remaining > 0
    assert result.success
    meta = materialization(result)
    assert meta["deletedTotal"] == PRUNABLE
    assert meta["batches"] == PRUNABLE // BATCH_SIZE
    assert rows.ids() == accounts
    # The process log says what happened, naming Dagster's storage.
    assert any("Dagster's storage" in r.getMessage() for r in caplog.records)
