"""favorites-maintenance: daily retention cleanup of PostgreSQL tables (Dagster + PostgreSQL),
one retention policy per table; the first prunes stale guest favorites.

:class:`RetentionPolicy` is the component a policy's ``defs.yaml`` names
(``type: favorites_maintenance.RetentionPolicy``).
"""


def __dir__() -> list[str]:
    # dg lists a registry module's component types by dir(): the lazy one included.
    return sorted([*globals(), "RetentionPolicy"])


def __getattr__(name: str):
    # Imported on first use: the command line and the retention core need no Dagster import.
    if name == "RetentionPolicy":
        from favorites_maintenance.components.retention_policy import RetentionPolicy

        return RetentionPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
