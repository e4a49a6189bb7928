"""The resource keys of the guest-favorites policy's definitions, as run config and sensor
contexts name them."""

from favorites_maintenance.config.policy import (
    ALERTS_KEY,
    METRICS_KEY,
    database_resource_key,
    run_limits_key,
)
from favorites_maintenance.retention.defaults import DATABASE_URL_VAR

#: The run limits of ``guest_favorites``: ``resources.<LIMITS_KEY>.config`` of a launch.
LIMITS_KEY = run_limits_key("guest_favorites")
#: The database of ``FAVORITES_DATABASE_URL``.
DATABASE_KEY = database_resource_key(DATABASE_URL_VAR)

__all__ = ["ALERTS_KEY", "DATABASE_KEY", "LIMITS_KEY", "METRICS_KEY"]
