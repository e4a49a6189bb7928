"""Bad input: invalid settings fail before any connection, naming the setting; a missing table
or a missing permission fails the run with a clear error."""

from __future__ import annotations

import socket
import threading
import time

import dagster as dg
import pytest

from favorites_maintenance.config.parsers import SettingsError
from favorites_maintenance.components.policy_tree import code_location
from favorites_maintenance.retention.database import NETWORK_LIMITS
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR
from favorites_maintenance_tests.helpers.jobs import JOB, load_code_location
from favorites_maintenance_tests.helpers.resource_keys import LIMITS_KEY
from favorites_maintenance_tests.reliability.conftest import (
    OLD,
    PARTITION,
    materialization,
    run_job,
    step_failure,
)

PASSWORD = "pw-bad-input-93kq"


class Listener:
    """A TCP port that counts the connections it receives (closed at once, or held silent)."""

    def __init__(self, *, silent: bool = False):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.silent = silent
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            if self.silent:
                self.held.append(conn)  # accept, never answer
            else:
                conn.close()

    def url(self) -> str:
        return f"postgresql+psycopg://app:{PASSWORD}@127.0.0.1:{self.port}/favorites"

    def close(self):
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def listener():
    lis = Listener()
    yield lis
    lis.close()


INVALID = [
    ("FAVORITES_GUEST_RETENTION_DAYS", "0"),
    ("FAVORITES_GUEST_RETENTION_DAYS", "-1"),
    ("FAVORITES_GUEST_RETENTION_DAYS", "a year"),
    ("FAVORITES_GUEST_RETENTION_DAYS", ""),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE", "0"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE", "-1000"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE", "1k"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE", ""),
    ("FAVORITES_GUEST_RETENTION_CRON", "0 0 3 * * *"),
    ("FAVORITES_GUEST_RETENTION_CRON", "0 25 * * *"),
    ("FAVORITES_GUEST_RETENTION_CRON", "0 3 32 * *"),
    ("FAVORITES_GUEST_RETENTION_CRON", ""),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "0"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "-PT1M"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "ten"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", ""),
    ("FAVORITES_GUEST_RETENTION_STALE_AFTER", "00:00:00"),
    ("FAVORITES_GUEST_RETENTION_STALE_AFTER", ""),
    ("FAVORITES_ALERT_WEBHOOK_URL", ""),
    ("FAVORITES_ALERT_WEBHOOK_URL", "ftp://hooks.example.test"),
    ("FAVORITES_DATABASE_URL", ""),
    ("FAVORITES_DATABASE_URL", "postgresql+psycopg://app:pw-bad-input-93kq@127.0.0.1:notaport/db"),
    ("FAVORITES_DATABASE_URL", "mysql+pymysql://app:pw-bad-input-93kq@127.0.0.1/db"),
    ("FAVORITES_DATABASE_URL", "postgresql+psycopg://app:pw-bad-input-93kq@127.0.0.1/"),
    ("FAVORITES_DATABASE_URL", "pw-bad-input-93kq"),
]


def settings_error(exc: BaseException | None) -> SettingsError:
    """The :class:`SettingsError` that stopped the code location: the load's error itself or
    its cause (a policy's setting: ``PolicyLoadError``; a deployment variable, read by
    a policy's resources: Dagster's ``ComponentTreeException``)."""
    while exc is not None and not isinstance(exc, SettingsError):
        exc = exc.__cause__
    assert exc is not None, "the load failed without a SettingsError"
    return exc


@pytest.mark.parametrize("variable, value", INVALID)
def test_an_invalid_setting_stops_the_code_location_before_any_connection(
        variable, value, listener, monkeypatch):
    monkeypatch.setenv(DATABASE_URL_VAR, listener.url())
    monkeypatch.setenv(variable, value)
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the SettingsError is read below
        code_location()  # what loading the location does
    error = settings_error(raised.value)
    assert error.variable == variable
    assert str(error).startswith(f"{variable}:")
    assert PASSWORD not in str(error)
    assert PASSWORD not in str(raised.value)
    time.sleep(0.05)
    assert listener.accepted == 0


@pytest.mark.parametrize("field, value", [("retention_days", 0), ("batch_size", -5),
                                          ("max_run_duration_seconds", 0)])
