-- Row-level security policies for the cleanup's role, for a {{table}} on which row-level
-- security is enabled. Without them the role sees, locks and deletes nothing, and the job fails
-- with "the purge could lock none of them" rather than reporting a success.
--
-- This file is a template: print it for a policy, and run it once per database as the owner of
-- the table, after least_privilege.sql:
--     favorites-maintenance grants --policy NAME --role favorites_cleanup --row-level-security \
--         | psql -f - "$OWNER_URL"
-- favorites_maintenance.retention.least_privilege.apply_row_level_security() runs the same text.
--
-- Each policy admits the rows of the guard only ({{guard_text}}), whatever the job asks for:
--   SELECT     the batches' candidates, the backlog and the checks;
--   UPDATE     PostgreSQL applies the table's UPDATE policies to SELECT ... FOR UPDATE, so the
--              job cannot lock (and so cannot delete) a row without one. WITH CHECK (false):
--              the role can lock those rows but never write one;
--   DELETE     the delete itself.

CREATE POLICY {{select_policy}} ON {{table_sql}}
    FOR SELECT TO :"role" USING ({{guard_sql}});
CREATE POLICY {{lock_policy}} ON {{table_sql}}
    FOR UPDATE TO :"role" USING ({{guard_sql}}) WITH CHECK (false);
CREATE POLICY {{delete_policy}} ON {{table_sql}}
    FOR DELETE TO :"role" USING ({{guard_sql}});
