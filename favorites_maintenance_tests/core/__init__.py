"""Tests of the retention core on a real PostgreSQL: the rule, the batched purge, the health
indicators, the errors; no Dagster."""
