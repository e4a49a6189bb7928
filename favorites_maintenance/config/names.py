"""The names a user sees of a policy's rows: its freshness check, the metadata keys that
count or date its rows, and the noun its messages use. One rule, stated here:

- the **row noun** is the policy's ``row_noun`` setting, ``row`` when unset;
- the freshness check is ``no_<noun>_older_than_retention_plus_one_day`` (the noun's spaces
  as ``_``) and its count ``overdue<Noun>s`` (the noun in CamelCase, an ``s`` for the plural);
- the keys that hold an instant of the age column carry its name in CamelCase:
  ``backlogOldest<Age>`` and ``oldestOverdue<Age>``.

The guest-favorites policy names ``guest row`` and its age column is ``updated_at``, so its
names are ``no_guest_row_older_than_retention_plus_one_day``, ``overdueGuestRows``,
``backlogOldestUpdatedAt`` and ``oldestOverdueUpdatedAt``; a policy that names no noun gets
``no_row_older_than_retention_plus_one_day`` and ``overdueRows``. Changing a policy's noun or
age column renames its check and keys: their history stays under the old names.

This module imports no Dagster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The noun of a policy that sets none.
DEFAULT_ROW_NOUN = "row"
#: A row noun: lower-case words of letters and digits, single spaces between them.
_NOUN = re.compile(r"[a-z][a-z0-9]*(?: [a-z][a-z0-9]*)*")
MAX_ROW_NOUN = 40
#: What every policy's key of its backlog's oldest age starts with.
BACKLOG_OLDEST_PREFIX = "backlogOldest"


def parse_row_noun(raw: str) -> str:
    """A row noun as a policy writes it (``guest row``): lower-case words of ``a-z`` and
    ``0-9``, a letter first, single spaces between them, at most :data:`MAX_ROW_NOUN`
    characters, so that the check name built from it is a valid Dagster name.

    Raises:
        ValueError: any other text, named.
    """
    noun = raw.strip()
    if not _NOUN.fullmatch(noun) or len(noun) > MAX_ROW_NOUN:
        raise ValueError(f"{raw!r} is not a row noun: lower-case words of a-z and 0-9, a "
                         f"letter first, single spaces between them, at most {MAX_ROW_NOUN} "
                         "characters (e.g. guest row)")
    return noun


def _camel(text: str) -> str:
    """``guest row`` -> ``GuestRow``, ``updated_at`` -> ``UpdatedAt``."""
    return "".join(part.capitalize() for part in re.split(r"[ _]+", text) if part)


@dataclass(frozen=True)
class PolicyNames:
    """The names of one policy's rows (see the module docstring).

    Attributes:
        row_noun: what messages call one row the rule admits (``guest row``, ``row``).
        age_column: the name of the policy's age column (``updated_at``).
    """

    row_noun: str
    age_column: str

    @property
    def rows(self) -> str:
        """The noun in the plural, for messages: ``guest rows``."""
        return f"{self.row_noun}s"

    @property
    def overdue_check(self) -> str:
        """The freshness check: ``no_guest_row_older_than_retention_plus_one_day``."""
        return f"no_{self.row_noun.replace(' ', '_')}_older_than_retention_plus_one_day"

    @property
    def overdue_key(self) -> str:
        """The freshness check's count of rows past its limit: ``overdueGuestRows``."""
        return f"overdue{_camel(self.row_noun)}s"

    @property
    def oldest_overdue_key(self) -> str:
        """The freshness check's age of the oldest of them: ``oldestOverdueUpdatedAt``."""
        return f"oldestOverdue{_camel(self.age_column)}"

    @property
    def backlog_oldest_key(self) -> str:
        """The run's age of the oldest row its rule still matches:
        ``backlogOldestUpdatedAt``."""
        return f"{BACKLOG_OLDEST_PREFIX}{_camel(self.age_column)}"
