"""Example for policy authors: test your rule's boundary, not the presence of the machinery.

``favorites_maintenance.testing.prunable_keys(policy_name, connection, now=...)`` returns the
keys the policy's job would delete if it ran at ``now`` (the cutoff derived from ``now`` as the
job derives it), and deletes nothing. A test then reads as the rule does: a row just past the
retention is prunable, one just inside it is not, and neither is an account row or a request
that has not expired yet. The row exactly at the cutoff is where the policy's comparison shows:
kept by the default ``<``, prunable with ``cutoff_inclusive: true`` (``<=``, as Laravel writes
it).

The guest-favorites policy is the real ``defs/guest_favorites/defs.yaml``. The expiring
requests' policy is written into a sandbox defs folder here, since this repository does not
ship it; a policy of your own lives in ``favorites_maintenance/defs/`` and needs no ``tree``.
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
import yaml
from dagster.components.testing import create_defs_folder_sandbox

from favorites_maintenance.testing import prunable_keys

NOW = dt.datetime(2026, 6, 16, 12, 0, tzinfo=dt.timezone.utc)
DAY = dt.timedelta(days=1)
MICROSECOND = dt.timedelta(microseconds=1)


def insert(conn, sql: str, **values) -> int:
    return conn.execute(sa.text(sql + " RETURNING id"), values).scalar_one()


def test_guest_favorites_idle_past_the_retention_are_prunable_account_rows_never(
        engine, monkeypatch):
    monkeypatch.delenv("FAVORITES_GUEST_RETENTION_DAYS", raising=False)  # 365 days
    add = ("INSERT INTO favorites.favorites (user_id, anonymous_id, item_id, updated_at) "
           "VALUES (:user_id, gen_random_uuid(), 1, :updated_at)")
    with engine.begin() as conn:
        expired = insert(conn, add, user_id=None, updated_at=NOW - 366 * DAY)
        insert(conn, add, user_id=None, updated_at=NOW - 364 * DAY)  # inside the retention
        insert(conn, add, user_id=7, updated_at=NOW - 900 * DAY)  # an account's: never

        assert prunable_keys("guest_favorites", conn, now=NOW) == [expired]


@pytest.fixture(params=[False, True], ids=["strict", "inclusive"])
def expiring_requests_policy(request, engine):
    """The policy of the Laravel write-up's ``UserEmailChangeRequest``: every request whose
    ``expires_at`` is more than 30 days past (or exactly 30 days, with ``cutoff_inclusive``:
    the parameter), whoever owns it, and its table; yields the component tree and whether the
    cutoff is inclusive."""
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE SCHEMA accounts;
            CREATE TABLE accounts.email_change_requests (
                id bigserial PRIMARY KEY,
                user_id bigint NOT NULL,
                expires_at timestamptz NOT NULL);
            CREATE INDEX ON accounts.email_change_requests (expires_at, id);""")
    with create_defs_folder_sandbox() as sandbox:
        folder = sandbox.defs_folder_path / "email_change_requests"
        folder.mkdir()
        (folder / "defs.yaml").write_text(yaml.safe_dump({
            "type": "favorites_maintenance.RetentionPolicy",
            "attributes": {"name": "email_change_requests",
                           "table": "accounts.email_change_requests",
                           "key_column": "id", "age_column": "expires_at",
                           "null_columns": [],  # no guard, on purpose
                           "retention_days": 30, "cutoff_inclusive": request.param}}))
        with sandbox.build_component_tree() as tree:
            yield tree, request.param


def test_requests_expired_more_than_30_days_ago_are_prunable(engine, expiring_requests_policy):
    tree, inclusive = expiring_requests_policy
    add = ("INSERT INTO accounts.email_change_requests (user_id, expires_at) "
           "VALUES (42, :expires_at)")
    with engine.begin() as conn:
        expired_31_days = insert(conn, add, expires_at=NOW - 31 * DAY)
        # 2026-05-17T12:00:00+00:00, the cutoff itself: kept by <, prunable by <=.
        at_cutoff = insert(conn, add, expires_at=NOW - 30 * DAY)
        insert(conn, add, expires_at=NOW - 30 * DAY + MICROSECOND)  # just newer: kept by both
        insert(conn, add, expires_at=NOW - 29 * DAY)  # expired, but not 30 days ago
        insert(conn, add, expires_at=NOW + 5 * DAY)  # not expired yet

        assert NOW - 30 * DAY == dt.datetime(2026, 5, 17, 12, 0, tzinfo=dt.timezone.utc)
        assert prunable_keys("email_change_requests", conn, now=NOW, tree=tree) == (
            [expired_31_days, at_cutoff] if inclusive else [expired_31_days])
