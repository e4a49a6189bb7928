"""favorites-maintenance: daily retention cleanup of stale guest favorites (Dagster + PostgreSQL)."""
