"""A rule with no guard: every request whose ``expires_at`` is more than 30 days past, whoever
owns it (the Laravel write-up's ``UserEmailChangeRequest``), declared with ``null_columns: []``
beside the guest-favorites policy and run through Dagster on a real PostgreSQL.

The policies are loaded as the code location loads them, from a sandbox defs folder holding the
real ``guest_favorites/defs.yaml`` and an ``email_change_requests/defs.yaml`` written here.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from prometheus_client import generate_latest

from favorites_maintenance.components.policy_tree import PolicyLoadError, load_policies
from favorites_maintenance.components.policy_tree import code_location
from favorites_maintenance.pipeline.failure_sensor import FAILURE_SENSOR
from favorites_maintenance.pipeline.metrics import run_registry
from favorites_maintenance.pipeline.partitions import daily_partitions
from favorites_maintenance.pipeline.resources import AlertSink
from favorites_maintenance.pipeline.run_report import RunReport
from favorites_maintenance.pipeline.stale_sensor import STALE_SENSOR
from favorites_maintenance.pipeline.tick_failure_sensor import TICK_FAILURE_SENSOR
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance.retention.page_statements import page_delete_statement
from favorites_maintenance.retention.rule import RetentionRule
from favorites_maintenance.retention.statements import batch_statement, keyset_delete_statement
from favorites_maintenance.testing import PrunableRows
from favorites_maintenance_tests.helpers.jobs import (
    guest_settings_env,
    purge_retries,
    run_report,
)
from favorites_maintenance_tests.helpers.resource_keys import ALERTS_KEY

UTC = dt.timezone.utc
#: The day before today: the partition the schedule runs, ending at ANCHOR.
PARTITION = daily_partitions.get_last_partition_key()
ANCHOR = daily_partitions.time_window_for_partition_key(PARTITION).end
CUTOFF = ANCHOR - dt.timedelta(days=30)

REQUESTS = {
    "name": "email_change_requests",
    "table": "accounts.email_change_requests",
    "key_column": "id",
    "age_column": "expires_at",
    "null_columns": [],
    "retention_days": 30,
}
ASSET_KEY = dg.AssetKey(["accounts", "email_change_requests_cleanup"])
JOB = "email_change_requests_cleanup_job"
#: No retry of the purge op: a failure fails the run here.
RETRIES = purge_retries(0, asset_key=ASSET_KEY)


def write_policy(defs_folder: Path, attributes: dict, folder: str = "email_change_requests"):
    (defs_folder / folder).mkdir()
    (defs_folder / folder / "defs.yaml").write_text(yaml.safe_dump(
        {"type": "favorites_maintenance.RetentionPolicy", "attributes": attributes}))


@pytest.fixture
def requests_table(engine):
    """``accounts.email_change_requests``: every row has an owner (``user_id NOT NULL``)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE SCHEMA accounts;
            CREATE TABLE accounts.email_change_requests (
                id bigserial PRIMARY KEY,
                user_id bigint NOT NULL,
                new_email text NOT NULL,
                expires_at timestamptz NOT NULL);
            CREATE INDEX ON accounts.email_change_requests (expires_at, id);""")
    yield
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP SCHEMA accounts CASCADE")


def add_requests(engine, n: int, expires_at: dt.datetime, email: str = "new@example.test"):
    with engine.begin() as conn:
        return list(conn.execute(sa.text(
            "INSERT INTO accounts.email_change_requests (user_id, new_email, expires_at) "
            "SELECT 42, :email, :at FROM generate_series(1, :n) RETURNING id"),
            {"email": email, "at": expires_at, "n": n}).scalars())


def requests_left(engine) -> set[int]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text(
            "SELECT id FROM accounts.email_change_requests")).scalars())


def texts_of_run(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> list[str]:
    """Every message of the run's event log (its log lines included), and its check results'
    descriptions."""
    texts = [e.user_message or "" for e in instance.all_logs(result.run_id)]
    texts += [c.description or "" for c in result.get_asset_check_evaluations()]
    return texts


def test_a_rule_with_no_guard_deletes_every_expired_row_whoever_owns_it(
        sandbox, requests_table, rows, engine, db_url, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    write_policy(sandbox.defs_folder_path, REQUESTS)
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
        [policy] = [p for p in load_policies(tree) if p.name == "email_change_requests"]
    job = defs.resolve_job_def(JOB)
    graph = defs.resolve_asset_graph()

    # Nothing says "guest" where there is no guard: names, descriptions, metrics.
    checks = {c.name for c in graph.asset_check_keys if c.asset_key == ASSET_KEY}
    assert checks == {"no_row_older_than_retention_plus_one_day", "deleted_total_spike",
                      "no_rows_skipped"}
    described = [graph.get(ASSET_KEY).description, job.description]
    described += [n.definition.description for n in job.graph.node_named(
        "accounts__email_change_requests_cleanup").definition.nodes]
    described += [spec.description for checks_def in defs.asset_checks
                  for spec in checks_def.check_specs if spec.asset_key == ASSET_KEY]
    described += [defs.resolve_sensor_def(name).description for name in (
        STALE_SENSOR, FAILURE_SENSOR, TICK_FAILURE_SENSOR)]
    assert len(described) == 2 + 3 + 3 + 3 and all(described), described
    assert "(no guard: whoever owns them) whose expires_at is more than 30 days past" in \
        described[0]
    assert "expires_at < cutoff" in job.description
    exposition = generate_latest(run_registry(
        policy, RunReport(deleted_total=1, batches=1, backlog_remaining=0), succeeded=True,
        ended_at=0)).decode()
    assert "email_change_requests_cleanup_deleted_rows" in exposition
    for text in [*described, exposition]:
        assert "guest" not in (text or "").lower(), text

    with dg.instance_for_test() as instance:
        # Nothing prunable yet: the run says so, in the rule's words.
        empty = job.execute_in_process(partition_key=PARTITION, instance=instance,
                                       run_config=RETRIES)
        assert empty.success
        assert any(f"nothing to delete: no row older than {CUTOFF.isoformat()}" in t
                   for t in texts_of_run(instance, empty))

        expired = set(add_requests(engine, 40, CUTOFF - dt.timedelta(days=1)))
        recent = set(add_requests(engine, 10, ANCHOR - dt.timedelta(days=29)))
        # Not expired yet: in the future of any run.
        future = set(add_requests(engine, 5, dt.datetime.now(UTC) + dt.timedelta(days=5)))
        at_cutoff = set(add_requests(engine, 1, CUTOFF))
        # One expired row that cannot be deleted: left in place, and overdue.
        [blocked] = add_requests(engine, 1, CUTOFF - dt.timedelta(days=10),
                                 email="blocked@example.test")
        with engine.begin() as conn:
            conn.exec_driver_sql("""
                CREATE FUNCTION accounts.keep_blocked() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN IF OLD.new_email = 'blocked@example.test' THEN
                    RAISE EXCEPTION 'held for review'; END IF; RETURN OLD; END $$;
                CREATE TRIGGER keep_blocked BEFORE DELETE ON accounts.email_change_requests
                    FOR EACH ROW EXECUTE FUNCTION accounts.keep_blocked();""")
        old_guests = set(rows.add_many(20, updated_at=ANCHOR - dt.timedelta(days=400)))
        accounts = set(rows.add_many(5, updated_at=ANCHOR - dt.timedelta(days=400), user_id=3))

        result = job.execute_in_process(partition_key=PARTITION, instance=instance,
                                        run_config=RETRIES)
        assert result.success
        run = run_report(result, asset_key=ASSET_KEY)
        assert (run.deleted_total, run.skipped_rows, run.backlog_remaining) == (40, 1, 1)
        assert run.cutoff == CUTOFF.isoformat()
        # Every expired row went, whoever owned it; the recent, the not yet expired, the one
        # exactly at the cutoff and the blocked one stayed; the favorites were not touched.
        assert requests_left(engine) == recent | future | at_cutoff | {blocked}
        assert not expired & requests_left(engine)
        assert rows.ids() == old_guests | accounts

        evaluations = {c.check_name: c for c in result.get_asset_check_evaluations()}
        overdue = evaluations["no_row_older_than_retention_plus_one_day"]
        assert not overdue.passed
        assert overdue.metadata["overdueRows"].value == 1
        assert overdue.description.startswith("1 rows are older than this run's cutoff")
        assert not evaluations["no_rows_skipped"].passed
        texts = texts_of_run(instance, result)
        assert any(f"skipped row id={blocked}" in t for t in texts)
        for text in texts:
            assert "guest" not in text.lower(), text

        # The failure sensor's alert of a failed run of the policy reads the same way.
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "ALTER TABLE accounts.email_change_requests RENAME COLUMN expires_at TO e")
        failed = job.execute_in_process(partition_key=PARTITION, instance=instance,
                                        raise_on_error=False, run_config=RETRIES)
        assert not failed.success
        [failure] = [e.dagster_event for e in instance.all_logs(failed.run_id)
                     if e.dagster_event
                     and e.dagster_event.event_type == dg.DagsterEventType.RUN_FAILURE]
        sent: list[str] = []

        class Sink(AlertSink):
            def send(self, text, *, log=None, level=40):
                sent.append(text)
                return True

        ctx = dg.build_run_status_sensor_context(
            sensor_name=FAILURE_SENSOR, dagster_instance=instance,
            dagster_run=instance.get_run_by_id(failed.run_id), dagster_event=failure,
            resources={ALERTS_KEY: Sink()},
            repository_def=defs.get_repository_def()).for_run_failure()
        defs.resolve_sensor_def(FAILURE_SENSOR)(ctx)
        assert len(sent) == 1 and "guest" not in sent[0].lower()
        assert sent[0].startswith("email_change_requests cleanup failed: asset "
                                  "accounts/email_change_requests_cleanup, "), sent[0]

        # The guest-favorites policy beside it deletes only its own rows.
        guest = defs.resolve_job_def("guest_favorites_cleanup_job").execute_in_process(
            partition_key=PARTITION, instance=instance, run_config=purge_retries(0))
        assert guest.success and run_report(guest).deleted_total == 20
        assert rows.ids() == accounts


@pytest.mark.parametrize("attributes", [
    {k: v for k, v in REQUESTS.items() if k != "null_columns"},
    {**REQUESTS, "null_columns": None},
])
def test_a_policy_that_leaves_its_guard_out_is_refused_at_load(sandbox, attributes):
    write_policy(sandbox.defs_folder_path, attributes)
    with sandbox.build_component_tree() as tree:
        with pytest.raises(PolicyLoadError) as refused:
            load_policies(tree)
        with pytest.raises(PolicyLoadError):
            code_location(tree)
    message = str(refused.value)
    assert "policy 'email_change_requests': null_columns is missing" in message
    assert "write null_columns: [] on purpose for a rule with no guard" in message


def test_the_delete_of_a_rule_with_no_guard_still_repeats_the_age_and_the_key():
    rule = RetentionRule.define("accounts.email_change_requests", key_column="id",
                                age_column="expires_at", null_columns=[])
    assert rule.guards == () and rule.predicate_sql == "expires_at < cutoff"
    for by_ctid in (True, False):
        sql = str(batch_statement(rule, CUTOFF, keyset=True, by_ctid=by_ctid).compile(
            dialect=sa.dialects.postgresql.dialect()))
        delete = sql[sql.index("DELETE FROM"):sql.index("RETURNING")]
        where = delete[delete.index("WHERE"):]
        assert "email_change_requests.expires_at < %(cutoff)s" in where
        assert "email_change_requests.id = retention_batch.key" in where
    # The optimistic DELETEs, in keyset and in page order, repeat the age as well.
    for statement in (keyset_delete_statement(rule, CUTOFF, keyset=True),
                      page_delete_statement(rule, CUTOFF)):
        where = str(statement.compile(dialect=sa.dialects.postgresql.dialect()))
        assert where.startswith("DELETE FROM accounts.email_change_requests WHERE ")
        assert "email_change_requests.expires_at < %(cutoff)s" in where
    assert rule.recommended_index_sql.endswith(
        "ON accounts.email_change_requests (expires_at, id)")


@pytest.mark.parametrize("inclusive", [True, False], ids=["inclusive", "strict"])
def test_cutoff_inclusive_deletes_the_request_expired_exactly_30_days_ago_and_only_then(
        sandbox, requests_table, engine, db_url, monkeypatch, inclusive):
    """Laravel's rule is ``expires_at <= now() - 30 days``: with ``cutoff_inclusive: true`` the
    request that expired exactly at the cutoff goes, by the run, its count, its dry run and its
    SLO check alike; without it, it stays. The one just newer stays in both."""
    monkeypatch.setenv(DATABASE_URL_VAR, db_url.render_as_string(hide_password=False))
    guest_settings_env(monkeypatch)
    write_policy(sandbox.defs_folder_path, {**REQUESTS, "cutoff_inclusive": inclusive})
    with sandbox.build_component_tree() as tree:
        defs = code_location(tree)
        [policy] = [p for p in load_policies(tree) if p.name == "email_change_requests"]
    job = defs.resolve_job_def(JOB)
    comparison = "<=" if inclusive else "<"
    assert f"(expires_at {comparison} cutoff)" in job.description
    micro = dt.timedelta(microseconds=1)

    with dg.instance_for_test() as instance:
        empty = job.execute_in_process(partition_key=PARTITION, instance=instance,
                                       run_config=RETRIES)
        older_than = "at or before" if inclusive else "older than"
        assert any(f"nothing to delete: no row {older_than} {CUTOFF.isoformat()}" in t
                   for t in texts_of_run(instance, empty))

        older = set(add_requests(engine, 3, CUTOFF - micro))
        at_cutoff = set(add_requests(engine, 2, CUTOFF))
        newer = set(add_requests(engine, 1, CUTOFF + micro))
        # Exactly one day past the cutoff (the SLO's limit), and held back by a trigger.
        [blocked] = add_requests(engine, 1, CUTOFF - dt.timedelta(days=1),
                                 email="blocked@example.test")
        with engine.begin() as conn:
            conn.exec_driver_sql("""
                CREATE FUNCTION accounts.keep_blocked() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN IF OLD.new_email = 'blocked@example.test' THEN
                    RAISE EXCEPTION 'held for review'; END IF; RETURN OLD; END $$;
                CREATE TRIGGER keep_blocked BEFORE DELETE ON accounts.email_change_requests
                    FOR EACH ROW EXECUTE FUNCTION accounts.keep_blocked();""")
        deleted = older | (at_cutoff if inclusive else set())
        # What dry-run counts (favorites_maintenance.testing) at the run's cutoff.
        with engine.connect() as conn:
            assert PrunableRows(policy, CUTOFF).count(conn) == (
                len(deleted) + 1, CUTOFF - dt.timedelta(days=1))

        result = job.execute_in_process(partition_key=PARTITION, instance=instance,
                                        run_config=RETRIES)

    assert result.success
    run = run_report(result, asset_key=ASSET_KEY)
    assert run.cutoff == CUTOFF.isoformat()
    assert (run.deleted_total, run.skipped_rows, run.backlog_remaining) == (len(deleted), 1, 1)
    assert requests_left(engine) == newer | {blocked} | (set() if inclusive else at_cutoff)
    # The SLO counts a row at its limit as overdue only under <=.
    overdue = {c.check_name: c for c in result.get_asset_check_evaluations()}[
        "no_row_older_than_retention_plus_one_day"]
    assert overdue.metadata["overdueRows"].value == (1 if inclusive else 0)
    assert overdue.passed is not inclusive
