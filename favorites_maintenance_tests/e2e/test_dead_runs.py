"""A run whose process is killed outright (SIGKILL) mid-purge, under a real ``dagster-daemon
run`` over ``workspace.yaml`` and the repository's ``dagster.yaml`` (runs queued, one per policy
and per database; run retries; run monitoring): the run ends FAILURE, its pools are free and the
next run of the policy goes on, deleting what is left.

Two ways to die: a run worker the daemon's code server started (Dagster's code server sees its
process exit), and a run executed in a command's own process, as ``demo`` runs it, which no
other process watches: its missing heartbeat ends it (``cleanup_dead_run_sensor``). Every batch
takes at least half a second, so the kill lands mid-purge.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import subprocess
import sys
import textwrap

import dagster as dg
import pytest
import sqlalchemy as sa

from favorites_maintenance.local.guest_favorites import create_dev_schema
from favorites_maintenance.pipeline.heartbeat import HEARTBEAT_TAG
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import Rows, slow_batches
from favorites_maintenance_tests.helpers.daemon import (
    code_location,
    launch_run,
    pg_instance,
    step_processes,
    terminate_run,
    wait_until_finished,
)
from favorites_maintenance_tests.helpers.dev_stack import ROOT, DagsterService, wait_for
from favorites_maintenance_tests.helpers.jobs import JOB, guest_variable

# One Dagster webserver and daemon at a time, each module's stack started once.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("dagster_stack")]

UTC = dt.timezone.utc
NOW = dt.datetime.now(UTC)
PARTITION = (NOW - dt.timedelta(days=1)).date().isoformat()
#: The shortest timeout there is: a run silent for 30 s is taken for dead, the sensor looking
#: every 7 s.
TIMEOUT = "PT30S"
OLD_ROWS = 200
BATCH = 10
IN_PROCESS_RUN = textwrap.dedent(f"""
    import os

    import dagster as dg
    from favorites_maintenance.components.policy_tree import code_location

    job = code_location().resolve_job_def({JOB!r})
    with dg.DagsterInstance.get() as instance:  # DAGSTER_HOME's, as demo's
        job.execute_in_process(partition_key={PARTITION!r}, instance=instance,
                               tags={{"e2e/demo": os.environ["E2E_DEMO"]}})
""")


@pytest.fixture(scope="module")
def deployment(pg_server, tmp_path_factory):
    """The daemon over ``workspace.yaml``, its instance the repository's ``dagster.yaml`` on a
    storage database of the test server; an instance on that storage and a code server of
    this process's own, to launch runs into the queue as the UI does; the favorites rows."""
    tag = f"dead{os.getpid()}"
    home = tmp_path_factory.mktemp("dagster_home")
    os.chmod(home, 0o755)
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    storage = pg_server.ensure_database(f"{tag}_dagster").set(
        drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    favorites = pg_server.ensure_database(f"{tag}_favorites")
    engine = create_engine(favorites)
    create_dev_schema(engine)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env.update({"DAGSTER_HOME": str(home), "DAGSTER_POSTGRES_URL": storage,
                DATABASE_URL_VAR: favorites.render_as_string(hide_password=False),
                "FAVORITES_RUN_HEARTBEAT_TIMEOUT": TIMEOUT,
                guest_variable("partitions_start"): "2026-01-01",
                guest_variable("batch_size"): str(BATCH),
                guest_variable("target_batch_duration"): "PT0S",
                guest_variable("cron"): "0 0 1 1 *"})  # no tick during the test
    daemon = None
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key in [k for k in os.environ if k.startswith(("FAVORITES_", "DAGSTER_"))]:
                mp.delenv(key)
            for key, value in env.items():
                mp.setenv(key, value)
            daemon = DagsterService.start("dagster-daemon", ["run"], env, home / "daemon.log")
            with pg_instance(storage) as instance, code_location(instance) as workspace:
                yield env, instance, workspace, engine
    finally:
        if daemon is not None:
            daemon.stop()
        engine.dispose()
        for name in (f"{tag}_favorites", f"{tag}_dagster"):
            with contextlib.suppress(Exception):
                pg_server.drop_database(name)


def fill(engine) -> set[int]:
    """The table emptied, then :data:`OLD_ROWS` prunable guest rows and the rows that stay
    (fresh guests, old accounts): their ids."""
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM favorites.favorites"))
    rows = Rows(engine)
    rows.add_many(OLD_ROWS, updated_at=NOW - dt.timedelta(days=400))
    return set(rows.add_many(10, updated_at=NOW - dt.timedelta(days=10))) | set(
        rows.add_many(10, updated_at=NOW - dt.timedelta(days=900), user_id=3))


def deleted(engine, kept: set[int]) -> int:
    """Prunable rows deleted so far."""
    return OLD_ROWS + len(kept) - len(Rows(engine).ids())


def run_failure(instance: dg.DagsterInstance, run_id: str) -> str:
    """The message of the run's RUN_FAILURE event."""
    [event] = [e for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)]
    return event.message


