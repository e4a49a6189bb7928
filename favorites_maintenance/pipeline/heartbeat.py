"""Heartbeats of a run's steps, and the sensor that ends a run whose steps stopped beating.

A run worker killed outright (SIGKILL, the kernel's out-of-memory killer, a lost host or
container) writes no end to its run: the run stays STARTED and holds its policy's and its
database's pools, and every later run of the policy waits in the queue. When the code server
that started the worker is still up, Dagster itself marks the run FAILURE as soon as the
worker's process exits; nothing does when that process was not the code server's (a run
executed in a command's own process, as ``demo`` and ``restore`` do) or when the code server
went down with it, until run monitoring's ``max_runtime_seconds`` (an hour).

So while a step of a run holds a policy's database
(:class:`~favorites_maintenance.pipeline.resources.PolicyDatabase`), its process writes the
run tag :data:`HEARTBEAT_TAG` (the instant, epoch seconds) every :func:`beat_every` seconds,
from a thread of its own: a long batch or a health pause beats too. The code location's sensor
``cleanup_dead_run_sensor`` (:func:`dead_run_sensor`, which comes with the policies' component)
ends a run whose tag has not
changed for ``FAVORITES_RUN_HEARTBEAT_TIMEOUT`` (2 minutes unless set), measured by the
sensor's own clock: FAILURE (CANCELED for a run already CANCELING), which frees its pools, and
the failure sensor alerts. Runs that never beat (other code, older versions) are left alone.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import threading
import time
from collections.abc import Callable

import dagster as dg

from favorites_maintenance.retention.database import error_summary

#: The run tag the steps' heartbeats write: epoch seconds of the last one.
HEARTBEAT_TAG = "favorites_maintenance/heartbeat"
#: The sensor's name (one for the code location).
DEAD_RUN_SENSOR = "cleanup_dead_run_sensor"
#: Evaluations of the sensor per timeout: a dead run is ended within a quarter of the timeout
#: after it (:func:`sensor_interval`).
_TICKS_PER_TIMEOUT = 4
#: Heartbeats per timeout: a few writes lost to a busy storage do not end a live run.
_BEATS_PER_TIMEOUT = 8

_log = logging.getLogger(__name__)


def beat_every(timeout: dt.timedelta) -> float:
    """Seconds between two heartbeats of a step for a timeout of ``timeout``: an eighth of it,
    from 2 s to 30 s."""
    return _share_of(timeout, _BEATS_PER_TIMEOUT, 2.0)


def _share_of(timeout: dt.timedelta, parts: int, least: float) -> float:
    """``timeout`` divided in ``parts``, seconds, within ``least`` and 30 s."""
    return min(max(timeout.total_seconds() / parts, least), 30.0)


def sensor_interval(timeout: dt.timedelta) -> int:
    """Seconds between two evaluations of ``cleanup_dead_run_sensor`` for a timeout of
    ``timeout``: a quarter of it, from 5 s to 30 s (30 s for the default 2 minutes). A dead
    run is ended at most about one timeout and two intervals after its last heartbeat."""
    return int(_share_of(timeout, _TICKS_PER_TIMEOUT, 5.0))


class Heartbeat:
    """The heartbeats of one step's process for run ``run_id`` of ``instance``: one written when
    it starts, then one every ``every`` seconds from a daemon thread until :meth:`stop`.

    A heartbeat that cannot be written (Dagster's storage busy or down) is logged once and
    retried at the next beat; it never fails the step.
    """

    def __init__(self, instance: dg.DagsterInstance, run_id: str, every: float):
        self._instance = instance
        self._run_id = run_id
        self._every = every
        self._stop = threading.Event()
        self._failing = False
        self._thread: threading.Thread | None = None

    def start(self) -> "Heartbeat":
        """Write the first heartbeat now (a run killed right after is still watched), then
        start the thread."""
        self._beat()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self._run_id[:8]}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (its last write, if under way, finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._every + 10)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._beat()

    def _beat(self) -> None:
        try:
            self._instance.add_run_tags(self._run_id, {HEARTBEAT_TAG: str(int(time.time()))})
        except Exception as exc:  # noqa: BLE001 - Dagster's storage, not the policy's database
            if not self._failing:
                _log.warning("could not write the heartbeat of run %s (retried every %g s): %s",
                             self._run_id, self._every, error_summary(exc))
            self._failing = True
        else:
            if self._failing:
                _log.warning("the heartbeat of run %s is written again", self._run_id)
            self._failing = False


def _utc(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).isoformat(timespec="seconds")


def build_dead_run_sensor(timeout: dt.timedelta,
                          clock: Callable[[], float] = time.time) -> dg.SensorDefinition:
    """The sensor ``cleanup_dead_run_sensor``: every :func:`sensor_interval` seconds, it
    reads the runs in progress (STARTED or CANCELING) that carry :data:`HEARTBEAT_TAG`, and
    ends each whose tag has not changed for ``timeout`` by ``clock`` (epoch seconds; this
    process's, whatever the clocks of the hosts that wrote the heartbeats): a STARTED run is
    reported FAILURE, a CANCELING one CANCELED, through the instance, so its pools are free and
    the next run of its policy starts. The message says when it last beat and why it was ended.

    The cursor is JSON ``{"runs": {run_id: [heartbeat tag, epoch_s first seen]}}``: the last
    heartbeat seen of each run in progress and when the sensor first saw it. A run first seen
    by this sensor (a new deployment, a reset cursor) gets the whole ``timeout`` from then.
    """

    @dg.sensor(
        name=DEAD_RUN_SENSOR,
        minimum_interval_seconds=sensor_interval(timeout),
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(f"Ends a cleanup or restore run whose steps have not beaten for "
                     f"{timeout.total_seconds():g} s (its process was killed or lost): FAILURE, "
                     "which frees its pools for the next run (docs/runbook.md)."),
    )
    def dead_run_sensor(context: dg.SensorEvaluationContext):
        now = clock()
        try:
            seen = json.loads(context.cursor)["runs"] if context.cursor else {}
        except (ValueError, KeyError, TypeError):
            seen = {}  # not a cursor this sensor wrote: every run starts its timeout now
        records = context.instance.get_run_records(dg.RunsFilter(statuses=[
            dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]))
        watched, ended = {}, []
        for record in records:
            run = record.dagster_run
            beat = run.tags.get(HEARTBEAT_TAG)
            if beat is None:
                continue  # it never beat: not a run of this code location's steps
            last, since = (seen.get(run.run_id) or [None, None])[:2]
            if last != beat or not isinstance(since, (int, float)):
                watched[run.run_id] = [beat, now]
                continue
            if now - since < timeout.total_seconds():
                watched[run.run_id] = [last, since]
                continue
            run = context.instance.get_run_by_id(run.run_id)
            if run is None or run.is_finished:
                continue  # it ended since the read above
            ended.append(run.run_id)
            _end(context, run, beat, now - since, timeout)
        context.update_cursor(json.dumps({"runs": watched}))
        if ended:
            return dg.SkipReason(f"ended {len(ended)} runs whose steps stopped beating: "
                                 f"{', '.join(ended)}")
        return dg.SkipReason(f"{len(watched)} runs in progress beating")

    return dead_run_sensor


@functools.lru_cache(maxsize=None)
def dead_run_sensor(timeout: dt.timedelta) -> dg.SensorDefinition:
    """The code location's ``cleanup_dead_run_sensor`` for ``timeout``
    (:func:`build_dead_run_sensor`), built once per process: the first policy of each component
    tree carries it (:class:`~favorites_maintenance.components.retention_policy.
    RetentionPolicy`), and code locations merged from several trees keep this one object
    once."""
    return build_dead_run_sensor(timeout)


def _end(context: dg.SensorEvaluationContext, run: dg.DagsterRun, beat: str, silent_s: float,
         timeout: dt.timedelta) -> None:
    """Report ``run`` FAILURE (CANCELED when it was CANCELING): its steps last beat at ``beat``
    (epoch seconds, as written) and this sensor has seen nothing since for ``silent_s``."""
    try:
        last = _utc(float(beat))
    except (ValueError, OverflowError, OSError):  # a tag written by hand
        last = repr(beat)
    message = (f"run {run.run_id}: no heartbeat from its steps for {silent_s:.0f} s (timeout "
               f"{timeout.total_seconds():g} s, FAVORITES_RUN_HEARTBEAT_TIMEOUT; last written at "
               f"{last}): the process running them is gone (killed, out of memory, its host "
               "lost). Ended so that its pools are free; a batch it had open is rolled back "
               "whole when its connection ends, the ones before it stay deleted "
               "(docs/runbook.md).")
    context.log.warning(message)
    if run.status == dg.DagsterRunStatus.CANCELING:
        context.instance.report_run_canceled(run, message)
    else:
        context.instance.report_run_failed(run, message)
