"""End to end, as an operator runs it: ``favorites-maintenance dev`` in a fresh checkout.

One stack serves the whole module: the embedded PostgreSQL server holding Dagster's storage (the
repository's ``dagster.yaml``, ``postgresql+psycopg2``) and a seeded favorites database, and
``dagster dev`` running the real webserver and daemon with the schedule on every minute. The
tests read everything back the way the UI does, over HTTP on 127.0.0.1, and the last one stops
the stack with Ctrl-C. Whatever fails, the module's teardown leaves no process behind.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from favorites_maintenance.pipeline.partitions import daily_partitions
from favorites_maintenance.local.processes import alive, port_in_use
from favorites_maintenance_tests.helpers.system_packages import missing
from favorites_maintenance_tests.helpers.dev_stack import (
    ASSET_PATH, LOCATION, REPOSITORY, ROOT, DevStack, chromium, chromium_binary, visible_text,
    wait_for)

# One Dagster webserver and daemon at a time, each module's stack started once.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("dagster_stack")]

UTC = dt.timezone.utc
#: The guest-favorites policy's schedule (a public name).
SCHEDULE_NAME = "guest_favorites_cleanup_schedule"
DAYS = 365
#: Backfills launched by the tests: id -> partitions, for the later tests reading their checks.
BACKFILLED: dict[str, list[str]] = {}
SEED_ROWS = 5000
ELSEWHERE = "postgresql+psycopg://someone:elsewhere-secret@127.0.0.1:9/production"
ARTIFACTS = Path(os.environ.get("FAVORITES_TEST_ARTIFACTS", ROOT / "test-artifacts"))

RUNS = """
{ runsOrError { ... on Runs { results {
    runId jobName status startTime endTime tags { key value } } } } }
"""
MATERIALIZATIONS = """
query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { ... on Asset {
  assetMaterializations(limit: 50) { runId partition timestamp metadataEntries {
    __typename label
    ... on IntMetadataEntry { intRepr }
    ... on FloatMetadataEntry { floatValue }
    ... on TextMetadataEntry { text } } } } } }
"""
ASSET_NODE = """
query($key: AssetKeyInput!) { assetNodeOrError(assetKey: $key) { ... on AssetNode {
  assetChecksOrError { ... on AssetChecks { checks { name } } }
  internalFreshnessPolicy { __typename
    ... on TimeWindowFreshnessPolicy { failWindowSeconds warnWindowSeconds } } } } }
"""
SCHEDULE = """
query($selector: ScheduleSelector!) { scheduleOrError(scheduleSelector: $selector) {
  ... on Schedule { cronSchedule scheduleState { id status } } } }
"""
STOP_SCHEDULE = """
mutation($id: String!) { stopRunningSchedule(id: $id) { __typename
  ... on ScheduleStateResult { scheduleState { status } }
  ... on PythonError { message } } }
"""
CHECK_EXECUTIONS = """
query($key: AssetKeyInput!, $name: String!) {
  assetCheckExecutions(assetKey: $key, checkName: $name, limit: 100) {
    runId status partition evaluation { severity } } }
"""
CHECKS = ("no_guest_row_older_than_retention_plus_one_day", "deleted_total_spike",
          "no_rows_skipped")
JOB_NAME = "guest_favorites_cleanup_job"
LAUNCH_RUN = """
mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }
"""
BACKFILL = """
mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    checkout = tmp_path_factory.mktemp("checkout")
    dev = DevStack.start(checkout, rows=SEED_ROWS, env_extra={
        "FAVORITES_GUEST_RETENTION_CRON": "* * * * *",
        # An exported URL of another database: dev must never touch it.
        "FAVORITES_DATABASE_URL": ELSEWHERE})
    try:
        dev.wait_until_serving()
        yield dev
    finally:
        dev.force_cleanup()


def key_vars():
    return {"key": {"path": ASSET_PATH}}


def runs(stack) -> list[dict]:
    """Every run of the instance, newest first, with its tags as a dict."""
    found = stack.graphql(RUNS)["runsOrError"]["results"]
    for run in found:
        run["tags"] = {t["key"]: t["value"] for t in run["tags"]}
    return found


def materializations(stack) -> list[dict]:
    """The asset's materializations, newest first, with their metadata as a dict."""
    found = stack.graphql(MATERIALIZATIONS, key_vars())["assetOrError"]["assetMaterializations"]
    for mat in found:
        meta = {}
        for entry in mat["metadataEntries"]:
            kind = entry["__typename"]
            meta[entry["label"]] = (int(entry["intRepr"]) if kind == "IntMetadataEntry"
                                    else entry.get("floatValue", entry.get("text")))
        mat["metadata"] = meta
    return found


