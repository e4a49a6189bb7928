"""Who may delete what, through the UI: a deployment as docs/deploying.md runs it.

One deployment serves the module: Dagster's storage and the favorites database on the embedded
PostgreSQL server (the repository's ``dagster.yaml``), ``dagster-daemon run``, the operator's
``dagster-webserver`` on 127.0.0.1 and a second one started with ``--read-only`` for the people
who only watch. The database URL holds a sentinel password and the alert webhook URL a sentinel
token. Everything is read back the way the UI reads it, through GraphQL over HTTP.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil

import pytest
import sqlalchemy as sa

from favorites_maintenance.config.parsers import ALERT_WEBHOOK_URL_VAR
from favorites_maintenance.local.guest_favorites import create_dev_schema
from favorites_maintenance.pipeline.partitions import daily_partitions
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.helpers.dev_stack import (
    ASSET_PATH, LOCATION, REPOSITORY, ROOT, DagsterService, wait_for)
from favorites_maintenance_tests.helpers.jobs import guest_variable
from favorites_maintenance_tests.helpers.resource_keys import ALERTS_KEY, DATABASE_KEY, LIMITS_KEY
from favorites_maintenance_tests.pipeline.test_sensors import Webhook

# One Dagster webserver and daemon at a time, each module's stack started once.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("dagster_stack")]

UTC = dt.timezone.utc
JOB = "guest_favorites_cleanup_job"
RETENTION_DAYS_VAR = guest_variable("retention_days")
TARGET_BATCH_DURATION_VAR = guest_variable("target_batch_duration")
PASSWORD = "pw-SENTINEL-5d1e7a"
TOKEN = "tok-SENTINEL-93b0c4"
NOW = dt.datetime.now(UTC)
PARTITION = daily_partitions.get_last_partition_key()

SELECTOR = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
JOB_SELECTOR = {**SELECTOR, "jobName": JOB}
WIDEN = {"retention_days": 1, "batch_size": 1000, "max_run_duration_seconds": 600}
NO_RETRY = {"favorites__guest_favorites_cleanup": {"ops": {
    op: {"config": {"max_retries": 0}} for op in ("compute_cutoff", "purge")}}}

LAUNCH = """
mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } }
  ... on RunConfigValidationInvalid { errors { message } }
  ... on PythonError { message causes { message } }
  ... on Error { message } } }
"""
TERMINATE = """
mutation($runId: String!) { terminateRun(runId: $runId) { __typename
  ... on TerminateRunFailure { message } ... on Error { message } } }
"""
BACKFILL = """
mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on Error { message } } }
"""
RUN = """
query($runId: ID!) { runOrError(runId: $runId) { __typename ... on Run {
  runId status runConfigYaml tags { key value } } } }
"""
RUNS = "{ runsOrError { ... on Runs { results { runId status } } } }"
LOGS = """
query($runId: ID!) { logsForRun(runId: $runId) { __typename ... on EventConnection { events {
  __typename
  ... on MessageEvent { message level stepKey }
  ... on ErrorEvent { error { message stack className causes { message stack } } }
  ... on ExecutionStepFailureEvent { failureMetadata { label description } }
  ... on MaterializationEvent { metadataEntries { label
    ... on IntMetadataEntry { intRepr } ... on TextMetadataEntry { text } } } } } } }
"""
MATERIALIZATIONS = """
query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { ... on Asset {
  assetMaterializations(limit: 20) { runId partition metadataEntries { label
    ... on IntMetadataEntry { intRepr } ... on TextMetadataEntry { text } } } } } }
"""
RESOURCES = """
query($selector: RepositorySelector!) { allTopLevelResourceDetailsOrError(
    repositorySelector: $selector) { __typename ... on ResourceDetailsList { results {
  name description resourceType
  configFields { name description defaultValueAsJson configTypeKey }
  configuredValues { key value type } } } } }
"""
LAUNCHPAD = """
query($selector: PipelineSelector!, $repository: RepositorySelector!, $set: String!,
      $partition: String!) {
  runConfigSchemaOrError(selector: $selector) { __typename ... on RunConfigSchema {
    rootDefaultYaml } }
  partitionSetOrError(repositorySelector: $repository, partitionSetName: $set) {
    __typename ... on PartitionSet {
    partition(partitionName: $partition) { runConfigOrError { ... on PartitionRunConfig {
      yaml } } } } } }
