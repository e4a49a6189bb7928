"""A real PgBouncer (Debian package ``pgbouncer``) in front of the embedded PostgreSQL server.

:class:`PgBouncer` writes its ini and auth file in a temporary folder, starts ``pgbouncer`` as a
subprocess listening on a free port of 127.0.0.1, waits until it accepts connections, and stops
it by its pid. PgBouncer refuses to run as root: when the tests run as root it is started with
``-u`` as the OS user that owns the server's data folder (the embedded server runs as that user,
so its Unix socket is reachable).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import sqlalchemy as sa

from favorites_maintenance_tests.dev_stack import free_port
from favorites_maintenance_tests.system_packages import missing, stop_process

INSTALL_HINT = "apt-get install -y pgbouncer"


def pgbouncer_binary() -> str | None:
    """Path of the ``pgbouncer`` executable (``/usr/sbin`` is often not on a user's PATH)."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/bin")


def require_pgbouncer() -> str:
    """The ``pgbouncer`` executable; without it skip the test, or fail it when ``CI=true``."""
    binary = pgbouncer_binary()
    if binary is None:
        missing(f"pgbouncer is not installed ({INSTALL_HINT})")
    return binary


class PgBouncer:
    """One PgBouncer process serving ``database`` of ``pg_server``.

    Args:
        binary: the ``pgbouncer`` executable (see :func:`require_pgbouncer`).
        pg_server: the started :class:`~favorites_maintenance.embedded.EmbeddedPostgres`.
        database: name of the database served, on the server and through the pooler.
        pool_mode: ``transaction`` (a server connection per transaction) or ``session``.
        pool_size: server connections of the pool, at most (``default_pool_size`` and
            ``max_db_connections``; no reserve pool).
        settings: further ``[pgbouncer]`` settings, written as given.

    Clients connect as ``postgres`` with ``auth_type = trust`` (the name must be in the auth
    file; no password is checked) to :attr:`url`.
    """

    def __init__(self, binary: str, pg_server, database: str, *, pool_mode: str = "transaction",
                 pool_size: int = 4, settings: dict[str, object] | None = None):
        self.binary = binary
        self.pg_server = pg_server
        self.database = database
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.settings = dict(settings or {})
        self.port: int | None = None
        self.folder: Path | None = None
        self._proc: subprocess.Popen | None = None
        self._log = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def url(self) -> sa.URL:
        """SQLAlchemy URL of the database through the pooler (psycopg 3 driver)."""
        return sa.URL.create("postgresql+psycopg", username="postgres", host="127.0.0.1",
                             port=self.port, database=self.database)

    def conninfo(self, **params) -> str:
        """libpq connection string of the database through the pooler."""
        return psycopg.conninfo.make_conninfo(host="127.0.0.1", port=self.port,
                                              dbname=self.database, user="postgres", **params)

    def log_text(self) -> str:
        """What PgBouncer has logged so far (its stderr)."""
        if self.folder is None or not (self.folder / "pgbouncer.log").exists():
            return ""
        return (self.folder / "pgbouncer.log").read_text(errors="replace")

    def start(self, timeout: float = 10.0) -> "PgBouncer":
        """Write the configuration, start PgBouncer, wait until it serves the database.

        Raises:
            RuntimeError: PgBouncer exited, or did not accept a connection within ``timeout``
                seconds; the message ends with its log.
        """
        owner = self._server_os_user()
        attempts = 3  # another process may take the free port before PgBouncer binds it
        while True:
            attempts -= 1
            self.folder = Path(tempfile.mkdtemp(prefix="favorites-pgbouncer-"))
            self.port = free_port()
            try:
                ini = self._write_config(owner)
                args = [self.binary, str(ini)]
                if os.geteuid() == 0:
                    args[1:1] = ["-u", owner.pw_name]
                self._log = open(self.folder / "pgbouncer.log", "ab")
                self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                              stderr=subprocess.STDOUT, cwd=self.folder)
                self._wait_until_serving(timeout)
                return self
            except RuntimeError:
                port_taken = "Address already in use" in self.log_text()
                self.stop()
                if not port_taken or not attempts:
                    raise
            except BaseException:
                self.stop()
                raise

    def stop(self, timeout: float = 10.0) -> None:
        """Stop PgBouncer by its pid (SIGTERM, then SIGKILL after ``timeout`` seconds) and
        remove its folder; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, timeout)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def __enter__(self) -> "PgBouncer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _server_os_user(self) -> pwd.struct_passwd:
        # The embedded server runs as the owner of its data folder (another user than root).
        return pwd.getpwuid(self.pg_server.pgdata.stat().st_uid)

    def _server_port(self) -> int:
        # The server listens on a Unix socket only; its name carries the port.
        engine = sa.create_engine(self.pg_server.url("postgres"))
        try:
            with engine.connect() as conn:
                return int(conn.execute(sa.text("SELECT current_setting('port')")).scalar_one())
        finally:
            engine.dispose()

    def _write_config(self, owner: pwd.struct_passwd) -> Path:
        auth = self.folder / "userlist.txt"
        auth.write_text('"postgres" ""\n')
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": self.port,
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": auth,
            "pool_mode": self.pool_mode,
            "default_pool_size": self.pool_size,
            "max_db_connections": self.pool_size,
            "min_pool_size": 0,
            "reserve_pool_size": 0,
            "max_client_conn": 100,
            # A client queued for a server connection gets an error instead of a long hang.
            "query_wait_timeout": 10,
            **self.settings,
        }
        ini = self.folder / "pgbouncer.ini"
        lines = ["[databases]",
                 f"{self.database} = host={self.pg_server.socket_dir} "
                 f"port={self._server_port()} dbname={self.database}",
                 "", "[pgbouncer]", *(f"{k} = {v}" for k, v in settings.items())]
        ini.write_text("\n".join(lines) + "\n")
        if os.geteuid() == 0:
            for path in (self.folder, auth, ini):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        return ini

    def _wait_until_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with code {self._proc.returncode}:\n"
                                   f"{self.log_text()}")
            try:
                with psycopg.connect(self.conninfo(connect_timeout=2)) as conn:
                    conn.execute("SELECT 1")
                if self._proc.poll() is None:  # ours answered, not another on a taken port
                    return
            except psycopg.OperationalError as exc:
                last = exc
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not accept a connection on 127.0.0.1:{self.port} "
                           f"within {timeout} s ({last}):\n{self.log_text()}")
