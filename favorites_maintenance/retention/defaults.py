"""Values the core owns and the settings layer reads from it.

The core imports nothing from :mod:`favorites_maintenance.config`: the settings take their
defaults for the core's limits, and the default variable of a policy's database, from here.
"""

from __future__ import annotations

import datetime as dt

#: The environment variable holding the database's URL of a policy that names no other
#: (``database_url_env``); the settings layer names it in error messages.
DATABASE_URL_VAR = "FAVORITES_DATABASE_URL"

#: Replication lag (bytes of WAL behind the primary) above which the purge pauses: 64 MiB.
DEFAULT_MAX_REPLICATION_LAG_BYTES = 64 * 2**20
#: How long the purge may stay paused on an unhealthy database before the run ends.
DEFAULT_MAX_PAUSE = dt.timedelta(minutes=2)