def seed_summary(stack) -> tuple[int, int]:
    """Guest and account rows the dev command seeded, from what it printed."""
    import re

    match = re.search(r"([\d,]+) rows, ([\d,]+) guest, ([\d,]+) account", stack.output())
    assert match, stack.tail()
    return int(match[2].replace(",", "")), int(match[3].replace(",", ""))


def test_dev_prints_the_ui_address_and_seeds_its_own_favorites_database(stack):
    from favorites_maintenance.local.processes import wait_for

    # Said once the UI answers (the webserver's own "Serving" line comes first), not before.
    def said() -> str | None:
        text = stack.output()
        return text if f"Dagster UI: {stack.url}" in text else None

    out = wait_for(said, 30, what="the UI's address in dev's output")
    assert out.index("Serving dagster-webserver on") < out.index(f"Dagster UI: {stack.url}")
    assert f"{stack.url}/assets/favorites/guest_favorites_cleanup" in out
    guests, accounts = seed_summary(stack)
    assert guests + accounts == SEED_ROWS and guests > 0 and accounts > 0
    # The exported URL was ignored, said so, and never shown.
    assert "FAVORITES_DATABASE_URL is ignored by dev" in out
    assert "elsewhere-secret" not in out
    # Dagster's warnings a user of dev cannot act on stay off its output.
    assert "SupersessionWarning" not in out and "BetaWarning" not in out, out
    # Dagster's storage is the embedded server's "dagster" database, through psycopg2.
    home = stack.checkout / ".favorites-maintenance" / "dagster_home"
    assert (home / "dagster.yaml").read_text() == (ROOT / "dagster.yaml").read_text()
    schedule = stack.graphql(SCHEDULE, {"selector": {
        "repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
        "scheduleName": SCHEDULE_NAME}})["scheduleOrError"]
    assert schedule["cronSchedule"] == "* * * * *"
    assert schedule["scheduleState"]["status"] == "RUNNING"


ASSETS = """
{ assetNodes { assetKey { path } jobNames } }
"""


def test_dev_serves_two_policies_on_two_databases(stack):
    """The second embedded database and its policy: their own asset, job, resource and run
    tag, beside the guest-favorites policy."""
    out = stack.output()
    assert ("second database: favorites_eu (FAVORITES_EU_DATABASE_URL), policy "
            "eu_guest_favorites") in out
    assert "database_favorites_eu_database_url: 1" in out  # its pool, written by dev
    assets = {"/".join(n["assetKey"]["path"]): n["jobNames"]
              for n in stack.graphql(ASSETS)["assetNodes"]}
    assert "eu_guest_favorites_cleanup_job" in assets[
        "favorites/eu_guest_favorites_cleanup"]
    assert "guest_favorites_cleanup_job" in assets["favorites/guest_favorites_cleanup"]


def launch_day(stack, partition: str) -> str:
    """Launch the job for one day as the UI's launchpad does; return the run's id."""
    launched = stack.graphql(LAUNCH_RUN, {"params": {
        "selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
                     "jobName": JOB_NAME},
        "runConfigData": {},
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]}}})
    assert launched["launchRun"]["__typename"] == "LaunchRunSuccess", launched
    return launched["launchRun"]["run"]["runId"]


