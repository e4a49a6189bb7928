"""The retention policies, one folder each: ``<policy>/defs.yaml`` (README, "Adding a retention
policy")."""
