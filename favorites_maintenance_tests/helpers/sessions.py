"""What a test does beside the code it tests: end a backend of the run when it reaches a given
point (:func:`kill_when`), and run the same work on several threads at once
(:func:`run_concurrently`).

Neither waits by the clock: the killer watches until the point is reached or the test's block
ends, however slowly a loaded machine brings the run there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import sqlalchemy as sa

T = TypeVar("T")

#: A backend of the test's database sleeping inside a statement (``pg_sleep`` in a trigger):
#: a batch held at a known row.
SLEEPING = ("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
            "AND datname = current_database() AND pid <> pg_backend_pid()")

#: How often the killer asks, in seconds.
_POLL_S = 0.02


@contextlib.contextmanager
def kill_when(engine: sa.Engine, query: str = SLEEPING, **params) -> Iterator[list[int]]:
    """While the block runs, a thread asks ``query`` (SQL returning one ``pid`` or no row,
    with ``params``) on a session of ``engine`` and ends that backend
    (``pg_terminate_backend``) the first time it names one.

    Yields the list that receives the pid killed (empty until then, one pid at most). The
    watch ends with the block; the thread is joined before the block returns.
    """
    killed: list[int] = []
    done = threading.Event()

    def watch() -> None:
        with engine.connect() as watcher:
            while not done.is_set():
                pid = watcher.execute(sa.text(query), params).scalar()
                if pid is not None:
                    watcher.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                    killed.append(pid)
                    return
                watcher.rollback()
                done.wait(_POLL_S)

    thread = threading.Thread(target=watch, daemon=True, name="kill_when")
    thread.start()
    try:
        yield killed
    finally:
        done.set()
        thread.join()


def run_concurrently(n: int, fn: Callable[[int], T]) -> list[T]:
    """``fn(0)``, ..., ``fn(n - 1)`` on ``n`` threads released together (a barrier), so that
    they overlap for real; returns their results in that order.

    Raises:
        BaseException: the first exception a thread raised, once every thread has ended.
    """
    start = threading.Barrier(n)
    results: list = [None] * n
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            start.wait()
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
