"""The staleness and failure alerts over run histories built at chosen times."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from favorites_maintenance_tests.helpers.dagster_internals import sensor_cursor_command
from favorites_maintenance.pipeline.dagster_internals import TickStatus
from favorites_maintenance_tests.helpers.dagster_internals import freeze_time

import favorites_maintenance
from favorites_maintenance.components.policy_tree import load_policies
from favorites_maintenance.pipeline.failure_sensor import FAILURE_SENSOR
from favorites_maintenance.pipeline.resources import AlertSink
from favorites_maintenance.pipeline.stale_sensor import STALE_SENSOR, build_stale_sensor
from favorites_maintenance.pipeline.tick_failure_sensor import TICK_FAILURE_SENSOR
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.jobs import JOB, POLICY, load_code_location
from favorites_maintenance_tests.helpers.policies import favorites_policy, policy_sandbox
from favorites_maintenance_tests.helpers.resource_keys import ALERTS_KEY
from favorites_maintenance_tests.helpers.sensors import react_to_failures

UTC = dt.timezone.utc
H = 3600.0
# A Monday, 03:00 UTC: the default schedule's tick time.
T0 = dt.datetime(2026, 10, 5, 3, 0, tzinfo=UTC).timestamp()


class Webhook:
    """A local Slack-compatible endpoint recording what it receives."""

    def __init__(self):
        self.messages: list[str] = []
        self.status = 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.messages.append(json.loads(body)["text"])
                self.send_response(hook.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture
def failing_ticks(monkeypatch, webhook):
    """The guest-favorites schedule ticking every minute and alerting to ``webhook``, with no
    database variable: every tick fails before any run exists."""
    monkeypatch.delenv(DATABASE_URL_VAR, raising=False)
    monkeypatch.setenv("FAVORITES_GUEST_RETENTION_CRON", "* * * * *")
    monkeypatch.setenv("FAVORITES_GUEST_RETENTION_PARTITIONS_START", "2026-01-01")
    monkeypatch.setenv("FAVORITES_ALERT_WEBHOOK_URL", webhook.url)


@pytest.fixture
def defs(db_url, monkeypatch):
    return load_code_location(db_url, monkeypatch)


@pytest.fixture
def job(defs):
    return defs.resolve_job_def(JOB)


def guest_policy(stale_after: dt.timedelta | None = None):
    """The guest-favorites policy, as the code location reads it from ``defs/`` (with
    ``stale_after``, when given)."""
    [policy] = [p for p in load_policies() if p.name == POLICY]
    if stale_after is None:
        return policy
    return dataclasses.replace(
        policy, settings=dataclasses.replace(policy.settings, stale_after=stale_after))


def outcome(skip_message: str, policy: str = POLICY) -> str:
    """What a tick of a sensor serving one policy says of it: ``fresh`` of ``fresh:
    guest_favorites``."""
    said, name = skip_message.rsplit(": ", 1)
    assert name == policy, skip_message
    return said


class Watch:
    """Evaluates the sensor at chosen instants, carrying its cursor from tick to tick."""

    def __init__(self, instance, webhook, stale_after=dt.timedelta(hours=48)):
        self.instance = instance
        self.webhook = webhook
        self.now = T0
        self.cursor = None
        self.sensor = build_stale_sensor([guest_policy(stale_after)], clock=lambda: self.now)
        self.sink = AlertSink(webhook_url=webhook.url, attempts=2, timeout_seconds=2)

    def tick(self, at: float) -> str:
        self.now = at
        ctx = dg.build_sensor_context(instance=self.instance, cursor=self.cursor,
                                      resources={ALERTS_KEY: self.sink})
        result = self.sensor(ctx)
        self.cursor = ctx.cursor
        return outcome(result.skip_message)


def run_at(job, instance, at: float, partition: str | None = None, **kwargs):
    """Run the real job with Dagster's clock frozen at ``at`` (epoch seconds)."""
    if partition is None:  # the schedule's choice: the day before
        partition = (dt.datetime.fromtimestamp(at, UTC) - dt.timedelta(days=1)).date().isoformat()
    with freeze_time(at):
        return job.execute_in_process(partition_key=partition, instance=instance,
                                      raise_on_error=False, **kwargs)


