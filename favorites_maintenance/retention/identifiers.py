"""Names a policy writes for SQL objects: lower-case identifiers and ``schema.table``, checked
before any of them reaches a statement (as SQLAlchemy objects, never formatted in).

This module imports no Dagster, and nothing of the retention core but its errors.
"""

from __future__ import annotations

import re

from favorites_maintenance.retention.errors import InvalidArgumentError

#: A lower-case SQL identifier, as a policy's YAML may name a schema, table or column. Anything
#: else (quotes, dots, spaces, upper case) is refused rather than quoted into a surprise.
IDENTIFIER = re.compile(r"[a-z_][a-z0-9_$]{0,62}")


class RuleError(InvalidArgumentError):
    """A retention rule is malformed (an identifier that is not one, a column named twice)."""


def split_table_name(table: str, what: str = "table") -> tuple[str, str]:
    """``(schema, name)`` of ``table`` written ``schema.table``, both lower-case SQL
    identifiers; ``what`` is the field an error names.

    Raises:
        RuleError: not ``schema.table``, or a part is not a lower-case SQL identifier.
    """
    schema, dot, name = table.partition(".") if isinstance(table, str) else ("", "", "")
    if not dot or not schema or not name or "." in name:
        raise RuleError(f"{what} {table!r} must be written schema.table")
    for part, value in (("schema", schema), (what, name)):
        if not IDENTIFIER.fullmatch(value):
            raise RuleError(f"{part} {value!r} is not a lower-case SQL identifier "
                            "(letters, digits, _; at most 63 characters)")
    return schema, name
