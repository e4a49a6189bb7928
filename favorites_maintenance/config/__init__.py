"""Configuration without Dagster: a policy's settings (one declarative table), the
deployment's settings (URLs from the environment), the parsers both use, and the
:class:`~favorites_maintenance.config.policy.Policy` a policy's YAML becomes."""
