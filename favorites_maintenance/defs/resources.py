"""The resources every policy shares: the alert sink and the metrics push, each reading its
URL from the environment by ``dg.EnvVar`` when a run or a sensor tick starts, so the UI and the
run config never show it, and neither settable at launch. The resources that depend on the
policies, the run limits a launch may set (``retention``) and one database per variable the
policies name (``database``, ...), are added by :mod:`favorites_maintenance.definitions`.

The deployment's variables are validated here, when the code location loads: a malformed URL
stops the load with a message naming the variable (a password never shown).
"""

import dagster as dg

from favorites_maintenance.config.deployment import load_deployment_settings
from favorites_maintenance.pipeline.resources import deployed_alerts, deployed_metrics


@dg.definitions
def resources() -> dg.Definitions:
    """``alerts`` and ``metrics``, by reference to their variables."""
    settings = load_deployment_settings()
    return dg.Definitions(resources={"alerts": deployed_alerts(settings),
                                     "metrics": deployed_metrics(settings)})
