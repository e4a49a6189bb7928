"""The bench's own embedded PostgreSQL server and what the bench asks of it as administrator:
databases created, restored from a template and dropped, WAL positions, the top statements."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL


@contextmanager
def engine_on(url: URL | str) -> Iterator[sa.Engine]:
    """An engine on ``url``, made by the factory the job uses, disposed on the way out."""
    from favorites_maintenance.retention.database import create_engine

    engine = create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def drop_database(conn: sa.Connection, db: str) -> None:
    """Drop database ``db`` if it exists, ending its sessions (``conn`` in autocommit)."""
    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


class BenchServer:
    """Admin helpers on the embedded server (``postgres`` database, autocommit)."""

    def __init__(self, server):
        self.server = server
        self.admin = sa.create_engine(server.url("postgres"), isolation_level="AUTOCOMMIT")

    def url(self, db: str) -> URL:
        return self.server.url(db)

    def scalar(self, sql: str, **params):
        with self.admin.connect() as conn:
            return conn.execute(sa.text(sql), params).scalar()

    def execute(self, sql: str, **params) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(sql), params)

    def drop(self, db: str) -> None:
        with self.admin.connect() as conn:
            drop_database(conn, db)

    def restore(self, template: str, db: str) -> None:
        self.drop(db)
        self.execute(f'CREATE DATABASE "{db}" TEMPLATE "{template}" STRATEGY FILE_COPY')
        self.execute("CHECKPOINT")

    def lsn(self) -> str:
        return self.scalar("SELECT pg_current_wal_lsn()::text")

    def wal_diff(self, a: str, b: str) -> int:
        return int(self.scalar("SELECT pg_wal_lsn_diff(CAST(:b AS pg_lsn), CAST(:a AS pg_lsn))",
                               a=a, b=b))

    def preloads_pg_stat_statements(self) -> bool:
        loaded = self.scalar("SELECT current_setting('shared_preload_libraries')") or ""
        return "pg_stat_statements" in loaded

    def has_pg_stat_statements(self) -> bool:
        if not self.preloads_pg_stat_statements():
            return False
        self.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return True

    def top_statements(self, db: str, limit: int = 4) -> list[dict]:
        with self.admin.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query, calls, "
                "round(total_exec_time::numeric, 1) AS total_ms, "
                "round(mean_exec_time::numeric, 3) AS mean_ms, rows, "
                "shared_blks_hit, shared_blks_read, shared_blks_dirtied, wal_bytes::bigint "
                "FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
                "WHERE d.datname = :db AND query NOT LIKE 'INSERT INTO favorites.favorites (%' "
                "AND query NOT LIKE 'UPDATE favorites.favorites SET updated_at = now()%' "
                "ORDER BY total_exec_time DESC LIMIT :limit"), {"db": db, "limit": limit})
            return [{k: (float(v) if hasattr(v, "as_tuple") else v)
                     for k, v in r._mapping.items()} for r in rows]

    def dispose(self) -> None:
        self.admin.dispose()


def start_server(pgdata: Path):
    """Start the bench's own embedded server on ``pgdata`` with ``pg_stat_statements`` loaded
    (a restart on first use), and return it."""
    from favorites_maintenance.local.embedded import EmbeddedPostgres

    pgdata = Path(pgdata).resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # The server runs as an unprivileged user when we are root: it must reach pgdata. Only add
    # read and search bits: the parent may be a shared folder such as /tmp (sticky, writable).
    os.chmod(pgdata.parent, pgdata.parent.stat().st_mode & 0o7777 | 0o055)
    server = EmbeddedPostgres(pgdata).start()
    srv = BenchServer(server)
    try:
        if not srv.preloads_pg_stat_statements():
            srv.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            srv.dispose()
            server.stop()
            server = EmbeddedPostgres(pgdata).start()
    finally:
        srv.dispose()
    return server