def test_the_pool_keeps_a_second_run_queued_while_one_runs(stack):
    """A backfill of two days from the UI's API, which is one run over both days, and two runs
    of one day launched at the same moment: one run at a time, whatever launched it (the
    schedule's runs of the job queue behind them, and the other way round)."""
    partitions = daily_partitions.get_partition_keys()[-4:-2]
    launched = stack.graphql(BACKFILL, {"params": {
        "assetSelection": [{"path": ASSET_PATH}], "partitionNames": partitions}})
    backfill_id = launched["launchPartitionBackfill"]["backfillId"]
    BACKFILLED[backfill_id] = partitions
    days = [launch_day(stack, p) for p in partitions]

    snapshots = []

    def all_done():
        current = runs(stack)
        snapshots.append([(r["runId"], r["status"]) for r in current])
        mine = [r for r in current if r["tags"].get("dagster/backfill") == backfill_id
                or r["runId"] in days]
        return len(mine) == 3 and all(r["status"] in ("SUCCESS", "FAILURE", "CANCELED")
                                      for r in mine) and current

    final = wait_for(all_done, timeout=200, interval=0.5, what="the backfill's and the days' runs")

    [backfill] = [r for r in final if r["tags"].get("dagster/backfill") == backfill_id]
    assert backfill["status"] == "SUCCESS"
    assert (backfill["tags"]["dagster/asset_partition_range_start"],
            backfill["tags"]["dagster/asset_partition_range_end"]) == tuple(partitions)
    assert {r["status"] for r in final if r["runId"] in days} == {"SUCCESS"}
    # Seen while polling: a run waiting in the queue while another one was in progress.
    assert any({"QUEUED"} <= {s for _, s in snap} and {"STARTING", "STARTED"} & {s for _, s in snap}
               for snap in snapshots), snapshots
    # And at no time did two runs overlap: each started after the previous one ended.
    finished = sorted((r for r in final if r["startTime"] and r["endTime"]),
                      key=lambda r: r["startTime"])
    timeline = [(r["runId"][:8], r["jobName"], r["tags"].get("dagster/partition"),
                 r["startTime"], r["endTime"]) for r in finished]
    for earlier, later in zip(finished, finished[1:]):
        assert later["startTime"] >= earlier["endTime"], timeline
    # The backfill's run materialized both days with one cutoff, the last day's end minus the
    # retention, never after now - Days; its figures are on the last day, the other refers to it.
    now = dt.datetime.now(UTC)
    end = daily_partitions.time_window_for_partition_key(partitions[-1]).end
    mats = {m["partition"]: m["metadata"] for m in materializations(stack)
            if m["runId"] == backfill["runId"]}
    assert sorted(mats) == partitions
    for meta in mats.values():
        cutoff = dt.datetime.fromisoformat(meta["cutoff"])
        assert cutoff == end - dt.timedelta(days=DAYS)
        assert cutoff <= now - dt.timedelta(days=DAYS)
    assert mats[partitions[0]]["attributedTo"] == partitions[-1]
    assert mats[partitions[0]]["deletedTotal"] == 0
    # Each check recorded one result per backfilled day, for that day, and none failed: a past
    # day is judged against its own cutoff, not today's.
    for name in CHECKS:
        executions = [e for e in check_executions(stack, name)
                      if e["runId"] == backfill["runId"]]
        assert sorted(e["partition"] for e in executions) == partitions, (name, executions)
        assert {e["status"] for e in executions} == {"SUCCEEDED"}, (name, executions)


def stop_schedule(stack) -> None:
    """Stop the schedule through the UI's API, unless it is stopped already."""
    schedule = stack.graphql(SCHEDULE, {"selector": {
        "repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
        "scheduleName": SCHEDULE_NAME}})["scheduleOrError"]
    if schedule["scheduleState"]["status"] == "STOPPED":
        return
    stopped = stack.graphql(STOP_SCHEDULE, {"id": schedule["scheduleState"]["id"]})
    assert stopped["stopRunningSchedule"]["scheduleState"]["status"] == "STOPPED"


def check_executions(stack, name: str) -> list[dict]:
    """The executions of asset check ``name`` as the Checks tab lists them, newest first."""
    return stack.graphql(CHECK_EXECUTIONS, {**key_vars(), "name": name})["assetCheckExecutions"]


def test_the_daemon_runs_the_schedule_and_graphql_returns_the_metadata(stack):
    yesterday = daily_partitions.get_last_partition_key()

    def scheduled_success():
        done = [r for r in runs(stack) if r["tags"].get("dagster/schedule_name") == SCHEDULE_NAME
                and r["status"] in ("SUCCESS", "FAILURE", "CANCELED")]
        return done

    scheduled = wait_for(scheduled_success, timeout=200, interval=2,
                         what="a finished run of the schedule")[-1]
    assert scheduled["status"] == "SUCCESS", stack.tail()
    assert scheduled["tags"]["dagster/partition"] == yesterday
    # Its work is seen: stop the every-minute schedule, as an operator would, so that no more
    # runs queue up behind the pool for the rest of the module.
    stop_schedule(stack)

    mats = materializations(stack)
    [mat] = [m for m in mats if m["runId"] == scheduled["runId"]]
    meta = mat["metadata"]
    assert mat["partition"] == yesterday
    assert set(meta) >= {"deletedTotal", "batches", "durationMs", "backlogRemaining", "cutoff",
                         "retentionDays", "batchSize", "stopReason"}
    cutoff = dt.datetime.fromisoformat(meta["cutoff"])
    window_end = daily_partitions.time_window_for_partition_key(yesterday).end
    assert cutoff == window_end - dt.timedelta(days=DAYS)
    assert (meta["retentionDays"], meta["batchSize"]) == (DAYS, 1000)
    assert meta["stopReason"] == "exhausted" and meta["backlogRemaining"] == 0
    assert isinstance(meta["deletedTotal"], int) and isinstance(meta["durationMs"], int)

    # The rows: nothing prunable is left for that cutoff, no account row was touched, and the
    # guest rows that are gone are exactly what the materializations say was deleted.
    guests_seeded, accounts_seeded = seed_summary(stack)
    engine = stack.favorites_engine()
    try:
        with engine.connect() as conn:
            count = lambda where: conn.execute(sa.text(  # noqa: E731
                f"SELECT count(*) FROM favorites.favorites WHERE {where}"),
                {"cutoff": cutoff}).scalar_one()
            prunable = count("user_id IS NULL AND updated_at < :cutoff")
            guests = count("user_id IS NULL")
            accounts = count("user_id IS NOT NULL")
    finally:
        engine.dispose()
    deleted = sum(m["metadata"]["deletedTotal"] for m in materializations(stack))
    # The terminal of dev, redirected to a file: the runs' INFO lines, no DEBUG line, no colour.
    out = stack.output()
    assert "run completed: deleted_total=" in out
    assert " - DEBUG - " not in out and "\x1b[" not in out
    assert prunable == 0
    assert accounts == accounts_seeded
    assert deleted > 0
    assert guests_seeded - guests == deleted


