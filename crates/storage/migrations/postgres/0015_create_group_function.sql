-- Creations of plain threads and of runs, grouped from concurrent requests (`pg_creator`) and
-- applied by one function call: one round trip and one commit for the group.
--
-- Each creation was a single-statement transaction of its own, and a waited run needs two
-- (its thread, then the run): PostgreSQL spent about 40 % of the creating backends' CPU on
-- those transactions beyond their statements (bench/RESULTS.md). Called alone, outside
-- `BEGIN`, this function is one statement in an implicit transaction that commits when it
-- returns; a run's creation decided in `create_run`'s own transaction calls it inside that
-- transaction, with no thread and one run, so the run's statement exists only here.
--
-- Threads (`t_`) go in first, all at once; one whose id is taken is left out (`threads_made`
-- lists those that went in). Then each run (`r_`) by a statement of its own, as
-- `runs::postgres::insert_run` describes: it locks its thread and inserts only if the thread
-- is the caller's and, unless `r_decided`, nobody changed it since the statement's snapshot,
-- it has no active run and the run's assistant is as read. The lock skips a thread another
-- transaction holds, so a group never waits for one: that run is left out and decided alone
-- in a transaction of its own, as are runs whose conditions failed. Each statement sees the
-- ones before it (the function is volatile): a second run for a thread of the group finds the
-- first active. Answers the runs made (their rows, their places in `r_`, their threads' last
-- seqs and, for runs claimed as they are made, whether their thread has no checkpoint yet);
-- the arrays are NULL when the group made no run.
--
-- A failed statement (a run id already taken) raises and leaves nothing; the caller then
-- makes the group's creations one call each, which tells which one failed.
CREATE FUNCTION spindle_create_group(
    t_id text[], t_user text[], t_metadata text[], t_now timestamptz[],
    r_run uuid[], r_thread text[], r_assistant text[], r_user text[], r_status text[],
    r_kwargs text[], r_metadata text[], r_strategy text[], r_attempt int4[],
    r_run_after timestamptz[], r_now timestamptz[], r_lease_owner text[],
    r_lease_expires timestamptz[], r_started timestamptz[], r_start_data text[],
    r_decided boolean[], r_assistant_version int8[], r_assistant_updated timestamptz[],
    OUT threads_made text[], OUT runs_made runs[], OUT run_places int4[],
    OUT last_seqs int8[], OUT threads_new boolean[]
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    run_made runs[];
    run_seq int8;
    is_new boolean;
BEGIN
    IF cardinality(t_id) > 0 THEN
        WITH made AS (
            INSERT INTO threads (thread_id, user_id, metadata, created_at, updated_at,
                                 state_updated_at)
            SELECT id, u, m::jsonb, n, n, n
            FROM UNNEST(t_id, t_user, t_metadata, t_now) AS x(id, u, m, n)
            ON CONFLICT (thread_id) DO NOTHING
            RETURNING thread_id
        )
        SELECT array_agg(thread_id) INTO threads_made FROM made;
    END IF;
    FOR i IN 1 .. coalesce(cardinality(r_run), 0) LOOP
        -- A run on a thread that is not busy names its graph and assistant in the thread's
        -- metadata, over what was there, as the reference does (UIs list a graph's threads by
        -- them); a run queued behind another leaves them to the one running. A run claimed as
        -- it is made logs its first event after the thread's last. The locked row's `xmin` is
        -- its newest version's; the subquery's is the one the statement's snapshot saw. The
        -- run's kwargs carry the thread's metadata over what its graph inherits
        -- (`inherited_metadata`; `inherit_metadata` on SQLite).
        WITH t AS (
            SELECT xmin AS version, metadata FROM threads
            WHERE thread_id = r_thread[i] AND (user_id = r_user[i] OR user_id IS NULL)
            FOR NO KEY UPDATE SKIP LOCKED
        ), ok AS (
            SELECT t.metadata FROM t WHERE r_decided[i] OR (
                t.version = (SELECT xmin FROM threads WHERE thread_id = r_thread[i])
                AND NOT EXISTS (SELECT 1 FROM runs WHERE thread_id = r_thread[i]
                                AND status IN ('pending', 'running'))
                AND (r_assistant_version[i] IS NULL OR EXISTS (SELECT 1 FROM assistants
                     WHERE assistant_id = r_assistant[i] AND version = r_assistant_version[i]
                       AND updated_at = r_assistant_updated[i])))
        ), r AS (
            INSERT INTO runs AS nr (run_id, thread_id, assistant_id, user_id, status, kwargs,
                metadata, multitask_strategy, attempt, run_after, created_at, updated_at,
                lease_owner, lease_expires_at, started_at)
            SELECT r_run[i], r_thread[i], r_assistant[i], r_user[i], r_status[i],
                CASE WHEN ok.metadata = '{}'::jsonb THEN r_kwargs[i]::jsonb
                ELSE jsonb_set(r_kwargs[i]::jsonb, '{inherited_metadata}',
                     COALESCE(r_kwargs[i]::jsonb -> 'inherited_metadata', '{}'::jsonb)
                     || ok.metadata) END,
                r_metadata[i]::jsonb, r_strategy[i], r_attempt[i], r_run_after[i], r_now[i],
                r_now[i], r_lease_owner[i], r_lease_expires[i], r_started[i]
            FROM ok
            RETURNING nr
        ), u AS (
            UPDATE threads SET metadata = COALESCE(CASE WHEN status <> 'busy' THEN (
                    SELECT threads.metadata || jsonb_build_object('graph_id', a.graph_id,
                                                                  'assistant_id', a.assistant_id)
                    FROM assistants a WHERE a.assistant_id = r_assistant[i]) END, metadata),
                status = 'busy', updated_at = r_now[i],
                event_seq = event_seq + CASE WHEN r_status[i] = 'running' THEN 1 ELSE 0 END
            WHERE thread_id = r_thread[i] AND EXISTS (SELECT 1 FROM r) RETURNING event_seq
        ), e AS (
            INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at)
            SELECT r_thread[i], u.event_seq, r_run[i], 'metadata', r_start_data[i]::json,
                r_now[i]
            FROM u WHERE r_status[i] = 'running'
        )
        SELECT ARRAY[r.nr], u.event_seq, r_status[i] = 'running' AND NOT EXISTS (
                SELECT 1 FROM checkpoints WHERE thread_id = r_thread[i])
        INTO run_made, run_seq, is_new
        FROM r, u;
        IF FOUND THEN
            runs_made := runs_made || run_made;
            run_places := run_places || i;
            last_seqs := last_seqs || run_seq;
            threads_new := threads_new || is_new;
        END IF;
    END LOOP;
END
$$;