def test_fresh_deployment_alerts_only_after_the_threshold_then_once(webhook):
    with dg.instance_for_test() as instance:
        watch = Watch(instance, webhook)
        assert watch.tick(T0) == "fresh"
        assert watch.tick(T0 + 47 * H) == "fresh"
        assert webhook.messages == []
        assert watch.tick(T0 + 49 * H) == "alerted"
        assert watch.tick(T0 + 50 * H) == "stale, already alerted"
        assert watch.tick(T0 + 80 * H) == "stale, already alerted"
    assert len(webhook.messages) == 1
    assert "no successful run for more than 48 h" in webhook.messages[0]


def test_47h_after_a_success_is_fresh_49h_alerts_and_a_new_success_resolves(job, webhook):
    with dg.instance_for_test() as instance:
        watch = Watch(instance, webhook)
        assert watch.tick(T0 - 100 * H) == "fresh"  # deployed long ago
        assert run_at(job, instance, T0).success
        assert watch.tick(T0 + 47 * H) == "fresh"
        assert watch.tick(T0 + 49 * H) == "alerted"
        assert run_at(job, instance, T0 + 50 * H).success
        assert watch.tick(T0 + 50.5 * H) == "resolved"
        assert watch.tick(T0 + 51 * H) == "fresh"
    assert len(webhook.messages) == 2
    assert webhook.messages[1].startswith("guest_favorites_cleanup: resolved")


def test_failed_runs_and_old_partition_backfills_do_not_reset_the_clock(job, webhook, engine):
    with dg.instance_for_test() as instance:
        watch = Watch(instance, webhook)
        watch.tick(T0 - 100 * H)
        assert run_at(job, instance, T0).success
        # A backfill of a day three weeks back succeeds at T0 + 40 h: not a current success.
        assert run_at(job, instance, T0 + 40 * H, partition="2026-09-14").success
        # A run at T0 + 45 h fails: the table is gone.
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE favorites.favorites RENAME TO gone"))
        failed = run_at(job, instance, T0 + 45 * H)
        assert failed.dagster_run.status == dg.DagsterRunStatus.FAILURE
        assert watch.tick(T0 + 49 * H) == "alerted"


def test_a_tick_during_the_run_that_succeeds_does_not_hide_that_success(job, webhook):
    """A tick between the materialization and the end of its run (the run not SUCCESS yet)
    does not count it, and the next tick, after the run succeeded, does: an asset whose
    newest materialization was already looked at is skipped only once its run has ended."""
    with dg.instance_for_test() as instance:
        watch = Watch(instance, webhook)
        watch.tick(T0 - 100 * H)  # deployed long ago
        mid_run = []

        @dg.success_hook
        def tick_mid_run(context):
            if context.op.name == "measure_backlog":  # the step that materializes
                run = context.instance.get_run_by_id(context.run_id)
                mid_run.append((run.status, watch.tick(T0 + 0.1 * H)))

        assert run_at(job.with_hooks({tick_mid_run}), instance, T0).success
        assert mid_run == [(dg.DagsterRunStatus.STARTED, "alerted")]
        assert watch.tick(T0 + 0.2 * H) == "resolved"
        assert watch.tick(T0 + 0.3 * H) == "fresh"
    assert webhook.messages[1].startswith(
        "guest_favorites_cleanup: resolved, a run succeeded at 2026-10-05T03:00")


def test_a_large_history_of_other_jobs_does_not_count(job, webhook):
    with dg.instance_for_test() as instance:
        for _ in range(1000):
            instance.add_run(dg.DagsterRun(job_name="some_other_job", run_id=str(uuid.uuid4()),
                                           status=dg.DagsterRunStatus.SUCCESS))
        watch = Watch(instance, webhook)
        watch.tick(T0 - 100 * H)
        assert watch.tick(T0) == "alerted"


