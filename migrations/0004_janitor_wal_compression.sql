-- 0004: the retention-janitor may compress the page images its deletes write.
--
-- Deleting an expired payload is usually the first change to its heap page
-- since the last checkpoint, so PostgreSQL logs the whole page: about 1,150
-- bytes of WAL per deleted envelope-sized row, which concurrent ingest commits
-- flush along with their own (docs/retention-janitor.md). wal_compression
-- halves that, but only a superuser may set it; PostgreSQL 15 lets a superuser
-- grant SET on it to one role, and the janitor sets it for its own sessions
-- only. Like the roles, the grant is cluster-wide, and many databases may
-- migrate at once. Where the migrator may not grant it (not a superuser, or a
-- server older than 15) it only says so: the janitor then runs at the server's
-- setting and its summary line shows which, and docs/operations.md gives the
-- grant to run by hand.
DO $$
DECLARE
    granted boolean;
BEGIN
    IF current_setting('server_version_num')::int < 150000 THEN
        RAISE NOTICE 'wal_compression: SET on it can be granted from PostgreSQL 15 on; the janitor runs at the server''s setting';
        RETURN;
    END IF;
    -- Dynamic SQL: neither statement exists before PostgreSQL 15.
    EXECUTE $q$SELECT has_parameter_privilege('envelopeworker_janitor', 'wal_compression', 'SET')$q$ INTO granted;
    IF granted THEN
        RETURN; -- re-granting would update the shared row other migrators may be updating too
    END IF;
    BEGIN
        EXECUTE 'GRANT SET ON PARAMETER wal_compression TO envelopeworker_janitor';
    EXCEPTION
        WHEN insufficient_privilege THEN
            NULL; -- reported below
        WHEN unique_violation OR internal_error THEN
            -- The migrator of another database granted it at the same moment: the first grant
            -- ever inserts the shared row (unique_violation), a later one updates it ("tuple
            -- concurrently updated"). Either way the other one committed; the check below sees it.
            NULL;
    END;
    EXECUTE $q$SELECT has_parameter_privilege('envelopeworker_janitor', 'wal_compression', 'SET')$q$ INTO granted;
    IF NOT granted THEN
        -- Not a superuser, or SET held without grant option (GRANT then only warns).
        -- envctl migrate checks the grant afterwards and says what to run.
        RAISE NOTICE 'wal_compression: % may not grant SET on it; the janitor runs at the server''s setting (docs/operations.md)', current_user;
    END IF;
END
$$;