"""
SCHEDULES = """
query($selector: RepositorySelector!) { schedulesOrError(repositorySelector: $selector) {
  ... on Schedules { results { name scheduleState { id status } } } } }
"""
STOP_SCHEDULE = """
mutation($id: String!) { stopRunningSchedule(id: $id) { __typename ... on Error { message } } }
"""
CAPTURED_KEYS = """
query($runId: ID!) { logsForRun(runId: $runId) { ... on EventConnection { events {
  ... on LogsCapturedEvent { fileKey } } } } }
"""
CAPTURED = """
query($logKey: [String!]!) { capturedLogs(logKey: $logKey) { stdout stderr } }
"""
SENSOR_TICKS = """
query($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) { ... on Sensor {
  sensorState { ticks(limit: 20) { status logKey error { message } } } } } }
"""
DAEMONS = "{ instance { daemonHealth { allDaemonStatuses { daemonType healthy } } } }"


@pytest.fixture(scope="module")
def deployment(pg_server, tmp_path_factory):
    """The daemon, the operator's webserver and a read-only webserver over one instance."""
    tag = f"ui{os.getpid()}"
    home = tmp_path_factory.mktemp("dagster_home")
    os.chmod(home, 0o755)
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    storage = pg_server.ensure_database(f"{tag}_dagster")
    favorites = pg_server.ensure_database(f"{tag}_favorites")
    engine = create_engine(favorites)
    create_dev_schema(engine)
    # The server trusts its local socket, so the password is never checked: it only has to
    # travel everywhere the URL does.
    url = favorites.set(password=PASSWORD).render_as_string(hide_password=False)
    assert PASSWORD in url
    hook = Webhook()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env.update({
        "DAGSTER_HOME": str(home),
        "DAGSTER_POSTGRES_URL": storage.set(drivername="postgresql+psycopg2")
        .render_as_string(hide_password=False),
        DATABASE_URL_VAR: url,
        ALERT_WEBHOOK_URL_VAR: f"{hook.url}/{TOKEN}",
        # Fixed batches, so that a launch's batch size shows in the batch count.
        TARGET_BATCH_DURATION_VAR: "PT0S",
    })
    services = []
    try:
        daemon = DagsterService.start("dagster-daemon", ["run"], env, home / "daemon.log")
        services.append(daemon)
        operator = DagsterService.webserver(env, home / "webserver.log")
        services.append(operator)
        watcher = DagsterService.webserver(env, home / "readonly.log", "--read-only")
        services.append(watcher)
        operator.wait_until_serving()
        watcher.wait_until_serving()

        def daemons_healthy():
            statuses = operator.graphql(DAEMONS)["instance"]["daemonHealth"]
            return all(s["healthy"] for s in statuses["allDaemonStatuses"])

        wait_for(daemons_healthy, timeout=180, interval=2, what="healthy daemons")
        yield Deployment(operator=operator, watcher=watcher, daemon=daemon, engine=engine,
                         rows=Rows(engine), hook=hook, pg_server=pg_server,
                         favorites_db=favorites.database)
    finally:
        for service in reversed(services):
            service.stop()
        hook.close()
        engine.dispose()
        for name in (f"{tag}_favorites", f"{tag}_dagster"):
            with contextlib.suppress(Exception):
                pg_server.drop_database(name)


class Deployment:
    """The running deployment, and every GraphQL answer read from it (:attr:`served`)."""

    def __init__(self, **parts):
        self.__dict__.update(parts)
        self.served: list[str] = []  # every GraphQL answer either webserver gave

    def read(self, server: DagsterService, query: str, variables: dict | None = None) -> dict:
        data = server.graphql(query, variables)
        self.served.append(json.dumps(data))
        return data

    def launch(self, server: DagsterService, retention: dict | None = None,
               ops: dict | None = None) -> dict:
        run_config: dict = {}
        if retention is not None:
            run_config["resources"] = {LIMITS_KEY: {"config": retention}}
        if ops is not None:
            run_config["ops"] = ops
        return self.read(server, LAUNCH, {"params": {
            "selector": JOB_SELECTOR, "runConfigData": run_config,
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": PARTITION}]},
        }})["launchRun"]

    def run(self, run_id: str) -> dict:
        return self.read(self.operator, RUN, {"runId": run_id})["runOrError"]

    def wait_finished(self, run_id: str, timeout: float = 240) -> dict:
        return wait_for(lambda: (run := self.run(run_id))["status"] in (
            "SUCCESS", "FAILURE", "CANCELED") and run, timeout, interval=1,
            what=f"the end of run {run_id}")

    def run_ids(self) -> list[str]:
        return [r["runId"] for r in self.operator.graphql(RUNS)["runsOrError"]["results"]]