def test_a_failing_webhook_never_crashes_the_tick(webhook, caplog):
    webhook.status = 500
    with dg.instance_for_test() as instance:
        watch = Watch(instance, webhook)
        watch.tick(T0)
        assert watch.tick(T0 + 49 * H) == "alerted"  # logged even though the POST failed
    assert len(webhook.messages) == 2  # two attempts
    assert webhook.url not in caplog.text


def test_an_unreachable_webhook_never_crashes_the_tick(webhook):
    webhook.close()
    with dg.instance_for_test() as instance:
        watch = Watch(instance, webhook)
        watch.tick(T0)
        assert watch.tick(T0 + 49 * H) == "alerted"


def test_a_failed_run_alerts_with_the_policy_asset_partition_cause_and_run_page(
        defs, job, webhook, engine):
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE favorites.favorites"))
    sink = AlertSink(webhook_url=webhook.url, webserver_base_url="https://dagster.example.internal")
    with dg.instance_for_test() as instance:
        result = run_at(job, instance, T0)
        acted_on = react_to_failures(defs, FAILURE_SENSOR, instance, sink)
    assert acted_on == [result.run_id]
    [message] = webhook.messages
    # The cause as the run's log words it: the error's type, then its privacy-safe message.
    assert message.startswith(
        f"guest_favorites cleanup failed: asset favorites/guest_favorites_cleanup, partition "
        f"2026-10-04, launched from the UI or the API, run {result.run_id}: TableShapeError: "
        "table favorites.favorites does not exist"), message
    assert message.endswith(f". https://dagster.example.internal/runs/{result.run_id}")
    assert "__ASSET_JOB" not in message and "Steps failed" not in message


def test_raising_the_threshold_after_an_alert_resolves_it_without_a_success(webhook):
    with dg.instance_for_test() as instance:
        watch = Watch(instance, webhook)
        watch.tick(T0)
        assert watch.tick(T0 + 49 * H) == "alerted"
        cursor = watch.cursor
        raised = Watch(instance, webhook, stale_after=dt.timedelta(hours=72))
        raised.cursor = cursor
        assert raised.tick(T0 + 50 * H) == "resolved"
        assert raised.tick(T0 + 73 * H) == "alerted"
    assert "within the threshold of 72 h" in webhook.messages[1]


def test_without_a_cursor_the_clock_is_the_last_success_in_the_history(job, webhook):
    """A new deployment, a reset or renamed sensor, a migrated instance: the first tick finds
    the last successful current run, however old, and alerts at once when it is stale."""
    stale_after = dt.timedelta(seconds=2)
    with dg.instance_for_test() as instance:
        yesterday = (dt.datetime.now(UTC) - dt.timedelta(days=1)).date().isoformat()
        assert job.execute_in_process(partition_key=yesterday, instance=instance).success
        time.sleep(3)  # the run is now older than stale_after
        sensor = build_stale_sensor([guest_policy(stale_after)])
        sink = AlertSink(webhook_url=webhook.url, attempts=1)
        ctx = dg.build_sensor_context(instance=instance, resources={ALERTS_KEY: sink})
        assert outcome(sensor(ctx).skip_message) == "alerted"
        again = dg.build_sensor_context(instance=instance, cursor=ctx.cursor,
                                        resources={ALERTS_KEY: sink})
        assert outcome(sensor(again).skip_message) == "stale, already alerted"
    [message] = webhook.messages
    assert "no successful run for more than 0.000555556 h" in message
    assert "last successful run at" in message


