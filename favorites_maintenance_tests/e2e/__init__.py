"""End-to-end tests: the command line, the Dagster webserver and daemon, the UI in Chromium,
and the bench."""
