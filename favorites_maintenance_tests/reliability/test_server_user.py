"""The OS user the embedded server runs as under root, created by processes starting at once.

On a fresh machine, the test workers (or ``dev`` beside a test run) start their first servers
together. Each used to run ``useradd`` for the same user: some failed with "already exists",
others were handed a uid a concurrent ``useradd`` overwrote, and their ``initdb`` failed with
"could not look up effective user ID". Here four processes race on a user of the test's own,
with the real ``useradd``, each starting at the same instant, three rounds.
"""

from __future__ import annotations

import multiprocessing
import os
import pwd
import subprocess
import time

import pytest

from favorites_maintenance.local.embedded import ensure_server_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creating an OS user needs root")


def _create_at(name: str, at: float) -> int | str:
    time.sleep(max(at - time.time(), 0))
    try:
        return ensure_server_user(name)
    except subprocess.CalledProcessError as e:
        return f"useradd failed: {e.stderr.strip()}"


@pytest.mark.parametrize("round_", range(3))
def test_processes_creating_the_server_user_at_once_all_get_the_one_it_has(round_):
    name = f"fm_race_{os.getpid()}_{round_}"
    try:
        with multiprocessing.get_context("spawn").Pool(4) as pool:
            pool.map(time.sleep, [0.1] * 4)  # every worker started and imported
            uids = pool.starmap(_create_at, [(name, time.time() + 1.0)] * 4)
        assert uids == [pwd.getpwnam(name).pw_uid] * 4
    finally:
        subprocess.run(["userdel", name], capture_output=True)
