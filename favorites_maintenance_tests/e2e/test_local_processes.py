"""The process helper every test server goes through: start, probe, stop by pid, free port.

Its subjects are small programs of the standard library and ``sh``, so the tests need nothing
from the system's packages and take a few seconds.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest

from favorites_maintenance.local.processes import (
    Daemon,
    Process,
    StartError,
    alive,
    free_port,
    group_alive,
    port_in_use,
    port_is_free,
)


def http_server(port: int) -> list[str]:
    return [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]


def test_a_server_is_ready_on_its_port_and_url_and_gone_after_stop(tmp_path):
    port = free_port()
    assert port_is_free(port) and not port_in_use(port)
    with Process.start(http_server(port), log=tmp_path / "http.log", cwd=tmp_path) as server:
        server.wait_until_ready(port, timeout=20)
        server.wait_until_ready(f"http://127.0.0.1:{port}/", timeout=20)
        assert port_in_use(port) and alive(server.pid)
    assert server.returncode == -signal.SIGTERM
    assert not alive(server.pid) and not port_in_use(port)


def test_a_command_that_exits_fails_its_start_with_the_tail_of_its_log(tmp_path):
    proc = Process.start(["sh", "-c", "echo no config here; exit 3"], log=tmp_path / "x.log",
                         name="broken")
    with pytest.raises(StartError, match=r"(?s)broken exited with code 3 before a TCP "
                                         r"connection to 127\.0\.0\.1:\d+:\nno config here"):
        proc.wait_until_ready(free_port(), timeout=10)


def test_a_server_not_ready_in_time_says_what_was_awaited_and_the_probe_s_last_error(tmp_path):
    def never():
        raise ConnectionError("refused, again")

    with Process.start(["sh", "-c", "echo starting; exec sleep 60"], log=tmp_path / "s.log",
                       name="slow") as proc:
        with pytest.raises(StartError) as caught:
            proc.wait_until_ready(never, timeout=0.5, what="the slow server's port")
        assert proc.running()  # a timeout does not stop it: the caller does
    message = str(caught.value)
    assert "slow was not ready within 0.5 s: waited for the slow server's port" in message
    assert "(last: refused, again)" in message and message.endswith("starting")


def test_stop_kills_after_the_grace_period_and_reaps_the_process_group(tmp_path):
    # A server ignoring SIGTERM, with a child in its process group.
    proc = Process.start(["sh", "-c", "trap '' TERM; sleep 60 & wait"], log=tmp_path / "t.log",
                         grace_s=0.5)
    time.sleep(0.3)  # the trap is set and the child started
    children = proc.note_descendants()
    assert children
    started = time.monotonic()
    assert proc.stop() == -signal.SIGKILL
    assert time.monotonic() - started < 10
    assert not group_alive(proc.pid) and not any(alive(pid) for pid in children)
    assert proc.stop() == -signal.SIGKILL  # idempotent


def test_a_detached_server_is_stopped_by_the_pid_in_its_pid_file(tmp_path):
    pid_file = tmp_path / "server.pid"
    # As pg_ctl does: the server runs in a session of its own, the starting command returns.
    Process.start(["sh", "-c", f"setsid sleep 60 </dev/null >/dev/null 2>&1 & "
                               f"echo $! > {pid_file}"], log=tmp_path / "d.log").wait(10)
    daemon = Daemon.from_pid_file(pid_file, name="sleep", stop_signal=signal.SIGINT, grace_s=5)
    pid = daemon.pid
    assert alive(pid)
    with daemon:
        pass
    assert not alive(pid) and daemon.pid is None
    daemon.stop()  # idempotent
