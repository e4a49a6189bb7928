"""What the tests share: running a job and reading back what Dagster recorded, and the real
servers some tests start (PgBouncer, a Pushgateway, the Dagster webserver and daemon)."""
