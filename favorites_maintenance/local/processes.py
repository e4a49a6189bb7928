"""Start a local server, wait until it serves, stop it by its pid: the one helper of the tests,
the dev tooling and the bench.

Two kinds of processes:

* :class:`Process`: a command this process starts (``subprocess.Popen``) in a session of its
  own, so that its children belong to its process group and end with it; its output goes to a
  log file whose tail is shown when it fails to start. :meth:`Process.wait_until_ready` probes
  it (a TCP port, an HTTP URL or any callable); :meth:`Process.stop` ends it with the signal the
  server wants, SIGKILL after a grace period, then reaps what is left of its group.
* :class:`Daemon`: a server that detached itself and wrote its pid to a file (PostgreSQL started
  by ``pg_ctl`` writes ``postmaster.pid``); it is stopped by that pid.

Only the standard library; Linux first (``/proc``), with a fallback on ``kill(pid, 0)``.
Times are in seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
#: Lines of a log shown when a process fails to start.
TAIL_LINES = 40

#: What :meth:`Process.wait_until_ready` accepts: a port (int) accepting TCP connections on
#: 127.0.0.1, an ``http(s)://`` URL answering 2xx, or a callable returning something truthy
#: when ready (an exception it raises counts as "not yet" and is reported on timeout).
Probe = int | str | Callable[[], Any]


class StartError(RuntimeError):
    """A process exited before it was ready, or was not ready in time. The message says what
    was awaited and ends with the tail of the process's log."""


# --- ports -----------------------------------------------------------------------------------

def free_port(host: str = HOST) -> int:
    """A TCP port of ``host`` nobody listens on now (the kernel's pick). Another process may take
    it before the server binds it: callers that care retry on "address already in use"."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(port: int, host: str = HOST) -> bool:
    """Whether ``port`` of ``host`` can be bound now (nobody listens on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # A port whose last connection lingers in TIME_WAIT is free for a new server.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_in_use(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (within ``timeout`` s)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        return sock.connect_ex((host, port)) == 0


# --- probes ----------------------------------------------------------------------------------

def tcp_probe(port: int, host: str = HOST) -> Callable[[], bool]:
    """A probe: ``host:port`` accepts a TCP connection."""
    def probe() -> bool:
        return port_in_use(port, host)
    probe.__doc__ = f"a TCP connection to {host}:{port}"
    return probe


def http_probe(url: str, timeout: float = 2.0) -> Callable[[], bool]:
    """A probe: a GET of ``url`` answers with a 2xx status within ``timeout`` s."""
    def probe() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return 200 <= resp.status < 300
        except urllib.error.HTTPError as exc:  # answering, but not ready (e.g. 503)
            raise ConnectionError(f"HTTP {exc.code} from {url}") from None
    probe.__doc__ = f"an HTTP 2xx answer from {url}"
    return probe


def _as_probe(probe: Probe) -> tuple[Callable[[], Any], str]:
    """The callable of ``probe`` and a description of what it waits for."""
    if isinstance(probe, bool):
        raise TypeError("a probe is a port, a URL or a callable, not a bool")
    if isinstance(probe, int):
        probe = tcp_probe(probe)
    elif isinstance(probe, str):
        probe = http_probe(probe)
    return probe, (probe.__doc__ or getattr(probe, "__name__", "the probe")).strip()


def wait_for(predicate: Callable[[], Any], timeout: float, *, interval: float = 0.1,
             what: str = "condition", details: Callable[[], str] | None = None) -> Any:
    """Call ``predicate`` every ``interval`` s until it returns something truthy; return that.

    An exception the predicate raises propagates (it decides what is fatal).

    Raises:
        TimeoutError: not reached within ``timeout`` s; the message names ``what`` and ends with
            ``details()`` when given (e.g. a log's tail).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            message = f"{what} not reached within {timeout:g} s"
            raise TimeoutError(message + (f"\n{details()}" if details else ""))
        time.sleep(interval)


# --- pids and process groups -----------------------------------------------------------------

def _stat_fields(stat: Path) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name: ``[state, ppid, pgrp, ...]``."""
    try:
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and ")", so split at the last.
        return stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a zombie has exited: its parent just
    has not reaped it yet)."""
    if not Path("/proc").is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return fields is not None and fields[0] != "Z"


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a live (not zombie) member."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if fields and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def descendants(pid: int) -> set[int]:
    """Pids of every live descendant of ``pid`` (from ``/proc``; empty without it), including
    those that left its process group (a daemon started with ``setsid``)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if fields and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def read_pid_file(path: Path | str) -> int:
    """The pid on the first line of a pid file (``postmaster.pid``, ``*.pid``)."""
    return int(Path(path).read_text().split()[0])


