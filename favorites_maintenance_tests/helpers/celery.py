"""A real Redis (Debian's ``redis-server``) and Celery workers of ``dagster-celery``, for the
tests that run a job on Dagster's Celery executor: each started on this host, on a free port or
under a name of its own, and stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from favorites_maintenance.local.processes import Probe, Process
from favorites_maintenance_tests.helpers.system_packages import ServerProcess, require_program

#: The folder the test modules are imported from: the workers import the job from there.
REPOSITORY = Path(__file__).resolve().parents[2]


def require_redis() -> str:
    """Path of ``redis-server``; without it skip the test, or fail it when ``CI=true``."""
    return require_program("redis-server", "apt-get install redis-server")


class RedisServer(ServerProcess):
    """One ``redis-server`` on 127.0.0.1, keeping nothing on disk.

    Args:
        binary: the ``redis-server`` executable (see :func:`require_redis`).
    """

    name = "redis"

    def url(self, db: int = 0) -> str:
        """``redis://127.0.0.1:PORT/DB``."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def _command(self) -> list[str]:
        return [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.folder)]

    def _probe(self) -> Probe:
        return self.port


@contextlib.contextmanager
def celery_workers(names: list[str], *, broker: str, backend: str,
                   timeout: float = 60.0) -> Iterator[dict[str, Process]]:
    """One Celery worker of ``dagster_celery.app`` per name, each consuming Dagster's queue
    (``dagster``) one task at a time in its own process (``--pool solo``), with this process's
    environment (the job's variables) and the broker and result backend given; yields node name
    (``<name>@<host>``) -> its process once every worker is ready, and stops each by its pid."""
    config = Path(tempfile.mkdtemp(prefix="favorites-celery-"))
    # dagster_celery's app reads its settings from this module when it can import it.
    (config / "dagster_celery_config.py").write_text(
        f"broker_url = {broker!r}\nresult_backend = {backend!r}\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(config), str(REPOSITORY), env.get("PYTHONPATH", "")) if p)
    host = os.uname().nodename
    workers: dict[str, Process] = {}
    try:
        for name in names:
            node = f"{name}@{host}"
            workers[node] = Process.start(
                [sys.executable, "-m", "celery", "-A", "dagster_celery.app", "worker",
                 "-n", node, "--pool", "solo", "--prefetch-multiplier=1", "-Q", "dagster",
                 "--loglevel", "INFO", "--without-gossip", "--without-mingle"],
                log=config / f"{name}.log", name=f"celery worker {name}", cwd=REPOSITORY,
                env=env)
        for node, worker in workers.items():
            def ready(worker=worker) -> bool:
                """the worker's "ready." line"""
                return " ready." in worker.log_text()
            worker.wait_until_ready(ready, timeout)
        yield workers
    finally:
        for worker in workers.values():
            worker.stop()
        shutil.rmtree(config, ignore_errors=True)
