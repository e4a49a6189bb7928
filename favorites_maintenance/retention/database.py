"""Engines for the favorites database (SQLAlchemy Core over psycopg 3).

Every engine of the project is made here so that the same safety settings always apply:
bound parameters are hidden from error messages (a failing statement must never print an
anonymous id or a note), passwords are never rendered, and the connection identifies itself to
``pg_stat_activity`` as ``favorites-maintenance``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

APPLICATION_NAME = "favorites-maintenance"


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
    connect_args = {"application_name": application_name, **kwargs.pop("connect_args", {})}
    return sa.create_engine(
        url,
        hide_parameters=True,
        pool_pre_ping=True,
        connect_args=connect_args,
        **kwargs,
    )