def _send(pid: int, sig: int, *, group: bool = False) -> bool:
    """Send ``sig`` to ``pid`` (to its process group ``pid`` with ``group``); False when there
    is no such process (group)."""
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(is_alive: Callable[[], bool], timeout: float) -> bool:
    """Poll ``is_alive`` until False or ``timeout`` s passed; whether it is gone."""
    deadline = time.monotonic() + timeout
    while is_alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop_pid(pid: int, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> bool:
    """Stop process ``pid``, which need not be a child of this process: ``sig``, then SIGKILL
    if it still runs after ``grace_s`` s; wait until it is gone (a zombie counts as gone: its
    parent reaps it).

    Returns:
        False if it had to be killed, else True (it stopped on ``sig``, or was already gone).
    """
    if not _send(pid, sig):
        return True
    if _wait_gone(lambda: alive(pid), grace_s):
        return True
    _send(pid, signal.SIGKILL)
    _wait_gone(lambda: alive(pid), 10.0)
    return False


def stop_pids(pids: Iterable[int], sig: int = signal.SIGTERM, grace_s: float = 5.0) -> None:
    """Stop every live process of ``pids`` at once: ``sig``, SIGKILL after ``grace_s`` s."""
    left = {pid for pid in pids if alive(pid) and _send(pid, sig)}
    _wait_gone(lambda: any(alive(pid) for pid in left), grace_s)
    for pid in left:
        if alive(pid):
            _send(pid, signal.SIGKILL)
    _wait_gone(lambda: any(alive(pid) for pid in left), 10.0)


def reap_group(pgid: int, grace_s: float = 10.0) -> None:
    """End what is left of process group ``pgid`` (e.g. a worker its leader did not stop):
    SIGTERM, then SIGKILL after ``grace_s`` s."""
    if not group_alive(pgid):
        return
    _send(pgid, signal.SIGTERM, group=True)
    if not _wait_gone(lambda: group_alive(pgid), grace_s):
        _send(pgid, signal.SIGKILL, group=True)
        _wait_gone(lambda: group_alive(pgid), 10.0)


def tail(path: Path | str | None, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of the text file ``path`` ("" when there is none)."""
    if path is None or not Path(path).is_file():
        return ""
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


# --- processes -------------------------------------------------------------------------------

class Process:
    """A command started by this process, in a session (and process group) of its own.

    Made by :meth:`start`; use it as a context manager or call :meth:`stop` (idempotent).

    Attributes:
        name: what the messages call it, e.g. ``"pgbouncer"``.
        popen: the ``subprocess.Popen``; its pid is also its process group id.
        log: the file holding its stdout and stderr.
        stop_signal: sent by :meth:`stop` first (SIGTERM, or what the server wants: SIGINT for
            a graceful Dagster or a fast PostgreSQL shutdown, SIGQUIT for an immediate one).
        stop_group: send :attr:`stop_signal` to the whole process group (as a terminal's Ctrl-C
            does) rather than to the leader alone.
        grace_s: seconds :meth:`stop` waits after :attr:`stop_signal` before SIGKILL.
        seen_pids: every descendant seen so far (see :meth:`note_descendants`); :meth:`stop`
            ends those still alive, even those that left the group.
    """

    def __init__(self, popen: subprocess.Popen, log: Path, *, name: str,
                 stop_signal: int = signal.SIGTERM, stop_group: bool = False,
                 grace_s: float = 10.0):
        self.popen = popen
        self.log = log
        self.name = name
        self.stop_signal = stop_signal
        self.stop_group = stop_group
        self.grace_s = grace_s
        self.seen_pids: set[int] = set()

    @classmethod
    def start(cls, command: Sequence[str | os.PathLike], *, log: Path | str,
              name: str | None = None, cwd: Path | str | None = None,
              env: Mapping[str, str] | None = None, stop_signal: int = signal.SIGTERM,
              stop_group: bool = False, grace_s: float = 10.0,
              **popen_kwargs) -> "Process":
        """Start ``command`` in a new session, stdin from ``/dev/null``, stdout and stderr
        appended to ``log``; return at once (see :meth:`wait_until_ready`).

        Args:
            command: the program and its arguments.
            log: the log file (created, or appended to).
            name: for messages; the program's file name by default.
            cwd, env: as for ``subprocess.Popen`` (``env`` replaces the environment).
            stop_signal, stop_group, grace_s: how :meth:`stop` stops it (see the class).
            popen_kwargs: more ``subprocess.Popen`` arguments (``user``, ``preexec_fn``).
        """
        log = Path(log)
        args = [os.fspath(a) for a in command]
        with open(log, "ab") as out:  # the child keeps its own descriptor of the file
            popen = subprocess.Popen(args, cwd=cwd, env=None if env is None else dict(env),
                                     stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     **popen_kwargs)
        return cls(popen, log, name=name or Path(args[0]).name, stop_signal=stop_signal,
                   stop_group=stop_group, grace_s=grace_s)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """Its exit code (negative: killed by that signal), ``None`` while it runs."""
        return self.popen.poll()

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        """Everything it has logged so far."""
        return self.log.read_text(errors="replace") if self.log.is_file() else ""

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last ``lines`` lines of its log."""
        return tail(self.log, lines)

    def note_descendants(self) -> set[int]:
        """Add its live descendants to :attr:`seen_pids` (a daemon that left its group stays
        known after the process that started it exited); return :attr:`seen_pids`."""
        if self.running():
            self.seen_pids |= descendants(self.pid)
        return self.seen_pids

    def wait_until_ready(self, probe: Probe, timeout: float = 10.0, *, what: str | None = None,
                         interval: float = 0.05) -> Any:
        """Wait until ``probe`` (see :data:`Probe`) succeeds while the process runs; return
        what it returned.

        The process must still run once the probe succeeded: on a port taken meanwhile,
        another server may have answered.

        Raises:
            StartError: the process exited, or ``timeout`` s passed; the message says what it
                waited for, the probe's last error, and ends with the tail of the log.
        """
        check, described = _as_probe(probe)
        what = what or described
        last: list[BaseException] = []

        def ready():
            self.note_descendants()
            if not self.running():
                raise StartError(f"{self.name} exited with code {self.returncode} before "
                                 f"{what}:\n{self.tail()}")
            try:
                value = check()
            except Exception as exc:  # noqa: BLE001 - not ready yet; reported on timeout
                last[:] = [exc]
                return None
            return value if value and self.running() else None

        try:
            return wait_for(ready, timeout, interval=interval, what=what)
        except TimeoutError:
            reason = f" (last: {last[0]})" if last else ""
            raise StartError(f"{self.name} was not ready within {timeout:g} s: waited for "
                             f"{what}{reason}:\n{self.tail()}") from None

    def send_signal(self, sig: int, *, group: bool = False) -> bool:
        """Send ``sig`` to the process (its whole group with ``group``); False if it is gone."""
        self.note_descendants()
        if not self.running():
            return False
        return _send(self.pid, sig, group=group)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to exit (``subprocess.TimeoutExpired`` after ``timeout`` s)."""
        return self.popen.wait(timeout)

    def stop(self, sig: int | None = None, grace_s: float | None = None) -> int:
        """Stop it: ``sig`` (default :attr:`stop_signal`), SIGKILL to its group after
        ``grace_s`` s (default :attr:`grace_s`); then end what is left of its group and of
        :attr:`seen_pids` (SIGTERM, then SIGKILL). Idempotent.

        Returns:
            Its exit code.
        """
        sig = self.stop_signal if sig is None else sig
        grace_s = self.grace_s if grace_s is None else grace_s
        if self.send_signal(sig, group=self.stop_group):
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                _send(self.pid, signal.SIGKILL, group=True)
                self.popen.wait()
        # Whatever outlived the leader: its group, and descendants that left the group.
        reap_group(self.pid, grace_s=5.0)
        stop_pids(self.seen_pids, signal.SIGTERM, grace_s=5.0)
        return self.popen.wait()

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Daemon:
    """A server that detached itself (started by a tool that returned, e.g. ``pg_ctl start``),
    known by its pid; stopped by that pid.

    Attributes:
        pid: the server's pid.
        name: what messages call it.
        stop_signal: sent first by :meth:`stop` (for PostgreSQL's postmaster: SIGTERM smart,
            SIGINT fast, SIGQUIT immediate shutdown).
        grace_s: seconds :meth:`stop` waits before SIGKILL.
    """

    def __init__(self, pid: int, *, name: str, stop_signal: int = signal.SIGTERM,
                 grace_s: float = 60.0):
        self.pid: int | None = pid
        self.name = name
        self.stop_signal = stop_signal
        self.grace_s = grace_s

    @classmethod
    def from_pid_file(cls, pid_file: Path | str, **kwargs) -> "Daemon":
        """The server whose pid is on the first line of ``pid_file`` (e.g. ``postmaster.pid``,
        which PostgreSQL removes when it stops); ``kwargs`` as for the class."""
        return cls(read_pid_file(pid_file), **kwargs)

    def alive(self) -> bool:
        return self.pid is not None and alive(self.pid)

    def stop(self) -> bool:
        """Stop it by its pid (:attr:`stop_signal`, SIGKILL after :attr:`grace_s` s) and wait
        until it is gone; idempotent. True unless it had to be killed."""
        pid, self.pid = self.pid, None
        return True if pid is None else stop_pid(pid, self.stop_signal, self.grace_s)

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


__all__ = [
    "HOST", "Daemon", "Probe", "Process", "StartError", "alive", "descendants", "free_port",
    "group_alive", "http_probe", "port_in_use", "port_is_free", "read_pid_file", "reap_group",
    "stop_pid", "stop_pids", "tail", "tcp_probe", "wait_for",
]