def test_without_a_cursor_a_success_months_ago_alerts_on_the_first_tick(job, webhook):
    with dg.instance_for_test() as instance:
        assert run_at(job, instance, T0 - 24 * 3600 * 70).success  # 70 days before T0
        # Later, a week of old days backfilled: none of them restarts the clock.
        for day in range(7):
            assert run_at(job, instance, T0 - 6 * H,
                          partition=f"2026-09-{10 + day:02d}").success
        watch = Watch(instance, webhook)
        assert watch.tick(T0) == "alerted"
        assert "last successful run at 2026-07-27T03:00:00+00:00" in webhook.messages[0]


def test_without_a_cursor_and_no_success_ever_the_clock_starts_at_the_first_tick(job, webhook):
    with dg.instance_for_test() as instance:
        assert run_at(job, instance, T0 - 6 * H, partition="2026-09-01").success  # a backfill
        watch = Watch(instance, webhook)
        assert watch.tick(T0) == "fresh"
        assert watch.tick(T0 + 47 * H) == "fresh"
        assert watch.tick(T0 + 49 * H) == "alerted"
        assert "none since watching began at 2026-10-05T03:00:00+00:00" in webhook.messages[0]


def test_a_failed_schedule_tick_alerts_once_then_resolves(dagster_storage_url, db_url, webhook,
                                                          monkeypatch, failing_ticks):
    """The code location served without FAVORITES_DATABASE_URL: the scheduler's tick fails
    before any run exists. The tick-failure sensor, in the same daemon pass, alerts once; the
    location served again with the variable set, the next tick succeeds and it resolves."""
    from favorites_maintenance_tests.helpers.daemon import code_location, pg_instance, scheduler_and_sensors

    start = dt.datetime(2026, 10, 5, 3, 0, 30, tzinfo=UTC)
    minute = dt.timedelta(minutes=1)
    with pg_instance(dagster_storage_url) as instance:
        with code_location(instance) as workspace:
            scheduler_and_sensors(workspace, start)  # the scheduler first sees the schedule
            assert webhook.messages == []
            scheduler_and_sensors(workspace, start + minute)  # the 03:01 tick fails
            assert len(webhook.messages) == 1
            scheduler_and_sensors(workspace, start + 2 * minute)  # fails again: same episode
            assert len(webhook.messages) == 1
            assert instance.get_runs() == []
        monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
        with code_location(instance) as workspace:
            scheduler_and_sensors(workspace, start + 3 * minute)
            [run] = instance.get_runs()  # the 03:03 tick created its run
            assert run.tags["dagster/partition"] == "2026-10-04"
        sensor_ticks = _ticks(instance, TICK_FAILURE_SENSOR)
    failed, resolved = webhook.messages
    assert failed.startswith("guest_favorites_cleanup_schedule: the tick at "
                             "2026-10-05T03:01:00+00:00 failed and started no cleanup run")
    assert "FAVORITES_DATABASE_URL" in failed and "not set" in failed
    assert resolved.startswith("guest_favorites_cleanup_schedule: resolved, the tick at "
                               "2026-10-05T03:03:00+00:00 succeeded")
    assert [outcome(t.skip_reason) for t in sensor_ticks][:3] == [
        "resolved", "failing, already alerted", "alerted"]


def _ticks(instance, name):
    """The ticks of instigator ``name``, newest first."""
    [state] = [s for s in instance.all_instigator_state() if s.instigator_name == name]
    return instance.get_ticks(state.instigator_origin_id, state.selector_id)


#: Cursors no sensor of this project writes: set by hand, or left by an older sensor of the
#: same name (another sensor's JSON, a number, a list).
FOREIGN_CURSORS = ["5", "not json", "[1, 2]",
                   '{"__class__": "RunStatusSensorCursor", "record_id": 9}',
                   # Numbers JSON does not have, which Python reads: no instant at all.
                   '{"policies": {"%s": {"since": NaN, "lastSuccess": null}}}' % POLICY,
                   '{"policies": {"%s": {"since": Infinity}}}' % POLICY,
                   '{"policies": {"%s": {"since": 1e400}}}' % POLICY]


