"""Resources: the favorites database, the retention settings and the alert sink.

Both are built from the validated :class:`~favorites_maintenance.settings.Settings` in
:mod:`favorites_maintenance.definitions`; the database URL reaches Dagster only as an
``EnvVar``, so the UI and the run config never show it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

import dagster as dg
import requests
import sqlalchemy as sa
from pydantic import Field, PrivateAttr

from favorites_maintenance.retention.database import create_engine
from favorites_maintenance.settings import DATABASE_URL_VAR, SettingsError, parse_database_url


_alerts_log = logging.getLogger("favorites_maintenance.alerts")


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
    """The retention policy and the run limits (SPEC 4), shown on the resource page of the UI.

    Values given in a run's config (the launchpad) are validated like the environment's: a
    value not > 0 fails the run when the resource is built, before any op runs.

    Attributes:
        retention_days: guest rows idle longer than this many days are prunable (> 0).
        batch_size: rows per batch transaction (> 0).
        max_run_duration_seconds: time budget of one purge, in seconds (> 0).
    """

    retention_days: int = Field(gt=0, description="Guest rows idle longer are prunable.")
    batch_size: int = Field(gt=0, description="Rows per batch transaction.")
    max_run_duration_seconds: float = Field(gt=0, description="Time budget of one purge.")

    @property
    def max_run_duration(self) -> dt.timedelta:
        """:attr:`max_run_duration_seconds` as a timedelta."""
        return dt.timedelta(seconds=self.max_run_duration_seconds)


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
