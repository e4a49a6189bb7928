"""A cleanup run's figures as Prometheus gauges, pushed to a Pushgateway when the run ends.

A daily batch job is gone before Prometheus could scrape it, so each run pushes its figures
to a Pushgateway (``FAVORITES_METRICS_PUSHGATEWAY_URL``), which Prometheus scrapes. The group
of a policy is ``job=<name>_cleanup, policy=<name>``; its gauges are named after the policy's
``metrics_prefix`` (``favorites_guest_cleanup_*`` for guest favorites):

===========================================  ==================================================
``<prefix>_deleted_rows``                    rows the run deleted, every attempt of its purge
``<prefix>_batches``                         batch transactions that deleted rows
``<prefix>_run_duration_seconds``            wall time of the purge, seconds
``<prefix>_skipped_rows``                    prunable rows left because deleting them failed
``<prefix>_backlog_rows``                    rows the rule still matched after the run
``<prefix>_last_run_success``                1: the run succeeded; 0: it failed or was stopped
``<prefix>_last_run_timestamp_seconds``      when the run ended, Unix seconds
``<prefix>_last_success_timestamp_seconds``  when the last successful run ended, Unix seconds
===========================================  ==================================================

They are gauges, not counters: each push states the last run's values, which a scrape reads as
they are; nothing accumulates in a process that lives on.

A successful run replaces its group whole (HTTP ``PUT``). A failed or stopped run adds to it
(HTTP ``POST``, which replaces only the gauges it sends) and sends neither
``last_success_timestamp_seconds`` nor, when it was not measured, ``backlog_rows``: the last
success and the last measured backlog stay as they were.

This module imports no Dagster. A push never raises: a failing gateway is logged (the URL
without its user and password) and the run goes on.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import unquote, urlsplit, urlunsplit

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import (
    basic_auth_handler,
    default_handler,
    push_to_gateway,
    pushadd_to_gateway,
)

from favorites_maintenance.config.parsers import safe_http_url
from favorites_maintenance.config.policy import Policy
from favorites_maintenance.pipeline.run_report import RunReport

#: Seconds one push may take before it is given up (the run has ended its work by then).
PUSH_TIMEOUT_S = 10.0

#: Gauge suffix -> help text. The texts must not change from one push to the next: the
#: Pushgateway refuses a group whose help differs from another group's for one metric name.
GAUGES: dict[str, str] = {
    "deleted_rows": "Rows the last cleanup run deleted (every attempt of its purge).",
    "batches": "Batch transactions of the last cleanup run that deleted rows.",
    "run_duration_seconds": "Wall time of the last cleanup run's purge, in seconds.",
    "skipped_rows": "Prunable rows the last cleanup run left because deleting them failed.",
    "backlog_rows": "Rows the retention rule still matched after the last measured run.",
    "last_run_success": "1 if the last cleanup run succeeded, 0 if it failed or was stopped.",
    "last_run_timestamp_seconds": "When the last cleanup run ended, Unix time in seconds.",
    "last_success_timestamp_seconds": "When the last successful cleanup run ended, Unix time "
                                      "in seconds.",
}

_log = logging.getLogger(__name__)


def grouping(policy: Policy) -> tuple[str, dict[str, str]]:
    """The Pushgateway group of ``policy``'s runs: its ``job`` (``<name>_cleanup``) and the
    other grouping labels (``{"policy": <name>}``)."""
    return policy.cleanup, {"policy": policy.name}


def run_registry(policy: Policy, report: RunReport, *, succeeded: bool,
                 ended_at: float) -> CollectorRegistry:
    """The gauges of one run of ``policy``, in a registry of their own.

    Args:
        report: what the run did; ``backlog_remaining`` ``None`` leaves ``backlog_rows`` out.
        succeeded: whether the run succeeded; ``last_success_timestamp_seconds`` is only in
            the registry of a successful run.
        ended_at: when the run ended, Unix seconds.
    """
    registry = CollectorRegistry()
    values = {
        "deleted_rows": report.deleted_total,
        "batches": report.batches,
        "run_duration_seconds": report.duration_ms / 1000,
        "skipped_rows": report.skipped_rows,
        "backlog_rows": report.backlog_remaining,
        "last_run_success": 1 if succeeded else 0,
        "last_run_timestamp_seconds": ended_at,
        "last_success_timestamp_seconds": ended_at if succeeded else None,
    }
    for suffix, value in values.items():
        if value is not None:
            Gauge(f"{policy.metrics_prefix}_{suffix}", GAUGES[suffix],
                  registry=registry).set(value)
    return registry


def push_run(gateway_url: str, policy: Policy, report: RunReport, *, succeeded: bool,
             ended_at: float | None = None, timeout: float = PUSH_TIMEOUT_S,
             log: logging.Logger | None = None) -> bool:
    """Push the gauges of one run of ``policy`` to the Pushgateway at ``gateway_url``
    (``http(s)://[user:password@]host[:port][/path]``; a user and password are sent as HTTP
    basic auth). Never raises.

    Args:
        report: what the run did (see :func:`run_registry`).
        succeeded: a successful run replaces the group (``PUT``); a failed or stopped one
            replaces only the gauges it sends (``POST``), keeping the last success's time.
        ended_at: when the run ended, Unix seconds; default now.
        timeout: seconds the push may take.
        log: where a failed push is reported (default this module's logger); the message
            carries the URL without its user and password.

    Returns:
        ``True`` when the gateway took the push, ``False`` otherwise.
    """
    registry = run_registry(policy, report, succeeded=succeeded,
                            ended_at=time.time() if ended_at is None else ended_at)
    job, grouping_key = grouping(policy)
    push = push_to_gateway if succeeded else pushadd_to_gateway
    try:
        gateway, handler = _gateway_and_handler(gateway_url)
        push(gateway, job=job, registry=registry, grouping_key=grouping_key, timeout=timeout,
             handler=handler)
    except Exception as exc:  # noqa: BLE001 - metrics must never fail the run
        (log or _log).warning(
            f"metrics push to {safe_http_url(gateway_url)} failed (the run is not affected): "
            f"{_without(type(exc).__name__ + ': ' + str(exc), gateway_url)}")
        return False
    return True


def _gateway_and_handler(gateway_url: str):
    """The gateway URL without its user and password, and the client handler sending them as
    basic auth (``urllib`` does not take them from the URL)."""
    parts = urlsplit(gateway_url)
    netloc = parts.netloc.rpartition("@")[2]
    gateway = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    if parts.username is None:
        return gateway, default_handler
    username, password = unquote(parts.username), unquote(parts.password or "")

    def handler(url, method, timeout, headers, data):
        return basic_auth_handler(url, method, timeout, headers, data, username, password)

    return gateway, handler


def _without(text: str, gateway_url: str) -> str:
    """``text`` with the URL and its password, should an error quote them, masked."""
    text = text.replace(gateway_url, safe_http_url(gateway_url))
    password = urlsplit(gateway_url).password
    for secret in {password, unquote(password or "")} - {None, ""}:
        text = text.replace(secret, "***")
    return text
