"""The deployment's settings: where the databases, the alert webhook and the Pushgateway are,
and how long a run may go without a heartbeat before it is taken for dead.

A policy's database is the URL held by the variable its ``database_url_env`` names
(``FAVORITES_DATABASE_URL`` by default): :func:`load_database_url` reads and validates it.

These are not a policy's: they come from ``FAVORITES_*`` environment variables of the process
serving the code location, never from a policy's YAML or a run's config. The URLs of the
databases, the webhook and the Pushgateway are secrets or may hold one (a password, a token):
Dagster receives them as ``dg.EnvVar`` references (:func:`favorites_maintenance.pipeline.resources.policy_resources`),
so the UI and the run config never show them. The Dagster UI's base URL, which alerts link to,
is not (a user or password in it is refused) and is passed as its value.
:func:`load_deployment_settings` proves them valid, when the code location loads and whenever
the command line starts.

This module imports no Dagster.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy.engine import URL

from favorites_maintenance.config.parsers import (
    ALERT_WEBHOOK_URL_VAR,
    METRICS_PUSHGATEWAY_URL_VAR,
    RUN_HEARTBEAT_TIMEOUT_VAR,
    WEBSERVER_BASE_URL_VAR,
    SettingsError,
    duration_between,
    http_url,
    parse_database_url,
    parse_pushgateway_url,
    parse_webserver_base_url,
    read_optional,
    safe_url,
)
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR

#: How long a run's steps may go without a heartbeat before the run is taken for dead, unless
#: ``FAVORITES_RUN_HEARTBEAT_TIMEOUT`` says otherwise: eight heartbeats missed.
RUN_HEARTBEAT_TIMEOUT = dt.timedelta(minutes=2)
#: The bounds of ``FAVORITES_RUN_HEARTBEAT_TIMEOUT``: below 30 s a busy storage could pass for a
#: dead run; above an hour, run monitoring's own ceiling (``dagster.yaml``) comes first.
RUN_HEARTBEAT_TIMEOUT_BOUNDS = (dt.timedelta(seconds=30), dt.timedelta(hours=1))


@dataclass(frozen=True)
class DeploymentSettings:
    """The validated deployment settings.

    Attributes:
        database_url: SQLAlchemy URL of the favorites database, always with the
            ``postgresql+psycopg`` driver, or ``None`` when ``FAVORITES_DATABASE_URL`` is unset
            (the command line then starts the embedded server). Never log it: use
            :attr:`database_url_safe`.
        alert_webhook_url: optional Slack-compatible webhook for alerts.
        metrics_pushgateway_url: optional Prometheus Pushgateway every run pushes its gauges
            to (``http(s)://[user:password@]host[:port][/prefix]``); it may hold credentials,
            so never log it: use :func:`~favorites_maintenance.config.parsers.safe_http_url`.
        webserver_base_url: optional base URL of the Dagster UI (no credentials): a failed
            run's alert links to ``<base>/runs/<run id>``.
        run_heartbeat_timeout: how long the steps of a run may go without a heartbeat before
            the run is taken for dead and marked FAILURE (:data:`RUN_HEARTBEAT_TIMEOUT`
            unless ``FAVORITES_RUN_HEARTBEAT_TIMEOUT`` says otherwise, 30 s to 1 h).
    """

    database_url: URL | None = field(default=None, repr=False)
    alert_webhook_url: str | None = field(default=None, repr=False)
    metrics_pushgateway_url: str | None = field(default=None, repr=False)
    webserver_base_url: str | None = None
    run_heartbeat_timeout: dt.timedelta = field(default_factory=lambda: RUN_HEARTBEAT_TIMEOUT)

    @property
    def database_url_safe(self) -> str | None:
        """The database URL with its password replaced by ``***``, fit for logs."""
        return None if self.database_url is None else safe_url(self.database_url)

    def require_database_url(self) -> URL:
        """Return :attr:`database_url`; raise :class:`SettingsError` when it is unset."""
        if self.database_url is None:
            raise SettingsError(DATABASE_URL_VAR, "is not set; give the SQLAlchemy URL of the "
                                "favorites database (postgresql+psycopg://user:password@host/db)")
        return self.database_url


def load_deployment_settings(environ: Mapping[str, str] | None = None) -> DeploymentSettings:
    """Read and validate the deployment's variables of ``environ`` (default ``os.environ``).

    An unset variable is unset. A variable set to an empty or blank string is an error: an
    empty value is almost always a broken deployment template.

    Raises:
        SettingsError: the first invalid variable, named (a URL's password never shown).
    """
    environ = os.environ if environ is None else environ
    # Read once per value: every policy of a code location reads the same variables.
    return _deployment_settings(tuple(environ.get(name) for name in _DEPLOYMENT_VARIABLES))


#: The variables :func:`load_deployment_settings` reads.
_DEPLOYMENT_VARIABLES = (DATABASE_URL_VAR, ALERT_WEBHOOK_URL_VAR, METRICS_PUSHGATEWAY_URL_VAR,
                         WEBSERVER_BASE_URL_VAR, RUN_HEARTBEAT_TIMEOUT_VAR)


@functools.lru_cache(maxsize=16)
def _deployment_settings(values: tuple[str | None, ...]) -> DeploymentSettings:
    environ = {name: value for name, value in zip(_DEPLOYMENT_VARIABLES, values)
               if value is not None}
    return DeploymentSettings(
        database_url=read_optional(environ, DATABASE_URL_VAR, parse_database_url),
        alert_webhook_url=read_optional(environ, ALERT_WEBHOOK_URL_VAR, http_url),
        metrics_pushgateway_url=read_optional(environ, METRICS_PUSHGATEWAY_URL_VAR,
                                              parse_pushgateway_url),
        webserver_base_url=read_optional(environ, WEBSERVER_BASE_URL_VAR,
                                         parse_webserver_base_url),
        run_heartbeat_timeout=read_optional(environ, RUN_HEARTBEAT_TIMEOUT_VAR,
                                            duration_between(*RUN_HEARTBEAT_TIMEOUT_BOUNDS),
                                            RUN_HEARTBEAT_TIMEOUT),
    )


def load_database_url(variable: str = DATABASE_URL_VAR,
                      environ: Mapping[str, str] | None = None) -> URL | None:
    """The validated SQLAlchemy URL held by ``variable`` in ``environ`` (default
    ``os.environ``), the ``postgresql+psycopg`` driver pinned; ``None`` when it is unset.

    Raises:
        SettingsError: under ``variable``: set but empty, or not a usable URL (a password
            never shown).
    """
    environ = os.environ if environ is None else environ
    return read_optional(environ, variable,
                         lambda raw: parse_database_url(raw, variable=variable))


def require_database_url(variable: str = DATABASE_URL_VAR,
                         environ: Mapping[str, str] | None = None) -> URL:
    """:func:`load_database_url`, for a command that needs the database now.

    Raises:
        SettingsError: under ``variable``: unset, empty, or not a usable URL.
    """
    url = load_database_url(variable, environ)
    if url is None:
        raise SettingsError(variable, "is not set; give the SQLAlchemy URL of the policy's "
                            "database (postgresql+psycopg://user:password@host/db)")
    return url


def check_database_urls(variables: Iterable[str],
                        environ: Mapping[str, str] | None = None) -> None:
    """Validate the database URL of each of ``variables`` that is set; an unset one is left to
    the runs of its policies, which fail naming it.

    Raises:
        SettingsError: the first variable set to an invalid URL, named.
    """
    for variable in dict.fromkeys(variables):
        load_database_url(variable, environ)
