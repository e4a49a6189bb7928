-- Row-level security policies for the cleanup's role, for a favorites.favorites on which row-level
-- security is enabled. Without them the role sees, locks and deletes nothing, and the job fails
-- with "the purge could lock none of them" rather than reporting a success.
--
-- Run once per database, as the owner of the table, after least_privilege.sql, e.g.
--     psql -v role=favorites_cleanup -f row_level_security.sql "$OWNER_URL"
-- favorites_maintenance.retention.least_privilege.apply_row_level_security() runs the same text.
--
-- Each policy admits guest rows only (user_id IS NULL), whatever the job asks for:
--   SELECT     the batches' candidates, the backlog and the checks;
--   UPDATE     PostgreSQL applies the table's UPDATE policies to SELECT ... FOR UPDATE, so the
--              job cannot lock (and so cannot delete) a row without one. WITH CHECK (false):
--              the role can lock guest rows but never write one;
--   DELETE     the delete itself.

CREATE POLICY favorites_cleanup_select ON favorites.favorites
    FOR SELECT TO :"role" USING (user_id IS NULL);
CREATE POLICY favorites_cleanup_lock ON favorites.favorites
    FOR UPDATE TO :"role" USING (user_id IS NULL) WITH CHECK (false);
CREATE POLICY favorites_cleanup_delete ON favorites.favorites
    FOR DELETE TO :"role" USING (user_id IS NULL);
