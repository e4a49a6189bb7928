"""Two policies on two databases, through the UI: the code location ``dev`` serves
(``guest_favorites`` on ``FAVORITES_DATABASE_URL`` and ``eu_guest_favorites`` on
``FAVORITES_EU_DATABASE_URL``), run by ``dagster-daemon run`` and read from
``dagster-webserver`` as ``test_ui_access.py`` reads it, through GraphQL over HTTP. Each URL
holds a sentinel password of its own; neither URL reaches anything the webserver serves.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil

import pytest
import sqlalchemy as sa

from favorites_maintenance.config.policy import DATABASE_TAG, database_resource_key
from favorites_maintenance.local.guest_favorites import create_dev_schema
from favorites_maintenance.local.second_database import (
    EU_POLICY,
    EU_URL_VAR,
    write_workspace,
)
from favorites_maintenance.pipeline.partitions import daily_partitions
from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.conftest import Rows
from favorites_maintenance_tests.e2e.test_ui_access import (
    CAPTURED,
    CAPTURED_KEYS,
    DAEMONS,
    LAUNCH,
    LAUNCHPAD,
    LOGS,
    RESOURCES,
    RUN,
    SELECTOR,
)
from favorites_maintenance_tests.helpers.dev_stack import ROOT, DagsterService, wait_for
from favorites_maintenance_tests.helpers.resource_keys import DATABASE_KEY

# One Dagster webserver and daemon at a time, each module's stack started once.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("dagster_stack")]

UTC = dt.timezone.utc
PASSWORDS = {DATABASE_URL_VAR: "pw-FIRST-3a71e0", EU_URL_VAR: "pw-EU-c28f5d"}
JOBS = {DATABASE_URL_VAR: "guest_favorites_cleanup_job",
        EU_URL_VAR: f"{EU_POLICY}_cleanup_job"}
NOW = dt.datetime.now(UTC)
PARTITION = daily_partitions.get_last_partition_key()
#: Run config: no retry of either op that reaches the database. compute_cutoff is the first to,
#: and would otherwise wait out its own retries (5, 10 and 20 s) before the run fails.
NO_RETRY = {f"favorites__{EU_POLICY}_cleanup": {"ops": {
    op: {"config": {"max_retries": 0}} for op in ("compute_cutoff", "purge")}}}


@pytest.fixture(scope="module")
def deployment(pg_server, tmp_path_factory):
    """The daemon and a webserver over dev's code location, each database on the test
    server."""
    tag = f"uidb{os.getpid()}"
    home = tmp_path_factory.mktemp("dagster_home")
    os.chmod(home, 0o755)
    shutil.copyfile(ROOT / "dagster.yaml", home / "dagster.yaml")
    workspace = write_workspace(home)
    storage = pg_server.ensure_database(f"{tag}_dagster")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAVORITES_", "DAGSTER_"))}
    env.update({"DAGSTER_HOME": str(home),
                "DAGSTER_POSTGRES_URL": storage.set(drivername="postgresql+psycopg2")
                .render_as_string(hide_password=False)})
    databases, urls = {}, {}
    for variable in JOBS:
        name = f"{tag}_{variable.lower()}"
        url = pg_server.ensure_database(name)
        engine = create_engine(url)
        create_dev_schema(engine)
        databases[variable] = (name, Rows(engine))
        # The server trusts its socket: the password only travels where the URL does.
        urls[variable] = url.set(password=PASSWORDS[variable]).render_as_string(
            hide_password=False)
        env[variable] = urls[variable]
    services = []
    try:
        services.append(DagsterService.start("dagster-daemon", ["run"], env, home / "daemon.log",
                                             workspace=workspace))
        webserver = DagsterService.webserver(env, home / "webserver.log", workspace=workspace)
        services.append(webserver)
        webserver.wait_until_serving()
        wait_for(lambda: all(s["healthy"] for s in webserver.graphql(DAEMONS)["instance"][
            "daemonHealth"]["allDaemonStatuses"]), timeout=180, interval=2,
            what="healthy daemons")
        yield webserver, databases, urls
    finally:
        for service in reversed(services):
            service.stop()
        for name, rows in databases.values():
            rows.engine.dispose()
        for name in [n for n, _ in databases.values()] + [f"{tag}_dagster"]:
            with contextlib.suppress(Exception):
                pg_server.drop_database(name)


def test_two_databases_run_apart_and_no_url_reaches_the_ui(deployment, pg_server):
    webserver, databases, urls = deployment
    served: list[str] = []

    def read(query: str, variables: dict | None = None) -> dict:
        data = webserver.graphql(query, variables)
        served.append(json.dumps(data))
        return data

    def launch(job: str, ops: dict | None = None) -> str:
        launched = read(LAUNCH, {"params": {
            "selector": {**SELECTOR, "jobName": job},
            "runConfigData": {"ops": ops} if ops else {},
            "executionMetadata": {"tags": [{"key": "dagster/partition", "value": PARTITION}]},
        }})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        return launched["run"]["runId"]

    def finished(run_id: str) -> dict:
        return wait_for(lambda: (run := read(RUN, {"runId": run_id})["runOrError"])[
            "status"] in ("SUCCESS", "FAILURE", "CANCELED") and run, 240, interval=1,
            what=f"the end of run {run_id}")

    old, kept = {}, {}
    for variable, (_, rows) in databases.items():
        old[variable] = set(rows.add_many(40, updated_at=NOW - dt.timedelta(days=430)))
        kept[variable] = set(rows.add_many(10, updated_at=NOW - dt.timedelta(days=10))) | set(
            rows.add_many(5, updated_at=NOW - dt.timedelta(days=900), user_id=3))

    runs = {variable: launch(job) for variable, job in JOBS.items()}
    for variable, run_id in runs.items():
        run = finished(run_id)
        assert run["status"] == "SUCCESS", run
        assert {t["key"]: t["value"] for t in run["tags"]}[DATABASE_TAG] == variable
    for variable, (_, rows) in databases.items():
        assert rows.ids() == kept[variable]  # each run deleted in its own database only

    # The eu database refuses connections: its run fails naming its variable; the other
    # policy's run, launched beside it, succeeds.
    eu_db = databases[EU_URL_VAR][0]
    admin = sa.create_engine(pg_server.url("postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{eu_db}" ALLOW_CONNECTIONS false'))
        try:
            failed_id = launch(JOBS[EU_URL_VAR], NO_RETRY)
            fine_id = launch(JOBS[DATABASE_URL_VAR])
            assert finished(failed_id)["status"] == "FAILURE"
            assert finished(fine_id)["status"] == "SUCCESS"
        finally:
            with admin.connect() as conn:
                conn.execute(sa.text(f'ALTER DATABASE "{eu_db}" ALLOW_CONNECTIONS true'))
    finally:
        admin.dispose()
    failure = json.dumps(read(LOGS, {"runId": failed_id}))
    assert f"policy {EU_POLICY}: its database is {EU_URL_VAR}" in failure
    assert "not currently accepting connections" in failure

    # Everything an operator looks at, for both policies.
    resources = {r["name"]: r for r in read(RESOURCES, {"selector": SELECTOR})[
        "allTopLevelResourceDetailsOrError"]["results"]}
    assert DATABASE_URL_VAR in resources[DATABASE_KEY]["description"]
    eu_resource = resources[database_resource_key(EU_URL_VAR)]
    assert EU_URL_VAR in eu_resource["description"]
    for job in JOBS.values():
        read(LAUNCHPAD, {"selector": {**SELECTOR, "pipelineName": job}, "repository": SELECTOR,
                         "partition": PARTITION, "set": f"{job}_partition_set"})
    for run_id in [*runs.values(), failed_id, fine_id]:
        read(RUN, {"runId": run_id})
        read(LOGS, {"runId": run_id})
        for key in {e["fileKey"] for e in read(CAPTURED_KEYS, {"runId": run_id})[
                "logsForRun"]["events"] if e.get("fileKey")}:
            read(CAPTURED, {"logKey": [run_id, "compute_logs", key]})

    text = "\n".join(served)
    for variable, url in urls.items():
        assert url not in text and PASSWORDS[variable] not in text, variable
