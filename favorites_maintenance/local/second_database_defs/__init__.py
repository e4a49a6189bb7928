"""The policy ``dev`` and ``demo`` add on their second embedded database (README, "The Dagster
UI"): one folder, like the policies of ``favorites_maintenance/defs/``. It is not part of the
deployed code location."""