@pytest.mark.parametrize("cursor", FOREIGN_CURSORS)
def test_a_cursor_the_staleness_sensor_did_not_write_is_treated_as_none(job, webhook, cursor):
    """The tick looks the last success up in the history, as a fresh deployment's first tick
    does, alerts at once, and writes its own cursor: the 48-hour alarm is not silenced."""
    with dg.instance_for_test() as instance:
        assert run_at(job, instance, T0 - 72 * H).success
        watch = Watch(instance, webhook)
        watch.cursor = cursor
        assert watch.tick(T0) == "alerted"
        assert json.loads(watch.cursor)["policies"][POLICY]["lastSuccess"] == T0 - 72 * H
        assert watch.tick(T0 + H) == "stale, already alerted"
    [message] = webhook.messages
    assert "last successful run at 2026-10-02T03:00:00+00:00" in message


def set_cursor(sensor: str, value: str) -> None:
    """``dagster sensor cursor SENSOR --set VALUE -w workspace.yaml`` on the instance of
    ``DAGSTER_HOME``."""
    workspace = Path(favorites_maintenance.__file__).parent.parent / "workspace.yaml"
    result = CliRunner().invoke(sensor_cursor_command, [
        sensor, "--set", value, "-w", str(workspace)])
    assert result.exit_code == 0, result.output
    assert f'Set cursor state for sensor {sensor} to "{value}"' in result.output


def test_cursors_set_by_hand_leave_the_failure_alerts_working(dagster_storage_url, db_url,
                                                              engine, webhook, monkeypatch,
                                                              failing_ticks):
    """The run-failure and tick-failure sensors given cursors they did not write, by
    ``dagster sensor cursor --set``: their ticks succeed, write their own cursors and send the
    alerts a fresh deployment would owe (the failed tick; the next failed run)."""
    from favorites_maintenance_tests.helpers.daemon import (
        code_location,
        pg_instance,
        scheduler_and_sensors,
    )

    tick_sensor = TICK_FAILURE_SENSOR
    run_sensor = FAILURE_SENSOR
    start = dt.datetime(2026, 10, 5, 3, 0, 30, tzinfo=UTC)
    minute = dt.timedelta(minutes=1)
    with pg_instance(dagster_storage_url, run_in_process=True) as instance:
        with code_location(instance) as workspace:  # served without FAVORITES_DATABASE_URL
            scheduler_and_sensors(workspace, start)  # the sensors write their first cursors
            scheduler_and_sensors(workspace, start + minute)  # the 03:01 tick fails: alerted
            assert len(webhook.messages) == 1
            set_cursor(tick_sensor, "[1, 2]")
            set_cursor(run_sensor, "not json")
            scheduler_and_sensors(workspace, start + 2 * minute)  # the 03:02 tick fails too
            # The cursor forgot the episode: alerted again.
            assert len(webhook.messages) == 2, _story(instance, webhook, [
                tick_sensor, "guest_favorites_cleanup_schedule"])
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE favorites.favorites"))  # runs will fail
        monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
        with code_location(instance) as workspace:
            # The 03:03 tick succeeds, its run fails, the failure sensor alerts in that pass.
            scheduler_and_sensors(workspace, start + 3 * minute)
            [run] = instance.get_runs()
            assert run.status == dg.DagsterRunStatus.FAILURE
        ticks = {name: _ticks(instance, name) for name in (tick_sensor, run_sensor)}
        cursors = {name: _state(instance, name).instigator_data.cursor
                   for name in (tick_sensor, run_sensor)}
    assert all(t.status != TickStatus.FAILURE for name in ticks for t in ticks[name])
    assert json.loads(cursors[tick_sensor]) == {"failingSince": {}}
    assert json.loads(cursors[run_sensor])["__class__"] == "RunStatusSensorCursor"
    failed_ticks = [m for m in webhook.messages if "failed and started no cleanup run" in m]
    assert [m.split(" failed")[0] for m in failed_ticks] == [
        "guest_favorites_cleanup_schedule: the tick at 2026-10-05T03:01:00+00:00",
        "guest_favorites_cleanup_schedule: the tick at 2026-10-05T03:02:00+00:00"]
    [failed_run] = [m for m in webhook.messages
                    if m.startswith("guest_favorites cleanup failed: ")]
    assert run.run_id in failed_run and "failed" in failed_run


