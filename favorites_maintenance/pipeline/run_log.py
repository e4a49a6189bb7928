"""Lines in a run's log that never tear the batch loop.

The purge op writes progress to Dagster's run log, and the retention core logs through
Python's ``logging``; both must survive an outage of Dagster's own storage, which is not the
favorites database.
"""

from __future__ import annotations

import contextlib
import logging

import dagster as dg

from favorites_maintenance.retention.database import error_summary

#: The retention core logs through Python's ``logging``; its records at INFO and above (skipped
#: rows and their causes, a missing index, a stale statement) are shown in the run's log too.
CORE_LOGGER = "favorites_maintenance.retention"

_log = logging.getLogger(__name__)


def to_run_log(context: dg.OpExecutionContext, level: int, message: str) -> None:
    """Log ``message`` in the run's log; if Dagster's storage refuses the write, in the
    process's log instead. Never raises: a storage outage must not tear the batch loop."""
    try:
        context.log.log(level, message)
    except Exception as exc:  # noqa: BLE001 - Dagster's storage, not the favorites database
        _log.log(level, "%s (not in the run's log: Dagster's storage failed: %s)", message,
                 error_summary(exc))


class _RunLogHandler(logging.Handler):
    def __init__(self, context: dg.OpExecutionContext):
        super().__init__(logging.INFO)
        self.context = context

    def emit(self, record: logging.LogRecord) -> None:
        to_run_log(self.context, record.levelno, record.getMessage())


@contextlib.contextmanager
def core_logs_in_run_log(context: dg.OpExecutionContext):
    """While the block runs, copy the retention core's records at INFO and above into the
    run's log. The core's logger is lowered to INFO for that time when nothing configured it
    (Python's root logger stops at WARNING, and a record below a logger's level is never made,
    whatever its handlers)."""
    logger = logging.getLogger(CORE_LOGGER)
    handler = _RunLogHandler(context)
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