def metadata(entries: list[dict]) -> dict:
    return {e["label"]: int(e["intRepr"]) if "intRepr" in e else e.get("text")
            for e in entries}


def test_the_launchpad_cannot_widen_the_rule_and_its_limits_meet_the_bounds(deployment):
    d = deployment
    recent = set(d.rows.add_many(100, updated_at=NOW - dt.timedelta(days=101),
                                 step=dt.timedelta(days=1)))  # idle 2 to 101 days
    old = set(d.rows.add_many(30, updated_at=NOW - dt.timedelta(days=430),
                              step=dt.timedelta(hours=1)))
    accounts = set(d.rows.add_many(20, updated_at=NOW - dt.timedelta(days=900), user_id=7))

    refused = d.launch(d.operator, WIDEN)
    assert refused["__typename"] == "PythonError", refused
    text = refused["message"] + " ".join(c["message"] for c in refused["causes"])
    assert "retention_days=1 refused" in text and RETENTION_DAYS_VAR in text, text
    for limits, bound in [({"batch_size": 0}, "between 1 and 100,000"),
                          ({"batch_size": 1_000_000}, "between 1 and 100,000"),
                          ({"max_run_duration_seconds": 7200}, "between 1 and 3,000"),
                          ({"table": "favorites.accounts"}, "may set only batch_size")]:
        refused = d.launch(d.operator, limits)
        text = refused.get("message", "") + " ".join(c["message"] for c in refused["causes"])
        assert refused["__typename"] == "PythonError" and bound in text, (limits, refused)
    assert d.run_ids() == []  # refused at launch: no run exists
    assert d.rows.ids() == recent | old | accounts

    # Limits within the bounds are a launch's to choose; the rule stays the deployment's.
    launched = d.launch(d.operator, {"batch_size": 7, "max_run_duration_seconds": 120})
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]
    assert d.wait_finished(run_id)["status"] == "SUCCESS", d.daemon.tail()
    assert d.rows.ids() == recent | accounts
    [mat] = [m for m in d.read(d.operator, MATERIALIZATIONS, {"key": {"path": ASSET_PATH}})[
        "assetOrError"]["assetMaterializations"] if m["runId"] == run_id]
    meta = metadata(mat["metadataEntries"])
    assert (meta["retentionDays"], meta["batchSize"]) == (365, 7)
    assert (meta["deletedTotal"], meta["batches"]) == (30, 5)


@contextlib.contextmanager
def table_locked(engine: sa.Engine):
    """Hold an ACCESS EXCLUSIVE lock on the table, so that a run stays in progress (its purge
    waits, fails on its lock timeout and retries) until the block ends."""
    with engine.connect() as conn, conn.begin():
        conn.execute(sa.text("LOCK TABLE favorites.favorites IN ACCESS EXCLUSIVE MODE"))
        yield