def _story(instance, webhook, names) -> str:
    """What a failed assertion on alerts shows: the messages received, then each instigator
    of ``names`` with its state's cursor and its ticks (time, status, skip reason, error)."""
    lines = [f"messages: {webhook.messages}"]
    for name in names:
        data = _state(instance, name).instigator_data
        lines.append(f"{name}: cursor {getattr(data, 'cursor', None)!r}, last tick "
                     f"{getattr(data, 'last_tick_timestamp', None)}")
        lines += [f"  {t.timestamp} {t.status.value} {t.skip_reason!r} "
                  f"{' '.join(t.error.message.split())[:300] if t.error else ''}" for t in _ticks(instance, name)]
    return "\n".join(lines)


def _state(instance, name):
    [state] = [s for s in instance.all_instigator_state() if s.instigator_name == name]
    return state


#: A second policy on the guest-favorites table beside the real one.
SECOND = "second_favorites"
SECOND_JOB = "second_favorites_cleanup_job"


@pytest.fixture
def two_policies(db_url, monkeypatch):
    """The code location of the real guest-favorites policy and :data:`SECOND`."""
    with policy_sandbox(favorites_policy(SECOND)) as sandbox, sandbox.tree() as tree:
        yield load_code_location(db_url, monkeypatch, tree=tree)


def stale_tick(defs, instance, sink, cursor=None) -> tuple[str, str | None]:
    """One tick of the code location's staleness sensor, as Dagster evaluates it (its
    repository on the context): its skip message and the cursor it wrote."""
    with dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                 resources={ALERTS_KEY: sink}) as ctx:
        said = defs.resolve_sensor_def(STALE_SENSOR)(ctx).skip_message
        return said, ctx.cursor


def test_one_sensor_of_each_kind_serves_every_policy_and_each_alert_names_its_policy(
        two_policies, webhook, engine):
    defs = two_policies
    assert {s.name for s in defs.get_repository_def().sensor_defs} == {
        STALE_SENSOR, FAILURE_SENSOR, TICK_FAILURE_SENSOR, "cleanup_dead_run_sensor"}
    sink = AlertSink(webhook_url=webhook.url, attempts=1)
    now = time.time()
    with dg.instance_for_test() as instance:
        # Guest favorites succeeded an hour ago; the second policy last 70 days ago.
        assert run_at(defs.resolve_job_def(JOB), instance, now - H).success
        assert run_at(defs.resolve_job_def(SECOND_JOB), instance, now - 70 * 24 * H).success
        said, cursor = stale_tick(defs, instance, sink)
        assert said == f"fresh: {POLICY}; alerted: {SECOND}"
        [stale] = webhook.messages
        assert stale.startswith(f"{SECOND}_cleanup: no successful run for more than 48 h"), stale
        state = json.loads(cursor)["policies"]
        assert state[POLICY]["lastSuccess"] == pytest.approx(now - H, abs=1)
        assert state[SECOND]["lastSuccess"] == pytest.approx(now - 70 * 24 * H, abs=1)
        said, _ = stale_tick(defs, instance, sink, cursor)  # once per episode
        assert said == f"fresh: {POLICY}; stale, already alerted: {SECOND}"
        assert len(webhook.messages) == 1

        # Both policies' runs fail: one alert each, naming its policy and asset.
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE favorites.favorites"))
        failed = {name: run_at(defs.resolve_job_def(f"{name}_cleanup_job"), instance, now)
                  for name in (POLICY, SECOND)}
        webhook.messages.clear()
        acted_on = react_to_failures(defs, FAILURE_SENSOR, instance, sink)
    assert sorted(acted_on) == sorted(r.run_id for r in failed.values())
    assert len(webhook.messages) == 2
    for name, result in failed.items():
        [alert] = [m for m in webhook.messages if result.run_id in m]
        assert alert.startswith(f"{name} cleanup failed: asset favorites/{name}_cleanup, "), alert


