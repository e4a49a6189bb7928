"""A second retention policy beside guest favorites, declared in YAML alone, for the tests of
policies as data: ``guest_carts`` on ``carts.guest_carts``, a table of another shape (a uuid
key, a text guard, other column names). The defs folder the tests write it into is the
``sandbox`` fixture of ``pipeline/conftest.py``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml

UTC = dt.timezone.utc
#: End of PARTITION: the anchor of both policies' cutoffs.
ANCHOR = dt.datetime(2026, 6, 16, tzinfo=UTC)

CARTS = {
    "name": "guest_carts",
    "table": "carts.guest_carts",
    "key_column": "cart_uuid",
    "age_column": "touched_at",
    "null_columns": ["customer_ref"],
    "retention_days": 30,
    "batch_size": 100,
    # Fixed batches, so the batch count is known.
    "target_batch_duration": "PT0S",
    "cron": "15 4 * * *",
    "stale_after": "PT24H",
    "partitions_start": "2026-01-01",
}


def write_policy(defs_folder: Path, attributes: dict, folder_name: str = "guest_carts") -> None:
    """Write a policy's ``defs.yaml`` with ``attributes`` into ``defs_folder/folder_name``."""
    folder = defs_folder / folder_name
    folder.mkdir()
    (folder / "defs.yaml").write_text(yaml.safe_dump(
        {"type": "favorites_maintenance.RetentionPolicy", "attributes": attributes}))