def test_an_invalid_value_in_the_run_config_is_refused_at_launch_before_any_connection(
        field, value, listener, monkeypatch):
    job = load_code_location(listener.url(), monkeypatch).resolve_job_def(JOB)
    with dg.instance_for_test() as instance:
        with pytest.raises(dg.DagsterInvalidConfigError) as refused:
            job.execute_in_process(
                partition_key=PARTITION, instance=instance,
                run_config={"resources": {LIMITS_KEY: {"config": {
                    "retention_days": 365, "batch_size": 1000, "max_run_duration_seconds": 600,
                    field: value}}}})
        assert instance.get_runs() == []
    assert str(refused.value).startswith(f"{field}={value!r} refused")
    assert PASSWORD not in str(refused.value)
    assert listener.accepted == 0


def test_an_unreachable_database_fails_the_run_naming_the_setting(monkeypatch):
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: connection refused
    url = f"postgresql+psycopg://app:{PASSWORD}@127.0.0.1:{port}/favorites"
    with dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch)
        logs = "\n".join(e.user_message for e in instance.all_logs(result.run_id))
    assert not result.success and materialization(result) is None
    step, error = step_failure(result)
    # The first op reads the database's clock for the cutoff: the run fails there.
    assert step.endswith("compute_cutoff")
    text = error.message + (error.cause.message if error.cause else "")
    assert DATABASE_URL_VAR in text and "Connection refused" in text
    assert "run failed" in logs
    assert PASSWORD not in text + logs


def test_a_server_that_never_answers_fails_the_run_instead_of_hanging(monkeypatch):
    # The default limit (10 s) made shorter: the same mechanism applies it, the test waits less.
    monkeypatch.setitem(NETWORK_LIMITS, "connect_timeout", 2)
    silent = Listener(silent=True)
    try:
        with dg.instance_for_test() as instance:
            t0 = time.monotonic()
            result = run_job(silent.url(), instance, monkeypatch=monkeypatch)
            took = time.monotonic() - t0
    finally:
        silent.close()
    assert not result.success
    assert silent.accepted >= 1
    assert took < 30  # libpq's connect_timeout, set by default (10 s; 2 s here)
    step, error = step_failure(result)
    assert DATABASE_URL_VAR in error.message + (error.cause.message if error.cause else "")


def test_a_missing_table_fails_the_run_with_a_clear_error(db_url, engine, monkeypatch):
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE favorites.favorites")
    with dg.instance_for_test() as instance:
        result = run_job(db_url, instance, monkeypatch=monkeypatch)
    assert not result.success and materialization(result) is None
    step, error = step_failure(result)
    text = error.message + (error.cause.message if error.cause else "")
    assert step.endswith("purge")
    assert "table favorites.favorites does not exist" in text


@pytest.mark.parametrize("grants, expected", [
    # SELECT and DELETE alone are not enough: PostgreSQL also wants UPDATE for FOR UPDATE.
    (["GRANT USAGE ON SCHEMA favorites TO {role}",
      "GRANT SELECT (id, user_id, updated_at), DELETE ON favorites.favorites TO {role}"],
     "permission denied for table favorites"),
    (["GRANT USAGE ON SCHEMA favorites TO {role}",
      "GRANT SELECT (id, user_id, updated_at), UPDATE (updated_at) "
      "ON favorites.favorites TO {role}"],
     "permission denied for table favorites"),
    (["GRANT SELECT (id, user_id, updated_at), UPDATE (updated_at), DELETE "
      "ON favorites.favorites TO {role}"],
     "permission denied for schema favorites"),
], ids=["no-row-lock-privilege", "no-delete", "no-schema-usage"])
def test_a_missing_permission_fails_the_run_with_a_clear_error(
        grants, expected, engine, rows, roles, monkeypatch):
    rows.add_many(20, updated_at=OLD)
    url = roles.create("partial", *grants)
    with dg.instance_for_test() as instance:
        result = run_job(url, instance, monkeypatch=monkeypatch)
    assert not result.success and materialization(result) is None
    step, error = step_failure(result)
    text = error.message + (error.cause.message if error.cause else "")
    assert "permission_denied" in text and "SQLSTATE 42501" in text and expected in text
    assert rows.count() == 20


@pytest.mark.parametrize("query", [
    {"prepare_threshold": "0", "connect_timeout": "5"},
    {"prepare_threshold": "None", "options": "-c lock_timeout=1500"},
])
def test_driver_options_in_the_url_reach_the_driver_and_the_run_succeeds(
        db_url, rows, monkeypatch, query):
    # '?prepare_threshold=0' used to pass validation, then fail the purge with a TypeError.
    rows.add_many(250, updated_at=OLD)
    with dg.instance_for_test() as instance:
        result = run_job(db_url.update_query_dict(query), instance, monkeypatch=monkeypatch,
                         batch_size=100)
    assert result.success
    assert materialization(result)["deletedTotal"] == 250
