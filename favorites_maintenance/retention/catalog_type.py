"""A column type named as PostgreSQL's catalog names it, for statements whose columns take a
table's own types (an archive's columns, a hold compared in its key's type)."""

import sqlalchemy as sa


class CatalogType(sa.types.UserDefinedType):
    """A column type as the catalog's ``format_type`` names it, rendered as such in DDL and
    casts: the archive's columns take the table's types exactly (arrays, ``numeric(p,s)``,
    domains, enums), whatever SQLAlchemy knows of them. The text is the server's, never a
    policy's."""

    cache_ok = True

    def __init__(self, spec: str):
        self.spec = spec

    def get_col_spec(self, **kw) -> str:
        return self.spec
