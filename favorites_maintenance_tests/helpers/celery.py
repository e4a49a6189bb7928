"""A real Redis (Debian's ``redis-server``) and Celery workers of ``dagster-celery``, for the
tests that run a job on Dagster's Celery executor: each started on this host, on a free port or
under a name of its own, and stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
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


#: The page that says how to start a Celery worker ("On Celery"): the workers here are started
#: from its shell block, with the variables it exports and its command.
DOCS = REPOSITORY / "docs" / "dagster.md"


@dataclass(frozen=True)
class WorkerRecipe:
    """How docs/dagster.md starts a Celery worker.

    Attributes:
        variables: the variables it exports, in order.
        command: the worker's command line, split as a shell would.
    """

    variables: tuple[str, ...]
    command: tuple[str, ...]


def documented_worker(page: Path = DOCS) -> WorkerRecipe:
    """The shell block of ``page``'s "On Celery" section that starts a worker: its ``export
    NAME=value`` lines and its ``celery ...`` line.

    Raises:
        AssertionError: the section or its block is missing.
    """
    text = page.read_text()
    section = text[text.index("**On Celery.**"):]
    section = section[:section.index("\n**", 1)]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    [block] = [b for b in blocks if "celery -A" in b]
    variables, command = [], None
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            variables += [word.partition("=")[0] for word in words[1:]]
        elif words[:1] == ["celery"]:
            command = tuple(words)
    assert command, f"no celery command in the worker block of {page}"
    return WorkerRecipe(tuple(variables), command)


@contextlib.contextmanager
def celery_workers(names: list[str], *, broker: str, backend: str,
                   timeout: float = 60.0) -> Iterator[dict[str, Process]]:
    """One Celery worker of ``dagster_celery.app`` per name, started as docs/dagster.md says
    (:func:`documented_worker`): its command, with ``-n <name>@<host>``, and in an environment
    holding only what a process needs to run (``PATH``, ``HOME``, the locale) and the variables
    the page exports: ``CELERY_BROKER_URL`` is ``broker``, ``CELERY_RESULT_BACKEND``
    ``backend``, ``PYTHONPATH`` the repository (the test modules the job is imported from), and
    any other is taken from this process's environment (the job's variables). Yields node name
    -> its process once every worker is ready and reports that broker and result backend, and
    stops each by its pid.

    Raises:
        AssertionError: a variable the page exports is not set here, or a worker reports
            another broker or result backend than the run's executor uses (the run would wait
            for its steps for ever).
    """
    recipe = documented_worker()
    given = {"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": backend,
             "PYTHONPATH": str(REPOSITORY)}
    env = {name: os.environ[name] for name in _PROCESS_VARIABLES if name in os.environ}
    for name in recipe.variables:
        value = given.get(name, os.environ.get(name))
        assert value is not None, f"docs/dagster.md exports {name}, which this test does not set"
        env[name] = value
    program = Path(sys.executable).parent / recipe.command[0]
    host = os.uname().nodename
    folder = Path(tempfile.mkdtemp(prefix="favorites-celery-"))
    workers: dict[str, Process] = {}
    try:
        for name in names:
            node = f"{name}@{host}"
            workers[node] = Process.start(
                [program, *_with_node(recipe.command[1:], node)],
                log=folder / f"{name}.log", name=f"celery worker {name}", cwd=folder, env=env)
        for node, worker in workers.items():
            def ready(worker=worker) -> bool:
                """the worker's "ready." line"""
                return " ready." in worker.log_text()
            worker.wait_until_ready(ready, timeout)
            # The start-up banner: ".> transport:   redis://..." (a password shown as **).
            said = {what: _without_user(uri) for what, uri in re.findall(
                r"\.> (transport|results):\s+(\S+)", worker.log_text())}
            assert said == {"transport": broker, "results": backend}, (
                f"celery worker {node} reports {said}, the run's executor uses broker {broker} "
                f"and result backend {backend}: its steps would never be seen to finish")
        yield workers
    finally:
        for worker in workers.values():
            worker.stop()
        shutil.rmtree(folder, ignore_errors=True)


#: What a process needs from this one's environment to run at all, whatever the recipe says.
_PROCESS_VARIABLES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


def _without_user(uri: str) -> str:
    """``uri`` without its user and (masked) password."""
    return re.sub(r"^(\w+://)[^/@]*@", r"\1", uri)


def _with_node(arguments: tuple[str, ...], node: str) -> list[str]:
    """The worker's arguments with its node name (``-n``) set to ``node``."""
    args = list(arguments)
    for flag in ("-n", "--hostname"):
        if flag in args:
            args[args.index(flag) + 1] = node
            return args
    return [*args, "-n", node]