def settled(instance: dg.DagsterInstance) -> None:
    """Wait until no run is queued or in progress and every failed run that Dagster will retry
    has its retry (the daemon launches it a moment after the failure), ended too."""
    def done() -> bool:
        runs = instance.get_runs()
        retried = {r.tags.get("dagster/parent_run_id") for r in runs}
        # A run executed in a command's own process has no code location to be retried from.
        return all(r.is_finished for r in runs) and all(
            r.run_id in retried for r in runs
            if r.status == dg.DagsterRunStatus.FAILURE and r.remote_job_origin is not None
            and r.tags.get("dagster/will_retry") == "true")
    wait_for(done, 300, interval=1, what="every run of the instance and its retries to end")


def test_a_run_worker_killed_under_its_code_server_fails_and_the_next_run_goes_on(deployment):
    """Dagster's own detection: the daemon's code server started the run worker and sees its
    process exit."""
    env, instance, workspace, engine = deployment
    kept = fill(engine)
    with slow_batches(engine, 0.5):
        first = launch_run(workspace, JOB, tags={"dagster/partition": PARTITION})
        wait_for(lambda: deleted(engine, kept) >= BATCH, 180, interval=0.2,
                 what="the first batches of the run the daemon launched")
        [worker] = step_processes(instance, first)
        assert worker != os.getpid()
        os.kill(worker, 9)
        following = launch_run(workspace, JOB, tags={"dagster/partition": PARTITION})
        killed = wait_until_finished(instance, first)
    assert killed.status == dg.DagsterRunStatus.FAILURE
    said = f"Run execution process for {first} was terminated by signal 9 (SIGKILL)."
    assert any(said in e.message for e in instance.all_logs(
        first, of_type=dg.DagsterEventType.ENGINE_EVENT)), "the code server saw no exit"
    assert wait_until_finished(instance, following).status == dg.DagsterRunStatus.SUCCESS
    settled(instance)
    assert Rows(engine).ids() == kept


@pytest.mark.parametrize("terminated", [False, True], ids=["left-alone", "terminated-in-the-ui"])
def test_a_run_killed_with_its_own_process_is_ended_by_its_silence_and_the_next_run_goes_on(
        deployment, terminated):
    """No other process watches a run executed in a command's own process (``demo``): killed
    mid-purge, it stays STARTED, holding its policy's and its database's pools (and, once
    "Terminate" is pressed, CANCELING: no code server can interrupt it), until
    ``cleanup_dead_run_sensor`` sees its heartbeat stand still for the timeout and ends it,
    FAILURE (CANCELED when it was CANCELING); the run queued behind it then starts."""
    env, instance, workspace, engine = deployment
    settled(instance)  # the runs (and retries) of the tests before this one are over
    kept = fill(engine)
    mark = f"{terminated}-{os.getpid()}"
    with slow_batches(engine, 0.5):
        demo = subprocess.Popen([sys.executable, "-c", IN_PROCESS_RUN],
                                env={**env, "E2E_DEMO": mark}, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: instance.get_runs(dg.RunsFilter(tags={"e2e/demo": mark}))
                     and deleted(engine, kept) >= BATCH, 180, interval=0.2,
                     what="the first batches of the run in its own process")
        finally:
            demo.kill()  # SIGKILL: no end of the run is written
            demo.wait(30)
    [dead] = instance.get_runs(dg.RunsFilter(tags={"e2e/demo": mark}))
    assert dead.status == dg.DagsterRunStatus.STARTED
    assert HEARTBEAT_TAG in dead.tags
    if terminated:
        answer = terminate_run(workspace, dead.run_id, succeeds=False)
        assert "Unable to terminate run" in answer["message"], answer
        assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.CANCELING
    following = launch_run(workspace, JOB, tags={"dagster/partition": PARTITION})

    ended = wait_until_finished(instance, dead.run_id, timeout=300)
    assert ended.status == (dg.DagsterRunStatus.CANCELED if terminated
                            else dg.DagsterRunStatus.FAILURE)
    [message] = [e.message for e in instance.all_logs(dead.run_id, of_type={
        dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED})]
    assert f"run {dead.run_id}: no heartbeat from its steps for " in message, message
    assert "(timeout 30 s, FAVORITES_RUN_HEARTBEAT_TIMEOUT" in message
    assert wait_until_finished(instance, following).status == dg.DagsterRunStatus.SUCCESS
    # The next run waited for the dead one to be ended: it held the pools until then.
    records = {r.dagster_run.run_id: r for r in instance.get_run_records(
        dg.RunsFilter(run_ids=[dead.run_id, following]))}
    assert records[following].start_time >= records[dead.run_id].end_time
    settled(instance)
    assert Rows(engine).ids() == kept
