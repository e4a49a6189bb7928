"""Settings from the environment: defaults, and every invalid value named.

The deployment's variables are read by
:func:`~favorites_maintenance.config.deployment.load_deployment_settings`; the guest-favorites
policy's settings only through its YAML (``defs/guest_favorites/defs.yaml``, which reads each
from a ``FAVORITES_GUEST_RETENTION_*`` variable), loaded as the code location loads it.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from favorites_maintenance_tests.helpers.dagster_internals import is_valid_cron_string

from favorites_maintenance.components.policy_tree import PolicyLoadError, load_policies
from favorites_maintenance.components.retention_policy import RetentionPolicy
from favorites_maintenance.config.deployment import load_deployment_settings
from favorites_maintenance.config.parsers import SettingsError, validate_cron
from favorites_maintenance.config.policy_settings import (
    PolicySettings,
    markdown_table,
    parse_policy_settings,
)
from favorites_maintenance_tests.helpers.jobs import GUEST_VARIABLES

PASSWORD = "s3cr3t-pa55"
ROOT = Path(__file__).resolve().parents[2]
GUEST_PREFIX = "FAVORITES_GUEST_RETENTION_"


def guest_settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> PolicySettings:
    """The guest-favorites policy's settings, loaded from its real YAML with exactly the
    variables ``env`` set (every other ``FAVORITES_GUEST_RETENTION_*`` unset).

    Raises:
        SettingsError: the cause of the load's :class:`PolicyLoadError` (same message).
    """
    unread = sorted(set(env) - set(GUEST_VARIABLES.values()))
    assert not unread, f"not read by defs/guest_favorites/defs.yaml: {unread}"
    for name in list(os.environ):
        if name.startswith(GUEST_PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        # Other policies a checkout adds beside it are left out.
        [guest] = [p for p in load_policies() if p.name == "guest_favorites"]
    except PolicyLoadError as exc:
        cause = exc.__cause__
        if isinstance(cause, SettingsError):
            # The same message, after the file and the line of the field it reads.
            assert re.fullmatch(rf"favorites_maintenance/defs/guest_favorites/defs\.yaml:\d+: "
                                rf"{re.escape(str(cause))}", str(exc)), str(exc)
            raise cause from None
        raise
    assert guest.name == "guest_favorites"
    return guest.settings


def test_defaults_when_nothing_is_set(monkeypatch):
    d = load_deployment_settings({})
    assert d.database_url is None
    s = guest_settings(monkeypatch)
    assert (s.retention_days, s.batch_size, s.cron) == (365, 1000, "0 3 * * *")
    assert s.max_run_duration == dt.timedelta(minutes=10)
    assert s.stale_after == dt.timedelta(hours=48)
    assert d.alert_webhook_url is None
    assert (s.batch_size_max, s.target_batch_duration) == (10_000, dt.timedelta(seconds=0.2))
    assert (s.max_replication_lag_bytes, s.max_wal_bytes_per_second) == (64 * 2**20, None)
    assert s.max_pause == dt.timedelta(minutes=2)
    assert s.sleep_ratio == 0
    assert d.run_heartbeat_timeout == dt.timedelta(minutes=2)


def test_values_are_read_from_the_variables(monkeypatch):
    d = load_deployment_settings({
        "FAVORITES_DATABASE_URL": f"postgresql://app:{PASSWORD}@db.internal:5433/favorites",
        "FAVORITES_ALERT_WEBHOOK_URL": "https://hooks.example.test/T/B/X",
    })
    s = guest_settings(
        monkeypatch,
        FAVORITES_GUEST_RETENTION_DAYS="30",
        FAVORITES_GUEST_RETENTION_BATCH_SIZE="250",
        FAVORITES_GUEST_RETENTION_CRON="15 2 * * 1-5",
        FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION="PT90S",
        FAVORITES_GUEST_RETENTION_STALE_AFTER="72:00:00",
    )
    assert d.database_url.drivername == "postgresql+psycopg"
    assert d.database_url.port == 5433 and d.database_url.database == "favorites"
    assert PASSWORD not in d.database_url_safe and PASSWORD not in repr(d)
    assert (s.retention_days, s.batch_size, s.cron) == (30, 250, "15 2 * * 1-5")
    assert s.max_run_duration == dt.timedelta(seconds=90)
    assert s.stale_after == dt.timedelta(hours=72)


@pytest.mark.parametrize("variable, value", [
    ("FAVORITES_GUEST_RETENTION_DAYS", "0"),
    ("FAVORITES_GUEST_RETENTION_DAYS", "-5"),
    ("FAVORITES_GUEST_RETENTION_DAYS", "ten"),
    ("FAVORITES_GUEST_RETENTION_DAYS", "3.5"),
    ("FAVORITES_GUEST_RETENTION_DAYS", ""),
    ("FAVORITES_GUEST_RETENTION_DAYS", "1000000"),
    ("FAVORITES_GUEST_RETENTION_DAYS", str(10**30)),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE", "0"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE", "1e3"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE", "   "),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE", str(2**63)),
    ("FAVORITES_GUEST_RETENTION_CRON", "0 3 * * * *"),
    ("FAVORITES_GUEST_RETENTION_CRON", "61 3 * * *"),
    ("FAVORITES_GUEST_RETENTION_CRON", "0 3 * *"),
    ("FAVORITES_GUEST_RETENTION_CRON", "0 0 30 2 *"),
    ("FAVORITES_GUEST_RETENTION_CRON", "daily"),
    ("FAVORITES_GUEST_RETENTION_CRON", "0 3 31 4 *"),
    ("FAVORITES_GUEST_RETENTION_CRON", "0 3 30,31 2 *"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "00:00:00"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "-00:10:00"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "ten minutes"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "PT0.000001S"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "99999999999:00:00"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "25:00:00"),
    ("FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION", "PT51M"),
    ("FAVORITES_GUEST_RETENTION_STALE_AFTER", "PT0S"),
    ("FAVORITES_GUEST_RETENTION_STALE_AFTER", "48h"),
    ("FAVORITES_GUEST_RETENTION_STALE_AFTER", "P1000Y"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX", "0"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX", "200000"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX", "500"),  # below the first size, 1000
    ("FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION", "-PT1S"),
    ("FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION", "200ms"),
    ("FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION", "PT11S"),
    ("FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION", "PT0.000001S"),  # a typo, not a wish
    ("FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION", "-P0D"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX", "1_000_0"),
    ("FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX", "\u0665\u0660\u0660\u0660"),  # Arabic-Indic 5000
    ("FAVORITES_GUEST_RETENTION_MAX_REPLICATION_LAG_BYTES", "64MB"),
    ("FAVORITES_GUEST_RETENTION_MAX_REPLICATION_LAG_BYTES", "0"),
    ("FAVORITES_GUEST_RETENTION_MAX_WAL_BYTES_PER_SECOND", "-1"),
    ("FAVORITES_GUEST_RETENTION_MAX_PAUSE", "PT0S"),
    ("FAVORITES_GUEST_RETENTION_MAX_PAUSE", "PT2H"),
    ("FAVORITES_GUEST_RETENTION_SLEEP_RATIO", "-1"),
    ("FAVORITES_GUEST_RETENTION_SLEEP_RATIO", "101"),
    ("FAVORITES_GUEST_RETENTION_SLEEP_RATIO", "nan"),
    ("FAVORITES_GUEST_RETENTION_SLEEP_RATIO", "1e1"),
    ("FAVORITES_GUEST_RETENTION_SLEEP_RATIO", "half"),
    ("FAVORITES_ALERT_WEBHOOK_URL", "hooks.example.test/x"),
    ("FAVORITES_METRICS_PUSHGATEWAY_URL", "pushgateway:9091"),
    ("FAVORITES_METRICS_PUSHGATEWAY_URL", "ftp://pushgateway:9091"),
    ("FAVORITES_METRICS_PUSHGATEWAY_URL", "http://pushgateway:port"),
    ("FAVORITES_METRICS_PUSHGATEWAY_URL", "http://pushgateway:9091/?job=x"),
    ("FAVORITES_METRICS_PUSHGATEWAY_URL", ""),
    ("FAVORITES_DATABASE_URL", "mysql://u:p@h/db"),
    ("FAVORITES_DATABASE_URL", "postgresql+psycopg://u:p@h/"),
    ("FAVORITES_DATABASE_URL", "not a url"),
    ("FAVORITES_RUN_HEARTBEAT_TIMEOUT", "PT5S"),  # a busy storage would pass for a dead run
    ("FAVORITES_RUN_HEARTBEAT_TIMEOUT", "PT2H"),
    ("FAVORITES_RUN_HEARTBEAT_TIMEOUT", "2 minutes"),
])
def test_an_invalid_value_names_the_variable_and_the_value(variable, value, monkeypatch):
    with pytest.raises(SettingsError) as raised:
        if variable.startswith(GUEST_PREFIX):
            guest_settings(monkeypatch, **{variable: value})
        else:
            load_deployment_settings({variable: value})
    message = str(raised.value)
    assert raised.value.variable == variable
    assert message.startswith(variable + ":")
    if value.strip() and variable not in ("FAVORITES_DATABASE_URL", "FAVORITES_ALERT_WEBHOOK_URL",
                                          "FAVORITES_METRICS_PUSHGATEWAY_URL"):
        assert repr(value) in message


@pytest.mark.parametrize("url", [
    f"mysql://app:{PASSWORD}@h/db",
    f"postgresql+psycopg://app:{PASSWORD}@h/",
    f"postgresql+psycopg://app:{PASSWORD}@h:notaport/db",
    f"postgresql+psycopg://app:ab@{PASSWORD}@db.internal/favorites",  # '@' not URL-encoded
    f"mysql://app@h/db?password={PASSWORD}",
])
def test_a_bad_database_url_never_shows_its_password(url):
    with pytest.raises(SettingsError) as raised:
        load_deployment_settings({"FAVORITES_DATABASE_URL": url})
    assert PASSWORD not in str(raised.value)
    assert "FAVORITES_DATABASE_URL" in str(raised.value)


@pytest.mark.parametrize("url", [
    f"ftp://pusher:{PASSWORD}@pushgateway:9091",
    f"http://pusher:{PASSWORD}@pushgateway:notaport",
    f"https://pusher:{PASSWORD}@pushgateway:9091/?token={PASSWORD}",
    f"pusher:{PASSWORD}@pushgateway:9091",
])
def test_a_bad_pushgateway_url_never_shows_its_credentials(url):
    with pytest.raises(SettingsError) as raised:
        load_deployment_settings({"FAVORITES_METRICS_PUSHGATEWAY_URL": url})
    assert raised.value.variable == "FAVORITES_METRICS_PUSHGATEWAY_URL"
    assert PASSWORD not in str(raised.value) and "pusher" not in str(raised.value)


def test_a_pushgateway_url_with_credentials_is_taken_and_never_shown():
    url = f"https://pusher:{PASSWORD}@pushgateway.internal:9091/prefix"
    s = load_deployment_settings({"FAVORITES_METRICS_PUSHGATEWAY_URL": url})
    assert s.metrics_pushgateway_url == url
    assert PASSWORD not in repr(s)
    assert load_deployment_settings({}).metrics_pushgateway_url is None


@pytest.mark.parametrize("url, said", [
    (f"https://ops:{PASSWORD}@dagster.internal", "holds a user or password"),
    ("dagster.internal:3000", "is not an http(s) URL with a host"),
    ("https://dagster.internal/?tab=runs", "has a query or fragment"),
])
def test_the_ui_base_url_of_alerts_is_an_http_url_without_credentials(url, said):
    with pytest.raises(SettingsError) as raised:
        load_deployment_settings({"FAVORITES_WEBSERVER_BASE_URL": url})
    assert raised.value.variable == "FAVORITES_WEBSERVER_BASE_URL"
    assert said in str(raised.value) and PASSWORD not in str(raised.value)
    taken = load_deployment_settings({"FAVORITES_WEBSERVER_BASE_URL": "https://dagster.internal/"})
    assert taken.webserver_base_url == "https://dagster.internal"


@pytest.mark.parametrize("expr", [
    "0 3 * * *", "*/5 * * * *", "0 0 1 1 *", "0 3 * * MON-FRI", "0 3 * * 7", "@daily",
    "@hourly", "0 0 29 2 *", "0 0 30 2 *", "0 0 31 2 *", "0 0 31 4 *", "0 3 L * *",
    "* * * * * *", "61 * * * *", "0 24 * * *", "0 3 * * 8", "0 3 * 13 *", "0 3 0 * *",
    "H 3 * * *", "0 3 * *", "", "0 3 1-5/2 * *", "0,30 * * * *", "0 3 ? * *",
])
def test_cron_validation_agrees_with_dagster_schedules(expr):
    try:
        validate_cron(expr)
        ours = True
    except ValueError as exc:
        ours = False
        if "no such date" in str(exc):  # stricter on purpose: Dagster takes "0 0 31 4 *"
            assert is_valid_cron_string(expr)
            return
    assert ours == is_valid_cron_string(expr), expr


def test_a_password_in_the_query_is_masked_too():
    s = load_deployment_settings({"FAVORITES_DATABASE_URL":
                                  f"postgresql://app@db.internal/favorites?password={PASSWORD}"})
    assert PASSWORD not in s.database_url_safe
    assert "password=***" in s.database_url_safe
    assert PASSWORD not in repr(s)


def test_loading_the_code_location_fails_fast_naming_the_variable():
    env = {"FAVORITES_GUEST_RETENTION_BATCH_SIZE": "-1",
           "FAVORITES_DATABASE_URL": f"postgresql://app:{PASSWORD}@127.0.0.1:1/favorites",
           "PATH": "/usr/bin:/bin"}
    # What Dagster does with the code location: call the @dg.definitions function.
    load = "from favorites_maintenance.definitions import defs; defs()"
    proc = subprocess.run([sys.executable, "-c", load],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "FAVORITES_GUEST_RETENTION_BATCH_SIZE: '-1' must be greater than 0" in proc.stderr
    assert PASSWORD not in proc.stderr + proc.stdout


@pytest.mark.parametrize("query, said", [
    ("prepare_threshold=x", "option 'prepare_threshold' must be a whole number >= 0 or None"),
    ("prepare_threshold=-1", "option 'prepare_threshold' must be a whole number >= 0 or None"),
    ("connect_timeout=soon", "option 'connect_timeout' must be a whole number >= 0"),
    ("sslmode=sure", "option 'sslmode' must be one of allow, disable, prefer, require, "
                     "verify-ca, verify-full"),
    ("target_session_attrs=any-please", "option 'target_session_attrs' must be one of"),
    ("autocommit=true", "option 'autocommit' is not supported"),
    ("pool_size=4", "option 'pool_size' is not a libpq or psycopg connection option"),
    ("prepare_threshold=%C2%B2", "option 'prepare_threshold' must be a whole number"),
    ("connect_timeout=%C2%B2", "option 'connect_timeout' must be a whole number"),
    (f"dbname=host%3Dh2%20password%3D{PASSWORD}", "option 'dbname' is not taken here"),
])
def test_driver_options_in_the_url_are_checked_at_load_naming_the_option(query, said):
    with pytest.raises(SettingsError) as raised:
        load_deployment_settings({"FAVORITES_DATABASE_URL":
                                  f"postgresql://app:{PASSWORD}@db.internal/favorites?{query}"})
    assert raised.value.variable == "FAVORITES_DATABASE_URL"
    assert said in str(raised.value)
    assert PASSWORD not in str(raised.value)


def test_driver_options_reach_psycopg_with_the_types_it_expects():
    from favorites_maintenance.retention.database import connect_options

    url = load_deployment_settings({"FAVORITES_DATABASE_URL":
                                    "postgresql://app@db.internal/favorites?prepare_threshold=0"
                                    "&connect_timeout=3&sslmode=verify-full"
                                    "&sslrootcert=/etc/ca.pem"
                                    "&options=-c%20search_path%3Dfavorites"}).database_url
    libpq_url, connect_args = connect_options(url)
    assert connect_args == {"prepare_threshold": 0}
    assert dict(libpq_url.query) == {"connect_timeout": "3", "sslmode": "verify-full",
                                     "sslrootcert": "/etc/ca.pem",
                                     "options": "-c search_path=favorites"}
    # Unless the URL asks, nothing is prepared server-side (safe behind a transaction pooler).
    assert connect_options("postgresql+psycopg://app@h/db")[1] == {"prepare_threshold": None}
    assert connect_options("postgresql+psycopg://app@h/db?prepare_threshold=None")[1] == {
        "prepare_threshold": None}


def test_the_settings_of_sharing_the_database_are_read(monkeypatch):
    s = guest_settings(
        monkeypatch,
        FAVORITES_GUEST_RETENTION_BATCH_SIZE="500",
        FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX="2000",
        FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION="PT0.5S",
        FAVORITES_GUEST_RETENTION_MAX_REPLICATION_LAG_BYTES="1048576",
        FAVORITES_GUEST_RETENTION_MAX_WAL_BYTES_PER_SECOND="50000000",
        FAVORITES_GUEST_RETENTION_MAX_PAUSE="PT30S",
        FAVORITES_GUEST_RETENTION_SLEEP_RATIO="0.5",
    )
    assert (s.batch_size, s.batch_size_max) == (500, 2000)
    assert s.sleep_ratio == 0.5
    assert s.target_batch_duration == dt.timedelta(milliseconds=500)
    assert (s.max_replication_lag_bytes, s.max_wal_bytes_per_second) == (1048576, 50_000_000)
    assert s.max_pause == dt.timedelta(seconds=30)


def test_a_zero_target_turns_adaptation_off(monkeypatch):
    for zero in ("PT0S", "00:00:00"):
        s = guest_settings(monkeypatch, FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION=zero)
        assert s.target_batch_duration == dt.timedelta(0)


def test_an_unset_max_is_never_below_the_first_batch(monkeypatch):
    s = guest_settings(monkeypatch, FAVORITES_GUEST_RETENTION_BATCH_SIZE="20000")
    assert (s.batch_size, s.batch_size_max) == (20_000, 20_000)
    with pytest.raises(SettingsError, match="is below FAVORITES_GUEST_RETENTION_BATCH_SIZE"):
        guest_settings(monkeypatch, FAVORITES_GUEST_RETENTION_BATCH_SIZE="2000",
                       FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX="1000")


def test_the_readme_table_of_policy_settings_is_the_declared_one():
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- policy-settings -->\n(.*?)\n<!-- /policy-settings -->", readme,
                      re.S)
    assert found, "README.md has no table between <!-- policy-settings --> markers"
    assert found[1].strip() == markdown_table()


def test_the_purge_takes_each_of_its_settings_from_the_policys():
    settings = parse_policy_settings(
        {"batch_size": "300", "batch_size_max": "900", "max_run_duration": "PT7M",
         "target_batch_duration": "PT0.5S", "sleep_ratio": "1.5",
         "max_replication_lag_bytes": "4096", "max_wal_bytes_per_second": "8192",
         "max_pause": "PT45S"}, {})
    options = settings.purge_options(previous_row_s=0.002)
    assert (options.batch_size, options.batch_size_max, options.max_run_duration,
            options.target_batch_duration, options.sleep_ratio, options.previous_row_s) == (
        300, 900, dt.timedelta(minutes=7), dt.timedelta(seconds=0.5), 1.5, 0.002)
    assert (options.health.max_replication_lag_bytes, options.health.max_wal_bytes_per_second,
            options.health.max_pause) == (4096, 8192, dt.timedelta(seconds=45))


def test_every_field_of_the_policy_files_schema_says_what_it_means():
    schema = RetentionPolicy.get_model_cls().model_json_schema()["properties"]
    assert {"metrics_prefix", "archive_table", "null_columns"} <= set(schema)
    assert [name for name, field in schema.items() if not field.get("description")] == []


@pytest.mark.parametrize("written, comparison", [
    ("", "expires_at < cutoff"),
    ("\n  cutoff_inclusive: false", "expires_at < cutoff"),
    ("\n  cutoff_inclusive: true", "expires_at <= cutoff"),
    ("\n  cutoff_inclusive: yes", "cutoff_inclusive: 'yes' is not true or false"),
])
def test_cutoff_inclusive_is_the_policys_own_and_decides_its_rules_comparison(
        written, comparison):
    from dagster.components.testing import create_defs_folder_sandbox

    from favorites_maintenance.components.retention_policy import policy_template
    from favorites_maintenance.config.policy_settings import LAUNCH_LIMITS

    with create_defs_folder_sandbox() as sandbox:
        folder = sandbox.defs_folder_path / "email_change_requests"
        folder.mkdir()
        (folder / "defs.yaml").write_text(
            "type: favorites_maintenance.RetentionPolicy\nattributes:\n"
            "  name: email_change_requests\n  table: accounts.email_change_requests\n"
            "  key_column: id\n  age_column: expires_at\n  null_columns: []" + written + "\n")
        with sandbox.build_component_tree() as tree:
            if "is not" in comparison:
                with pytest.raises(PolicyLoadError,
                                   match=f"policy email_change_requests, {comparison}"):
                    load_policies(tree)
                return
            [policy] = load_policies(tree)
    assert policy.rule.predicate_sql == comparison
    assert policy.settings.cutoff_inclusive is ("<=" in comparison)
    # Set in the policy's file only: the scaffold offers it at its default, a launch cannot.
    assert "  # cutoff_inclusive: false\n" in policy_template("email_change_requests")
    assert "cutoff_inclusive" not in LAUNCH_LIMITS.values()


def test_a_scaffolded_policy_has_the_partition_its_first_run_launches_at_once():
    """The day a policy is written, the partition its schedule runs first (the last complete
    UTC day) exists already: a launch need not wait for tomorrow."""
    import yaml

    from favorites_maintenance.components.retention_policy import (
        RetentionPolicyScaffoldParams,
        policy_template,
    )
    from favorites_maintenance.pipeline.partitions import daily_partitions_from

    text = policy_template("guest_orders", RetentionPolicyScaffoldParams(
        table="shop.guest_orders", key_column="id", age_column="created_at",
        null_columns="customer_id"))
    start = dt.date.fromisoformat(str(yaml.safe_load(text)["attributes"]["partitions_start"]))
    yesterday = dt.datetime.now(dt.timezone.utc).date() - dt.timedelta(days=1)
    assert daily_partitions_from(start).get_partition_keys() == [yesterday.isoformat()]


def test_the_default_first_partition_follows_the_calendar_so_a_deployment_lists_weeks():
    from favorites_maintenance.config.policy_settings import (
        default_partitions_start,
        parse_policy_settings,
    )

    # A deployment a year after this version's release lists weeks of days, not a year.
    assert default_partitions_start(dt.date(2027, 12, 15)) == dt.date(2027, 11, 1)
    assert default_partitions_start(dt.date(2028, 1, 1)) == dt.date(2027, 12, 1)
    today = dt.datetime.now(dt.timezone.utc).date()
    start = parse_policy_settings({}, {}).partitions_start
    assert start == default_partitions_start(today)
    assert 28 <= (today - start).days <= 62
