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
from pathlib import Path

import psycopg
import sqlalchemy as sa

from favorites_maintenance.local.processes import Probe
from favorites_maintenance_tests.helpers.system_packages import ServerProcess, require_program

INSTALL_HINT = "apt-get install -y pgbouncer"


def require_pgbouncer() -> str:
    """The ``pgbouncer`` executable; without it skip the test, or fail it when ``CI=true``."""
    return require_program("pgbouncer", INSTALL_HINT)


class PgBouncer(ServerProcess):
    """One PgBouncer process serving ``database`` of ``pg_server``.

    Args:
        binary: the ``pgbouncer`` executable (see :func:`require_pgbouncer`).
        pg_server: the started :class:`~favorites_maintenance.local.embedded.EmbeddedPostgres`.
        database: name of the database served, on the server and through the pooler.
        pool_mode: ``transaction`` (a server connection per transaction) or ``session``.
        pool_size: server connections of the pool, at most (``default_pool_size`` and
            ``max_db_connections``; no reserve pool).
        settings: further ``[pgbouncer]`` settings, written as given.

    Clients connect as ``postgres`` with ``auth_type = trust`` (the name must be in the auth
    file; no password is checked) to :attr:`url`.
    """

    name = "pgbouncer"

    def __init__(self, binary: str, pg_server, database: str, *, pool_mode: str = "transaction",
                 pool_size: int = 4, settings: dict[str, object] | None = None):
        super().__init__(binary)
        self.pg_server = pg_server
        self.database = database
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.settings = dict(settings or {})

    @property
    def url(self) -> sa.URL:
        """SQLAlchemy URL of the database through the pooler (psycopg 3 driver)."""
        return sa.URL.create("postgresql+psycopg", username="postgres", host="127.0.0.1",
                             port=self.port, database=self.database)

    def conninfo(self, **params) -> str:
        """libpq connection string of the database through the pooler."""
        return psycopg.conninfo.make_conninfo(host="127.0.0.1", port=self.port,
                                              dbname=self.database, user="postgres", **params)

    def _command(self) -> list[str]:
        owner = self._server_os_user()
        args = [self.binary, str(self._write_config(owner))]
        if os.geteuid() == 0:
            args[1:1] = ["-u", owner.pw_name]
        return args

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

    def _probe(self) -> Probe:
        def accepts_a_query() -> bool:
            with psycopg.connect(self.conninfo(connect_timeout=2)) as conn:
                conn.execute("SELECT 1")
            return True
        accepts_a_query.__doc__ = f"a query through pgbouncer on 127.0.0.1:{self.port}"
        return accepts_a_query
