"""Tests of the Dagster layer through Dagster's own machinery (materialize, execute_in_process,
instances, sensor contexts): the component, the asset and its checks, jobs, schedules, sensors,
resources, metrics and traces."""
