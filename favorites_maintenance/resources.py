"""Resources: the favorites database, the retention settings and the alert sink.

All three are built from the validated :class:`~favorites_maintenance.settings.Settings` in
:mod:`favorites_maintenance.definitions`. The job deletes rows for good, so what it deletes is
decided by the deployment alone: :func:`deployed_database` and :func:`deployed_retention` serve
the database and the retention days as the code location's environment gives them, and a run's
config (the launchpad, a re-execution, ``execute_in_process``) may set only the run limits, within
the same bounds as the environment's values. Anything else is refused when the run is launched,
before a run exists, with a message naming the variable that configures it. The database URL
reaches Dagster only as an ``EnvVar``, so the UI and the run config never show it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from typing import Any

import dagster as dg
import requests
import sqlalchemy as sa
from pydantic import Field, PrivateAttr

from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.retention.health import HealthLimits
from favorites_maintenance.settings import (
    BATCH_SIZE_VAR,
    DATABASE_URL_VAR,
    DEFAULT_BATCH_SIZE_MAX,
    DEFAULT_MAX_PAUSE,
    DEFAULT_MAX_REPLICATION_LAG_BYTES,
    DEFAULT_TARGET_BATCH_DURATION,
    MAX_BATCH_SIZE,
    MAX_RUN_DURATION_LIMIT,
    MAX_RUN_DURATION_VAR,
    MIN_DURATION,
    RETENTION_DAYS_VAR,
    SettingsError,
    parse_database_url,
)


_alerts_log = logging.getLogger("favorites_maintenance.alerts")

#: Where the code location reads its settings from, as the refusals tell the operator.
_WHERE = "the environment of the process serving the code location (README, \"Configuration\")"

class FavoritesDatabase(dg.ConfigurableResource):
    """The PostgreSQL database holding ``favorites.favorites``.

    Attributes:
        url: SQLAlchemy URL (``postgresql+psycopg://…``); a secret, pass it as
            ``dg.EnvVar("FAVORITES_DATABASE_URL")``.

    The engine opens connections lazily, once per step, and is disposed when the step ends.
    """

    url: str
    _engine: sa.Engine | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        try:
            self._engine = create_engine(parse_database_url(self.url))
        except SettingsError:
            raise
        except Exception:
            raise SettingsError(DATABASE_URL_VAR, "could not be used to build an engine") from None

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine; only inside a step (after ``setup_for_execution``)."""
        if self._engine is None:
            self._engine = create_engine(parse_database_url(self.url))
        return self._engine


class GuestRetention(dg.ConfigurableResource):
    """The retention days and the run limits of the cleanup.

    The code location builds it from the validated environment and serves it through
    :func:`deployed_retention`, which lets a run's config set only the limits, within the
    bounds of their variables. Built directly (tests, scripts), any positive values are taken.

    Attributes:
        retention_days: guest rows idle longer than this many days are prunable (> 0);
            ``FAVORITES_GUEST_RETENTION_DAYS``.
        batch_size: rows per batch transaction (> 0); ``FAVORITES_GUEST_RETENTION_BATCH_SIZE``.
        max_run_duration_seconds: time budget of one purge, in seconds (> 0);
            ``FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION``.
        batch_size_max: the largest the adaptive batch size may grow, rows;
            ``FAVORITES_GUEST_RETENTION_BATCH_SIZE_MAX``.
        target_batch_duration_seconds: wall time a batch aims at, in seconds; 0 keeps every
            batch at ``batch_size``; ``FAVORITES_GUEST_RETENTION_TARGET_BATCH_DURATION``.
        max_replication_lag_bytes: replication lag above which the purge pauses, bytes;
            ``FAVORITES_GUEST_RETENTION_MAX_REPLICATION_LAG_BYTES``.
        max_wal_bytes_per_second: WAL rate above which the purge pauses (``None``: not
            watched); ``FAVORITES_GUEST_RETENTION_MAX_WAL_BYTES_PER_SECOND``.
        max_pause_seconds: the longest pause before the run ends ``db_unhealthy``, seconds;
            ``FAVORITES_GUEST_RETENTION_MAX_PAUSE``.
    """

    retention_days: int = Field(gt=0, description="Guest rows idle longer are prunable.")
    batch_size: int = Field(gt=0, description="Rows of the first batch transaction.")
    max_run_duration_seconds: float = Field(gt=0, description="Time budget of one purge.")
    batch_size_max: int = Field(default=DEFAULT_BATCH_SIZE_MAX, gt=0,
                                description="Largest adaptive batch size.")
    target_batch_duration_seconds: float = Field(
        default=DEFAULT_TARGET_BATCH_DURATION.total_seconds(), ge=0,
        description="Wall time a batch aims at; 0: fixed batch size.")
    max_replication_lag_bytes: int = Field(default=DEFAULT_MAX_REPLICATION_LAG_BYTES, gt=0,
                                           description="Pause above this replication lag.")
    max_wal_bytes_per_second: int | None = Field(default=None, gt=0,
                                                 description="Pause above this WAL rate.")
    max_pause_seconds: float = Field(default=DEFAULT_MAX_PAUSE.total_seconds(), gt=0,
                                     description="Longest pause before the run ends.")

    @property
    def max_run_duration(self) -> dt.timedelta:
        """:attr:`max_run_duration_seconds` as a timedelta."""
        return dt.timedelta(seconds=self.max_run_duration_seconds)

    @property
    def target_batch_duration(self) -> dt.timedelta:
        """:attr:`target_batch_duration_seconds` as a timedelta."""
        return dt.timedelta(seconds=self.target_batch_duration_seconds)

    @property
    def health(self) -> HealthLimits:
        """The thresholds of the database health indicators."""
        return HealthLimits(max_replication_lag_bytes=self.max_replication_lag_bytes,
                            max_wal_bytes_per_second=self.max_wal_bytes_per_second,
                            max_pause=dt.timedelta(seconds=self.max_pause_seconds))


#: The run limits a launch may set (run config ``resources.retention.config``), with their
#: variable, bounds and type: a batch is one transaction holding row locks, and the time budget
#: stays under the run ceiling of ``dagster.yaml``.
LAUNCH_LIMITS: dict[str, tuple[str, float, float, type]] = {
    "batch_size": (BATCH_SIZE_VAR, 1, MAX_BATCH_SIZE, int),
    "max_run_duration_seconds": (MAX_RUN_DURATION_VAR, MIN_DURATION.total_seconds(),
                                 MAX_RUN_DURATION_LIMIT.total_seconds(), float),
}


#: Fields of :class:`GuestRetention` only the deployment sets (their variables), passed through
#: unchanged by :func:`deployed_retention`.
_DEPLOYMENT_ONLY = ("batch_size_max", "target_batch_duration_seconds",
                    "max_replication_lag_bytes", "max_wal_bytes_per_second", "max_pause_seconds")


def _refuse(message: str, config: Any) -> dg.DagsterInvalidConfigError:
    return dg.DagsterInvalidConfigError(message, [], config)


def deployed_retention(deployed: GuestRetention) -> dg.ResourceDefinition:
    """The ``retention`` resource of the code location: ``deployed`` (built from the
    environment), with the run limits open to a run's config and nothing else.

    Run config ``resources.retention.config`` may hold ``batch_size`` (rows, 1 to 100,000) and
    ``max_run_duration_seconds`` (seconds, 1 to 3,000), the bounds of
    ``FAVORITES_GUEST_RETENTION_BATCH_SIZE`` and ``FAVORITES_GUEST_RETENTION_MAX_RUN_DURATION``;
    the launchpad offers the deployed values. The retention days are the deployment's: a
    ``retention_days`` other than the deployed value (which changes nothing) is refused, and so
    is any other key. The table, the guard and the age column are fixed in
    :mod:`favorites_maintenance.retention.rule` and have no config at all.

    The check runs when Dagster resolves the run config: in the code server when a run is
    launched from the UI or GraphQL (the launch fails, no run is created) and before
    ``execute_in_process`` creates its run.

    Raises (at launch):
        dagster.DagsterInvalidConfigError: naming the key, the value and the variable that
            configures it.
    """
    days = deployed.retention_days

    def at_launch(config: Mapping[str, Any]) -> dict[str, Any]:
        values = {"retention_days": days, "batch_size": deployed.batch_size,
                  "max_run_duration_seconds": deployed.max_run_duration_seconds}
        # Sharing the database is the deployment's business, like the retention.
        fixed = {name: getattr(deployed, name) for name in _DEPLOYMENT_ONLY}
        for key, value in config.items():
            if key == "retention_days":
                if value is None or value == days:
                    continue
                raise _refuse(
                    f"retention_days={value!r} refused: the retention is not set at launch. It "
                    f"is {RETENTION_DAYS_VAR} ({days} days in this deployment), read from "
                    f"{_WHERE}; change it there, reviewed, and restart that process.", config)
            if key not in LAUNCH_LIMITS:
                raise _refuse(
                    f"{key!r} refused: a launch may set only {', '.join(LAUNCH_LIMITS)}. The "
                    f"rule (table, guard user_id IS NULL, age column updated_at, retention days) "
                    f"is fixed by the deployment: {RETENTION_DAYS_VAR} in {_WHERE}.", config)
            variable, low, high, kind = LAUNCH_LIMITS[key]
            if value == values[key]:
                continue  # the deployment's own value (the launchpad's default)
            if not low <= value <= high:
                shown = int(value) if float(value).is_integer() else value  # 0, not 0.0
                raise _refuse(
                    f"{key}={shown!r} refused: it must be between {low:,g} and {high:,g}, "
                    f"the bounds of {variable}.", config)
            values[key] = kind(value)
        return {**values, **fixed}

    description = (
        f"Retention: guest rows idle longer than {days} days are prunable "
        f"({RETENTION_DAYS_VAR}; fixed by the deployment, not settable at launch). Run limits: "
        f"batch_size {deployed.batch_size} rows, max_run_duration_seconds "
        f"{deployed.max_run_duration_seconds:g} s ({BATCH_SIZE_VAR}, {MAX_RUN_DURATION_VAR}); a "
        f"launch may change them within the same bounds.")
    schema = dg.Permissive({
        "batch_size": dg.Field(int, default_value=deployed.batch_size,
                               description=f"Rows per batch transaction, 1 to {MAX_BATCH_SIZE:,} "
                               f"({BATCH_SIZE_VAR})."),
        "max_run_duration_seconds": dg.Field(
            float, default_value=float(deployed.max_run_duration_seconds),
            description=f"Time budget of the purge in seconds, "
            f"{MIN_DURATION.total_seconds():g} to {MAX_RUN_DURATION_LIMIT.total_seconds():g} "
            f"({MAX_RUN_DURATION_VAR})."),
    })
    return deployed.get_resource_definition().configured(at_launch, config_schema=schema,
                                                          description=description)


def deployed_database() -> dg.ResourceDefinition:
    """The ``database`` resource of the code location: the favorites database of
    ``FAVORITES_DATABASE_URL`` (read by ``EnvVar`` when the run starts), which no run config
    can change: any ``resources.database.config`` is refused at launch, naming the variable, so
    a launch can neither point the job at another database nor leave a password in a run's
    config.

    Raises (at launch):
        dagster.DagsterInvalidConfigError: any key given in run config.
    """
    def at_launch(config: Mapping[str, Any]) -> dict[str, Any]:
        if config:
            raise _refuse(
                f"{', '.join(sorted(config))} refused: the favorites database is not chosen at "
                f"launch. It is {DATABASE_URL_VAR}, read from {_WHERE}.", config)
        return {"url": {"env": DATABASE_URL_VAR}}  # resolved by Dagster when the run starts

    return FavoritesDatabase(url=dg.EnvVar(DATABASE_URL_VAR)).get_resource_definition().configured(
        at_launch, config_schema=dg.Permissive({}),
        description=f"The favorites database: {DATABASE_URL_VAR} (by reference, never shown); "
        "not settable at launch.")


class AlertSink(dg.ConfigurableResource):
    """Where alerts go: the log always, and a Slack-compatible webhook when one is configured.

    Attributes:
        webhook_url: optional URL receiving ``POST {"text": ...}`` (JSON); a secret, pass it as
            ``dg.EnvVar("FAVORITES_ALERT_WEBHOOK_URL")``. Never logged.
        timeout_seconds: per-attempt HTTP timeout, in seconds.
        attempts: HTTP attempts before giving up (with 1 s, 2 s, ... pauses between them).
    """

    webhook_url: str | None = None
    timeout_seconds: float = 5.0
    attempts: int = 3

    def send(self, text: str, *, log: logging.Logger | None = None,
             level: int = logging.ERROR) -> bool:
        """Log ``text`` and post it to the webhook, if any. Never raises.

        Returns:
            ``True`` when the webhook accepted it (or none is configured), ``False`` when every
            attempt failed (the failure is logged, without the URL).
        """
        logger = log or _alerts_log
        logger.log(level, "ALERT: %s", text)
        if not self.webhook_url:
            return True
        for attempt in range(1, self.attempts + 1):
            try:
                response = requests.post(self.webhook_url, json={"text": text},
                                         timeout=self.timeout_seconds)
                if response.status_code < 300:
                    return True
                problem = f"HTTP {response.status_code}"
            except requests.RequestException as exc:
                problem = type(exc).__name__
            logger.warning("alert webhook attempt %d/%d failed: %s", attempt, self.attempts,
                           problem)
            if attempt < self.attempts:
                time.sleep(attempt)
        return False
