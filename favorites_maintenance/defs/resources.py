"""The resources every policy shares: the alert sink and the metrics push, each reading its
URL from the environment by ``dg.EnvVar`` when a run starts, so the UI and the run config never
show it. The resources that depend on the policies, the run limits a launch may set
(``retention``) and one database per variable the policies name (``database``, ...), are added
by :mod:`favorites_maintenance.definitions`.

The deployment's variables are validated here, when the code location loads: a malformed URL
stops the load with a message naming the variable (a password never shown).
"""

import dagster as dg

from favorites_maintenance.config.deployment import load_deployment_settings
from favorites_maintenance.config.parsers import (
    ALERT_WEBHOOK_URL_VAR,
    METRICS_PUSHGATEWAY_URL_VAR,
)
from favorites_maintenance.pipeline.resources import AlertSink, MetricsPush


@dg.definitions
def resources() -> dg.Definitions:
    """``alerts`` and ``metrics``, by reference to their variables."""
    settings = load_deployment_settings()
    return dg.Definitions(resources={
        # The webhook URL holds a token: pass it by reference, only when it is set.
        "alerts": AlertSink(webhook_url=dg.EnvVar(ALERT_WEBHOOK_URL_VAR)
                            if settings.alert_webhook_url else None,
                            # Not a secret (credentials are refused): alerts show it.
                            webserver_base_url=settings.webserver_base_url),
        # The gateway URL may hold a user and password: by reference too.
        "metrics": MetricsPush(gateway_url=dg.EnvVar(METRICS_PUSHGATEWAY_URL_VAR)
                               if settings.metrics_pushgateway_url else None),
    })
