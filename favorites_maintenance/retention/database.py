"""Engines for the favorites database (SQLAlchemy Core over psycopg 3).

Every engine of the project is made here so that the same safety settings always apply:
bound parameters are hidden from error messages (a failing statement must never print an
anonymous id or a note), passwords are never rendered, the connection identifies itself to
``pg_stat_activity`` as ``favorites-maintenance``, connections that go stale while pooled (a
server restart) are replaced on checkout, and no network wait is unbounded.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

APPLICATION_NAME = "favorites-maintenance"

#: Client-side bounds on network waits (libpq parameters), unless the URL sets them.
NETWORK_LIMITS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def create_engine(url: URL | str, *, application_name: str = APPLICATION_NAME,
                  **kwargs: Any) -> sa.Engine:
    """Create an engine for the favorites database.

    Args:
        url: SQLAlchemy URL with the ``postgresql+psycopg`` driver (see
            :func:`favorites_maintenance.settings.parse_database_url`).
        application_name: shown in ``pg_stat_activity``; tests use it to find our sessions.
        **kwargs: passed to :func:`sqlalchemy.create_engine`.

    Returns:
        An engine whose connections open lazily: creating it never touches the server.
    """
    url = make_url(url)
    # libpq waits without limit by default: for a host that drops packets or accepts and never
    # answers (connect), and for a peer that vanished mid-statement (keepalives; TCP only).
    # Values in the URL's query win, so an operator can still tune them there.
    network_limits = {k: v for k, v in NETWORK_LIMITS.items() if k not in url.query}
    connect_args = {"application_name": application_name, **network_limits,
                    **kwargs.pop("connect_args", {})}
    return sa.create_engine(
        url,
        hide_parameters=True,
        pool_pre_ping=True,
        connect_args=connect_args,
        **kwargs,
    )