def test_a_deployment_moving_from_the_per_policy_sensors_gets_no_burst_of_alerts(
        two_policies, webhook):
    """An instance whose policies were watched by sensors of their own: the shared sensor's
    first tick has no cursor, looks up each policy's last success and alerts for none of the
    policies that succeeded an hour ago."""
    defs = two_policies
    sink = AlertSink(webhook_url=webhook.url, attempts=1)
    now = time.time()
    with dg.instance_for_test() as instance:
        for job in (JOB, SECOND_JOB):
            assert run_at(defs.resolve_job_def(job), instance, now - H).success
        said, cursor = stale_tick(defs, instance, sink)
    assert said == f"fresh: {POLICY}, {SECOND}"
    assert webhook.messages == []
    assert {name: state["lastSuccess"] for name, state in json.loads(cursor)["policies"].items()
            } == pytest.approx({POLICY: now - H, SECOND: now - H}, abs=1)


def test_lookups_past_the_tick_s_budget_wait_for_the_next_tick(two_policies, webhook,
                                                                 monkeypatch):
    """A tick meeting many policies without state looks up their last successes for a bounded
    time (a sensor's evaluation must end within Dagster's limit); the others are looked up by
    the next ticks, and none alerts before it was looked up."""
    from favorites_maintenance.pipeline import stale_sensor

    defs = two_policies
    monkeypatch.setattr(stale_sensor, "LOOKUP_BUDGET_S", 0.0)  # one lookup per tick
    sink = AlertSink(webhook_url=webhook.url, attempts=1)
    now = time.time()
    with dg.instance_for_test() as instance:
        for job in (JOB, SECOND_JOB):
            assert run_at(defs.resolve_job_def(job), instance, now - 70 * 24 * H).success
        said, cursor = stale_tick(defs, instance, sink)
        assert said == f"alerted: {POLICY}; last success not looked up yet: {SECOND}"
        assert list(json.loads(cursor)["policies"]) == [POLICY]
        said, cursor = stale_tick(defs, instance, sink, cursor)
        assert said == f"stale, already alerted: {POLICY}; alerted: {SECOND}"
    assert [m.split(":")[0] for m in webhook.messages] == [
        f"{POLICY}_cleanup", f"{SECOND}_cleanup"]


def test_the_tick_failure_sensor_alerts_each_failing_schedule_by_name(
        dagster_storage_url, webhook, failing_ticks):
    """Two policies whose schedule ticks fail (no database variable): the one tick-failure
    sensor, in the daemon's pass, alerts once for each schedule, naming it, then holds."""
    from favorites_maintenance_tests.helpers.daemon import (
        code_location,
        pg_instance,
        scheduler_and_sensors,
    )

    start = dt.datetime(2026, 10, 5, 3, 0, 30, tzinfo=UTC)
    minute = dt.timedelta(minutes=1)
    with policy_sandbox(favorites_policy(SECOND, cron="* * * * *")) as sandbox, \
            pg_instance(dagster_storage_url) as instance, \
            code_location(instance, sandbox.location_target()) as workspace:
        scheduler_and_sensors(workspace, start)  # the scheduler first sees the schedules
        scheduler_and_sensors(workspace, start + minute)  # both 03:01 ticks fail
        scheduler_and_sensors(workspace, start + 2 * minute)  # and again: same episodes
        [tick, *_] = _ticks(instance, TICK_FAILURE_SENSOR)
    assert sorted(m.split(": the tick at 2026-10-05T03:01:00+00:00 failed")[0]
                  for m in webhook.messages) == [
        f"{POLICY}_cleanup_schedule", f"{SECOND}_cleanup_schedule"]
    assert tick.skip_reason == f"failing, already alerted: {POLICY}, {SECOND}"