def test_the_asset_page_shows_the_latest_materialization_checks_and_freshness(stack):
    binary = chromium_binary()
    if binary is None:
        missing("chromium is not installed (apt-get install -y chromium)")

    # The schedule is stopped (or stop it now), so the latest materialization holds still while
    # the page is read; wait for what is queued or running to finish.
    stop_schedule(stack)
    wait_for(lambda: materializations(stack) and all(
        r["status"] in ("SUCCESS", "FAILURE", "CANCELED") for r in runs(stack)),
        timeout=300, interval=2, what="no run in progress")

    latest = materializations(stack)[0]
    node = stack.graphql(ASSET_NODE, key_vars())["assetNodeOrError"]
    checks = [c["name"] for c in (node.get("assetChecksOrError") or {}).get("checks", [])]
    freshness = node.get("internalFreshnessPolicy")

    overview = ["Latest materialization", latest["partition"], "Metadata"]
    for label, value in latest["metadata"].items():
        overview += [label, as_shown(value)]
    if checks:
        overview.append("Latest check results")
    if freshness:
        overview.append("Freshness policy")

    page = f"{stack.url}/assets/{'/'.join(ASSET_PATH)}"
    read_page(binary, page, overview, "asset-page")
    assert set(checks) == set(CHECKS)
    # After the backfill: every execution of every check, backfilled days included, passed,
    # one per run (none left "Skipped"), and the Checks tab shows no failed check.
    backfill_runs = {r["runId"] for r in runs(stack) if r["tags"].get("dagster/backfill")}
    assert BACKFILLED and backfill_runs
    for name in CHECKS:
        executions = check_executions(stack, name)
        assert {e["status"] for e in executions} == {"SUCCEEDED"}, (name, executions)
        assert backfill_runs <= {e["runId"] for e in executions}
    text = read_page(binary, f"{page}?view=checks", list(CHECKS), "asset-checks")
    assert "Failed" not in text and "Skipped" not in text, text[:3000]


def as_shown(value) -> str:
    """A metadata value as the UI prints it: JavaScript writes the float 12.0 as "12"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def read_page(binary: str, url: str, expected: list[str], name: str) -> str:
    """Load ``url`` in headless Chromium until its text holds every ``expected`` string (the UI
    fills in over a few GraphQL round trips), and keep a screenshot of that same load and its
    text as ``test-artifacts/NAME.png`` and ``NAME.txt``."""
    profiles = ARTIFACTS / "chromium-profiles"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"{name}.png"
    text, missing = "", expected
    for attempt in range(4):
        shot.unlink(missing_ok=True)
        # One load gives both the DOM and the screenshot.
        dump = chromium(binary, url, profiles / f"{name}-{attempt}", "--dump-dom",
                        f"--screenshot={shot}", budget_ms=15000 + 10000 * attempt)
        text = visible_text(dump.stdout)
        missing = [e for e in expected if e not in text]
        if not missing:
            break
    # Keep what the page showed, passing or not: it is the first thing to look at.
    (ARTIFACTS / f"{name}.txt").write_text(text)
    assert not missing, f"not on {url}: {missing}\n\n{text[:3000]}"
    assert shot.is_file() and shot.stat().st_size > 20_000, f"no screenshot of {url}"
    return text


def test_ctrl_c_stops_the_ui_the_daemon_and_the_database_server(stack):
    """Last in the module: it stops the stack."""
    before = set(stack.seen_pids)
    assert before, "no process of the stack was seen"
    started = time.monotonic()
    code = stack.interrupt(timeout=120)
    took = time.monotonic() - started

    assert code == 0, stack.tail()
    assert stack.output().rstrip().endswith("stopped the embedded PostgreSQL server"), \
        stack.tail()
    assert [pid for pid in before if alive(pid)] == []
    assert not port_in_use(stack.port)
    assert not (stack.pgdata / "postmaster.pid").exists()
    assert took < 90
