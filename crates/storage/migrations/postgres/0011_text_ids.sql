-- Threads and assistants may be named by their clients (1 to 128 characters of
-- [A-Za-z0-9._:-], checked by the server), so their ids are text, as the checkpoint tables'
-- thread ids already are. Generated ids stay UUIDs, kept in their canonical text form;
-- COLLATE "C" compares byte by byte, so they keep the order they had as UUIDs.
-- A referenced column cannot change type under its foreign keys: they go and come back.
ALTER TABLE assistant_versions DROP CONSTRAINT assistant_versions_assistant_id_fkey;
ALTER TABLE crons DROP CONSTRAINT crons_assistant_id_fkey;
ALTER TABLE crons DROP CONSTRAINT crons_thread_id_fkey;
ALTER TABLE runs DROP CONSTRAINT runs_thread_id_fkey;
ALTER TABLE run_events DROP CONSTRAINT run_events_thread_id_fkey;

ALTER TABLE assistants ALTER COLUMN assistant_id TYPE TEXT COLLATE "C" USING assistant_id::text;
ALTER TABLE assistant_versions
    ALTER COLUMN assistant_id TYPE TEXT COLLATE "C" USING assistant_id::text;
ALTER TABLE threads ALTER COLUMN thread_id TYPE TEXT COLLATE "C" USING thread_id::text;
ALTER TABLE runs
    ALTER COLUMN thread_id TYPE TEXT COLLATE "C" USING thread_id::text,
    ALTER COLUMN assistant_id TYPE TEXT COLLATE "C" USING assistant_id::text;
ALTER TABLE run_events ALTER COLUMN thread_id TYPE TEXT COLLATE "C" USING thread_id::text;
ALTER TABLE crons
    ALTER COLUMN assistant_id TYPE TEXT COLLATE "C" USING assistant_id::text,
    ALTER COLUMN thread_id TYPE TEXT COLLATE "C" USING thread_id::text;

ALTER TABLE assistant_versions ADD CONSTRAINT assistant_versions_assistant_id_fkey
    FOREIGN KEY (assistant_id) REFERENCES assistants (assistant_id) ON DELETE CASCADE;
ALTER TABLE crons ADD CONSTRAINT crons_assistant_id_fkey
    FOREIGN KEY (assistant_id) REFERENCES assistants (assistant_id) ON DELETE CASCADE;
ALTER TABLE crons ADD CONSTRAINT crons_thread_id_fkey
    FOREIGN KEY (thread_id) REFERENCES threads (thread_id) ON DELETE CASCADE;
ALTER TABLE runs ADD CONSTRAINT runs_thread_id_fkey
    FOREIGN KEY (thread_id) REFERENCES threads (thread_id) ON DELETE CASCADE;
ALTER TABLE run_events ADD CONSTRAINT run_events_thread_id_fkey
    FOREIGN KEY (thread_id) REFERENCES threads (thread_id) ON DELETE CASCADE;
