"""How the purge op learns that its run was asked to stop, before each batch.

A terminated run (UI "Terminate", SIGTERM) must end CANCELED with no batch started after the
request and the open batch whole: the purge polls :meth:`StopRequests.requested` between
batches, and the sources it reads are cheap enough to ask before every batch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import dagster as dg

from favorites_maintenance.pipeline.dagster_internals import (
    PUSHING_EVENT_LOG_STORAGES,
    check_captured_interrupt,
)
from favorites_maintenance.retention.database import error_summary

#: How often the purge reads its run's status from Dagster's storage, in seconds, when no
#: interrupt or pushed event has told it of a stop request. A read opens a connection to the
#: storage (about 25 ms against PostgreSQL), longer than a batch.
STATUS_EVERY_S = 1.0

_log = logging.getLogger(__name__)


class StopRequests:
    """Whether the run was asked to stop, known before each batch without a round trip to
    Dagster's storage per batch.

    Three ways in, the first two pushed:

    - the interrupt Dagster sends the step's process on termination, captured by
      ``capture_interrupts``;
    - the run's ``RUN_CANCELING`` event, pushed by a SQLite event log storage's watch as its
      file changes (``dagster dev`` without this repository's ``dagster.yaml``, tests);
    - the run's status, read every :data:`STATUS_EVERY_S` seconds from the step's start (so
      a purge of a day's rows, done within that second, opens no connection to the storage
      before it ends), for a launcher that marks a run CANCELING without interrupting it, or a
      watch that cannot start.

    A status that cannot be read (Dagster's storage down) counts as "no stop requested" until
    the next read; the captured interrupt still stops the purge.
    """

    def __init__(self, context: dg.OpExecutionContext):
        self._context = context
        self._canceling = threading.Event()
        # The first read is one interval in, as every later one; a request before it is
        # still seen by the interrupt, the pushed event, or the read after the last batch.
        self._last_read = time.monotonic()
        self._read_failed = False
        self._watching = False

    def __enter__(self) -> "StopRequests":
        storage = self._context.instance.event_log_storage
        # Only a storage that pushes: the PostgreSQL one's watch polls on a thread of its own
        # (every 0.25 s to 16 s), no sooner than the read below, and dies on a storage outage.
        if isinstance(storage, PUSHING_EVENT_LOG_STORAGES):
            try:
                storage.watch(self._context.run_id, None, self._on_event)
                self._watching = True
            except Exception as exc:  # noqa: BLE001 - the bounded read still sees the request
                _log.warning("no event watch on Dagster's storage (the run's status is read "
                             "every %g s): %s", STATUS_EVERY_S, error_summary(exc))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._watching:
            with contextlib.suppress(Exception):
                self._context.instance.event_log_storage.end_watch(self._context.run_id,
                                                                   self._on_event)

    def _on_event(self, entry: dg.EventLogEntry, _cursor: str) -> None:
        if entry.dagster_event_type in (dg.DagsterEventType.RUN_CANCELING,
                                        dg.DagsterEventType.RUN_CANCELED):
            self._canceling.set()

    def requested(self, read_now: bool = False) -> bool:
        """True once a stop was requested; ``read_now`` reads the run's status whatever the
        time since the last read (once, after the last batch)."""
        if check_captured_interrupt() or self._canceling.is_set():
            return True
        now = time.monotonic()
        if read_now or now - self._last_read >= STATUS_EVERY_S:
            self._last_read = now
            if self._read_status():
                self._canceling.set()
        return self._canceling.is_set()

    def _read_status(self) -> bool:
        try:
            run = self._context.instance.get_run_by_id(self._context.run_id)
        except Exception as exc:  # noqa: BLE001 - Dagster's storage, not the favorites database
            if not self._read_failed:
                _log.warning("could not read the run's status from Dagster's storage (the "
                             "purge goes on): %s", error_summary(exc))
            self._read_failed = True
            return False
        if self._read_failed:
            _log.warning("Dagster's storage answers again")
        self._read_failed = False
        return run is not None and run.status in (dg.DagsterRunStatus.CANCELING,
                                                  dg.DagsterRunStatus.CANCELED)
