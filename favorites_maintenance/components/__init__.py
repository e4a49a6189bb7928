"""The component types of favorites-maintenance; their instances are the YAML files of
``favorites_maintenance/defs/``."""

from favorites_maintenance.components.retention_policy import RetentionPolicy

__all__ = ["RetentionPolicy"]
