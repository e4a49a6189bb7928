"""``favorites-maintenance dev``: the Dagster UI and daemon on the local environment.

The embedded PostgreSQL server serves both Dagster's storage and the favorites database
(:class:`~favorites_maintenance.local.environment.LocalEnvironment`); ``dagster dev`` runs the
webserver and the daemon on top of it. Ctrl-C (SIGINT) or SIGTERM stops ``dagster dev`` first,
so the webserver, the daemon, the code server and any run they started end while their storage
is still up, and then the server.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from favorites_maintenance.local.processes import HOST, http_probe, reap_group, wait_for

#: The guest-favorites policy's asset (``defs/guest_favorites/defs.yaml``), the page ``dev``
#: points a newcomer at.
GUEST_FAVORITES_ASSET = "favorites/guest_favorites_cleanup"


#: How long ``dagster dev`` gets to stop its webserver, daemon and code server after an interrupt.
SHUTDOWN_GRACE_S = 60.0


def ui_address(port: int) -> str:
    return f"http://{HOST}:{port}"


def asset_page(port: int) -> str:
    """The UI page of the cleanup asset."""
    return f"{ui_address(port)}/assets/{GUEST_FAVORITES_ASSET}"


def prepare_dev_table(engine: sa.Engine, rows: int, echo: Callable[[str], None],
                      reseed: bool = False) -> None:
    """Create the dev table if missing and seed ``rows`` rows if it is empty; with ``reseed``,
    drop and recreate its schema first (every table in it), so it holds freshly seeded rows whatever was there."""
    from favorites_maintenance.local.guest_favorites import create_dev_schema, drop_dev_schema
    from favorites_maintenance.local.seed import seed_favorites, summarize

    if reseed:
        echo("dropping and recreating the schema favorites (--reseed)")
        drop_dev_schema(engine)
    create_dev_schema(engine)
    current = summarize(engine)
    if current.rows:
        echo(f"favorites.favorites holds {current.rows:,} rows ({current.guest_rows:,} guest, "
             f"{current.account_rows:,} account): not seeding (--reseed seeds it again)")
        return
    t0 = time.monotonic()
    seeded = seed_favorites(engine, rows, now=dt.datetime.now(dt.timezone.utc),
                            on_progress=seed_progress(rows, echo))
    echo(f"seeded favorites.favorites in {time.monotonic() - t0:.1f} s: {seeded.rows:,} rows, "
         f"{seeded.guest_rows:,} guest, {seeded.account_rows:,} account")


def seed_progress(rows: int, echo: Callable[[str], None]) -> Callable[[int], None]:
    """A ``seed_favorites`` progress callback echoing ``seeding: N / M rows`` lines."""
    def progress(done: int) -> None:
        echo(f"  seeding: {done:,} / {rows:,} rows")
    return progress


def ensure_pool_limits(policies=None) -> dict[str, int]:
    """Write the limit of each pool of ``policies`` (default: those of
    ``favorites_maintenance/defs/``), the policy's own and its database's, into the instance
    (``DAGSTER_HOME``) unless it is there.

    Dagster writes a pool's ``default_limit`` into its storage only while dequeuing the first
    run that uses the pool, after it has read the limits for that pass: on a fresh instance the
    runs queued at that moment (a backfill, a tick) all start together. Writing the limits
    before the daemon starts closes that window. A limit already set, e.g. from the UI, is kept.

    Returns:
        Pool name -> its limit, each pool once, in the policies' order (the valid
        policies: a broken one is the code location's load error, shown in the UI).
    """
    import dagster as dg

    from favorites_maintenance.components.policy_tree import policy_files

    # The valid policies: a broken one is the code location's load error, shown in the UI.
    chosen = ([p for f in policy_files() for p in f.policies] if policies is None
              else policies)
    pools = list(dict.fromkeys(pool for policy in chosen for pool in policy.pools))
    with dg.DagsterInstance.get() as instance:
        storage = instance.event_log_storage
        known = storage.get_concurrency_keys()
        for pool in pools:
            if pool not in known:
                storage.set_concurrency_slots(pool,
                                              instance.global_op_concurrency_default_limit or 1)
        return {pool: storage.get_concurrency_info(pool).slot_count for pool in pools}


#: Python warning filters (``PYTHONWARNINGS`` entries) for ``dagster dev`` and the processes it
#: starts, for two warnings of Dagster's own that a user of this command cannot act on: that
#: ``dagster dev`` is superseded by ``dg dev`` (this command runs it for them), and a preview
#: parameter Dagster passes itself each time it builds a code location's asset checks.
QUIET_DAGSTER_WARNINGS = ("ignore:Function `dev_command` is superseded",
                          "ignore:Parameter `execution_type` of function "
                          "`AssetsDefinition.__init__` is currently in beta")


def dev_environment() -> dict[str, str]:
    """This process's environment for ``dagster dev``, with :data:`QUIET_DAGSTER_WARNINGS`
    after any ``PYTHONWARNINGS`` filters already set."""
    given = os.environ.get("PYTHONWARNINGS")
    return {**os.environ,
            "PYTHONWARNINGS": ",".join(filter(None, (given, *QUIET_DAGSTER_WARNINGS)))}


def dagster_dev_command(workspace: Path, port: int) -> list[str]:
    return [sys.executable, "-m", "dagster", "dev", "-w", str(workspace),
            "-h", HOST, "-p", str(port)]


#: A line of Dagster's console loggers at DEBUG ("2026-05-10 03:00:01 +0000 - dagster - DEBUG").
_DEBUG_LINE = re.compile(r"^\S+ \S+ [+-]\d{4} - [\w.]+ - DEBUG - ")
#: The daemon's INFO lines of every sensor and schedule evaluation that did nothing (each
#: sensor every 30 s): in the UI's tick history, kept off the terminal unless ``--debug``.
_IDLE_TICK_LINE = re.compile(
    r"^\S+ \S+ [+-]\d{4} - dagster\.daemon\.(Sensor|Scheduler)Daemon - INFO - "
    r"(Checking for new runs for |Sensor \S+ skipped: |No new tick times to evaluate for )")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def relay_output(stream, out, *, plain: bool, debug: bool) -> None:
    """Copy ``dagster dev``'s output (bytes lines from ``stream``) to ``out`` (text).

    Args:
        plain: drop ANSI colour codes (``out`` is not a terminal, e.g. a redirected log).
        debug: keep the DEBUG lines of Dagster's console loggers (every step event and every
            purge batch) and the daemon's lines of sensor and schedule ticks that did nothing;
            without it only INFO and above reach the terminal, those ticks left out. The run's
            event log and the tick history in the UI keep everything either way.
    """
    for raw in iter(stream.readline, b""):
        text = raw.decode(errors="replace")
        bare = _ANSI.sub("", text)
        if not debug and (_DEBUG_LINE.match(bare) or _IDLE_TICK_LINE.match(bare)):
            continue
        out.write(bare if plain else text)
        out.flush()


def run_dagster_dev(command: list[str], cwd: Path, echo: Callable[[str], None],
                    debug: bool = False, ready_url: str | None = None,
                    on_ready: Callable[[], None] | None = None) -> int:
    """Run ``dagster dev`` until it exits or this process is interrupted; return its exit code.

    ``dagster dev`` runs in its own session, so a Ctrl-C at the terminal reaches this process
    only, and the shutdown goes one way: SIGINT to ``dagster dev``, which stops its webserver,
    daemon and code server; whatever is left in its process group after the grace period (or
    after a second Ctrl-C) is killed. Its output goes through :func:`relay_output`: INFO and
    above unless ``debug``, without colour codes when stdout is not a terminal. ``on_ready`` is
    called once ``ready_url`` answers (the UI serves), from another thread.
    """
    # Own both signals: a shell's background job starts with SIGINT ignored, and this command
    # must still stop everything when it is sent one.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    proc = subprocess.Popen(command, cwd=cwd, start_new_session=True, env=dev_environment(),
                            preexec_fn=_default_sigint, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    relay = threading.Thread(target=relay_output, args=(proc.stdout, sys.stdout),
                             kwargs={"plain": not sys.stdout.isatty(), "debug": debug},
                             daemon=True)
    relay.start()
    if ready_url and on_ready:
        threading.Thread(target=_when_serving, args=(proc, ready_url, on_ready),
                         daemon=True).start()
    try:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            echo("stopping the Dagster webserver and daemon ...")
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=SHUTDOWN_GRACE_S)
            except (KeyboardInterrupt, subprocess.TimeoutExpired):
                echo("dagster dev did not stop in time: killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return 0
    finally:
        # What dagster dev left behind in its process group (e.g. a run worker).
        reap_group(proc.pid)
        relay.join(timeout=5)  # the last lines before this command's own "stopped"
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def _when_serving(proc: subprocess.Popen, url: str, then: Callable[[], None],
                  timeout: float = 600.0) -> None:
    """Call ``then`` once ``url`` answers 2xx, unless ``proc`` exits first or ``timeout`` s
    pass."""
    probe = http_probe(url)

    def ready() -> bool:
        if proc.poll() is not None:
            raise ProcessLookupError
        try:
            return bool(probe())
        except OSError:
            return False

    try:
        wait_for(ready, timeout, interval=0.5, what=url)
    except (ProcessLookupError, TimeoutError):
        return
    then()


def _default_sigint() -> None:
    # A shell starting this command in the background makes it ignore SIGINT, and children
    # inherit that: dagster dev must handle it to shut down its webserver and daemon.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _raise_keyboard_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
