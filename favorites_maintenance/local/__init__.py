"""Running things locally: servers started for development, tests and the bench."""