def test_a_read_only_webserver_shows_the_asset_and_refuses_launch_and_terminate(deployment):
    d = deployment
    before = set(d.run_ids())
    with table_locked(d.engine):
        launched = d.launch(d.operator)
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]
        wait_for(lambda: d.run(run_id)["status"] == "STARTED", 180, interval=0.5,
                 what="the run in progress")

        refused = {
            "launch": d.launch(d.watcher),
            "terminate": d.read(d.watcher, TERMINATE, {"runId": run_id})["terminateRun"],
            "backfill": d.read(d.watcher, BACKFILL, {"params": {
                "assetSelection": [{"path": ASSET_PATH}], "partitionNames": [PARTITION]}})[
                    "launchPartitionBackfill"],
        }
        [schedule] = d.read(d.watcher, SCHEDULES, {"selector": SELECTOR})[
            "schedulesOrError"]["results"]
        refused["stop schedule"] = d.read(d.watcher, STOP_SCHEDULE, {
            "id": schedule["scheduleState"]["id"]})["stopRunningSchedule"]
        terminate = refused.pop("terminate")
        assert (terminate["__typename"], terminate["message"]) == (
            "TerminateRunFailure", "You do not have permission to terminate this run")
        assert {k: v["__typename"] for k, v in refused.items()} == dict.fromkeys(
            refused, "UnauthorizedError"), refused
        # Nothing happened: the run goes on, no other run or backfill exists.
        assert d.run(run_id)["status"] == "STARTED"
        assert set(d.run_ids()) == before | {run_id}

    assert d.wait_finished(run_id)["status"] == "SUCCESS", d.daemon.tail()
    [schedule] = d.read(d.operator, SCHEDULES, {"selector": SELECTOR})[
        "schedulesOrError"]["results"]
    assert schedule["scheduleState"]["status"] == "RUNNING"
    # What the asset page shows is readable there: every materialization, with its metadata.
    mats = d.read(d.watcher, MATERIALIZATIONS, {"key": {"path": ASSET_PATH}})[
        "assetOrError"]["assetMaterializations"]
    assert {m["runId"] for m in mats} == set(d.run_ids())
    assert all(metadata(m["metadataEntries"])["retentionDays"] == 365 for m in mats)


def test_no_secret_reaches_what_the_webserver_serves(deployment):
    d = deployment
    # A failed run: the favorites database refuses new connections.
    admin = sa.create_engine(d.pg_server.url("postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{d.favorites_db}" ALLOW_CONNECTIONS false'))
        try:
            launched = d.launch(d.operator, ops=NO_RETRY)
            assert launched["__typename"] == "LaunchRunSuccess", launched
            failed_id = launched["run"]["runId"]
            assert d.wait_finished(failed_id)["status"] == "FAILURE", d.daemon.tail()
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(
                    f'ALTER DATABASE "{d.favorites_db}" ALLOW_CONNECTIONS true'))
    finally:
        admin.dispose()
    # The failure sensor (in the daemon) posts to the webhook with the token: it is in use.
    alert = wait_for(lambda: [m for m in d.hook.messages if failed_id in m], 180, interval=2,
                     what="the failure alert on the webhook")[0]
    assert PASSWORD not in alert

    for server in (d.operator, d.watcher):
        resources = d.read(server, RESOURCES, {"selector": SELECTOR})[
            "allTopLevelResourceDetailsOrError"]["results"]
        by_name = {r["name"]: r for r in resources}
        assert DATABASE_URL_VAR in by_name[DATABASE_KEY]["description"]
        assert "365 days" in by_name[LIMITS_KEY]["description"]
        assert ALERT_WEBHOOK_URL_VAR in json.dumps(by_name[ALERTS_KEY])  # by reference
        launchpad = d.read(server, LAUNCHPAD, {
            "selector": {**SELECTOR, "pipelineName": JOB}, "repository": SELECTOR, "partition": PARTITION,
            "set": f"{JOB}_partition_set"})
        assert "batch_size: 1000" in launchpad["runConfigSchemaOrError"]["rootDefaultYaml"]
        assert launchpad["partitionSetOrError"]["__typename"] == "PartitionSet", launchpad
        for run_id in d.run_ids():
            d.read(server, RUN, {"runId": run_id})
            d.read(server, LOGS, {"runId": run_id})["logsForRun"]["events"]
            for key in {e["fileKey"] for e in d.read(server, CAPTURED_KEYS, {"runId": run_id})[
                    "logsForRun"]["events"] if e.get("fileKey")}:
                d.read(server, CAPTURED, {"logKey": [run_id, "compute_logs", key]})
        sensor = d.read(server, SENSOR_TICKS, {"selector": {
            **SELECTOR, "sensorName": "favorites_maintenance_failure_sensor"}})
        for tick in sensor["sensorOrError"]["sensorState"]["ticks"]:
            if tick["logKey"]:
                d.read(server, CAPTURED, {"logKey": tick["logKey"]})

    # What was read is what an operator looks at: the failure names the variable at fault.
    failure = json.dumps(d.read(d.watcher, LOGS, {"runId": failed_id}))
    assert DATABASE_URL_VAR in failure and "not currently accepting connections" in failure
    assert "max_retries: 0" in d.run(failed_id)["runConfigYaml"]
    served = "\n".join(d.served)
    assert alert[:60] in served  # the tick's own log was read
    for secret in (PASSWORD, TOKEN):
        assert secret not in served
