"""The Dagster layer: what the ``RetentionPolicy`` component builds for one policy (the op graph
as a daily-partitioned asset, its checks, job, schedule and sensors) and the resources and
run reporting they use."""
