-- A runs' writer's group (`pg_writer`) applied by one function call: one round trip.
--
-- A group was a `BEGIN`, a statement each for its events, checkpoints, pending writes' locks,
-- pending writes, ends' locks and ends, then a `COMMIT`: 8 round trips, each of which cost
-- the writer up to 0.9 ms beyond the statement's own execution on a slow 2-core machine, while
-- every run of the group waited (bench/RESULTS.md). Called alone, outside `BEGIN`, this
-- function is one statement in an implicit transaction that commits when it returns. Its
-- statements are the group's statements as they were, in the same order; each sees what the
-- ones before it did, since the function is volatile. It applies all of the group or raises, leaving
-- nothing: the writer then applies the group's writes one transaction each, which tells which
-- one failed, and ends a run that does not end plainly (not held by its worker, cancelled
-- with `rollback`, or after a checkpoint not stored) the long way.
--
-- Every input is a set of parallel arrays, as the statements took them before: events (`e_`,
-- with each thread's seq range `e_range_` and the distinct runs `e_runs`), checkpoints (`c_`)
-- and their blobs (`b_`, each naming its checkpoint by its place in `c_`), the checkpoints
-- whose pending writes are written (`k_`, locked), pending writes replaced (`x_`) and written
-- (`w_`), and runs' ends (`n_`). Answers the ended runs' rows and, in the same order, their end
-- events' seqs (each its thread's last); both NULL when the group ends no run. (Arrays, not a
-- set of rows: a set-returning PL/pgSQL function copies its rows once more.)
CREATE FUNCTION spindle_write_group(
    e_thread text[], e_seq int8[], e_run uuid[], e_name text[], e_data text[],
    e_created timestamptz[], e_range_thread text[], e_range_low int8[], e_range_high int8[],
    e_runs uuid[],
    c_thread text[], c_ns text[], c_id text[], c_parent text[], c_checkpoint text[],
    c_metadata text[], c_saved_by uuid[],
    b_of int4[], b_channel text[], b_version int8[], b_base int8[], b_value bytea[],
    k_thread text[], k_ns text[], k_id text[],
    x_thread text[], x_ns text[], x_id text[], x_task text[], x_channel text[],
    w_thread text[], w_ns text[], w_id text[], w_task text[], w_channel text[], w_value bytea[],
    n_thread text[], n_run uuid[], n_worker text[], n_after text[], n_status text[],
    n_error text[], n_values text[], n_thread_status text[], n_interrupts text[],
    n_end_data text[], p_now timestamptz, p_end_event text,
    OUT ended_runs runs[], OUT ended_seqs int8[]
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    moved_count int8;
    held_count int8;
    plain_count int8;
    any_busy boolean;
BEGIN
    IF cardinality(e_thread) > 0 THEN
        -- As `runs::postgres::insert_events`: the events go in, their threads' counters
        -- move past them, and their runs are locked as a foreign key would lock them, once
        -- per run and after the threads' rows.
        WITH e AS (
            INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at)
            SELECT t, s, r, ev, d::json, c
            FROM UNNEST(e_thread, e_seq, e_run, e_name, e_data, e_created) AS x(t, s, r, ev, d, c)
        ), moved AS (
            UPDATE threads t SET event_seq = u.high
            FROM UNNEST(e_range_thread, e_range_low, e_range_high) AS u(id, low, high)
            WHERE t.thread_id = ANY (e_range_thread) AND t.thread_id = u.id
              AND t.event_seq < u.low
            RETURNING 1
        ), held AS (
            SELECT 1 FROM runs WHERE run_id = ANY (e_runs)
                AND (SELECT count(*) FROM moved) >= 0 FOR KEY SHARE
        )
        SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM held)
        INTO moved_count, held_count;
        IF held_count <> cardinality(e_runs) THEN
            RAISE EXCEPTION 'events of % runs that are gone', cardinality(e_runs) - held_count;
        END IF;
        IF moved_count <> cardinality(e_range_thread) THEN
            RAISE EXCEPTION '% threads have logged events at or after those seqs',
                cardinality(e_range_thread) - moved_count;
        END IF;
    END IF;

    IF cardinality(c_thread) > 0 THEN
        -- As `checkpoints::postgres::insert_checkpoint`, for each checkpoint; blobs find their
        -- checkpoint by its place in the arrays (the writer plans without hash joins).
        WITH input AS (
            SELECT * FROM UNNEST(c_thread, c_ns, c_id, c_parent, c_checkpoint, c_metadata,
                                 c_saved_by)
            WITH ORDINALITY AS u(thread_id, ns, id, parent, cp, md, saved_by, n)
        ), live AS (
            SELECT run_id FROM runs WHERE run_id IN (SELECT saved_by FROM input) FOR KEY SHARE
        ), ok AS (
            SELECT * FROM input WHERE saved_by IS NULL OR saved_by IN (SELECT run_id FROM live)
        ), new_blobs AS (
            INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, base, value)
            SELECT c_thread[b.n], c_ns[b.n], b.ch, b.v, b.base, b.val
            FROM UNNEST(b_of, b_channel, b_version, b_base, b_value) AS b(n, ch, v, base, val)
            WHERE b.n = ANY (ARRAY(SELECT n FROM ok))
            ON CONFLICT DO NOTHING
        ), stale_writes AS (
            DELETE FROM checkpoint_writes w USING ok
            WHERE w.thread_id = ok.thread_id AND w.checkpoint_ns = ok.ns
              AND w.checkpoint_id = ok.id
              AND EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = ok.thread_id
                          AND c.checkpoint_ns = ok.ns AND c.checkpoint_id = ok.id)
        )
        INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                                 checkpoint, metadata)
        SELECT thread_id, ns, id, parent, cp::jsonb, md::jsonb FROM ok
        ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
            parent_checkpoint_id = EXCLUDED.parent_checkpoint_id,
            checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata;
        GET DIAGNOSTICS moved_count = ROW_COUNT;
        IF moved_count <> cardinality(c_thread) THEN
            RAISE EXCEPTION '% of % checkpoints were not saved: their runs were deleted',
                cardinality(c_thread) - moved_count, cardinality(c_thread);
        END IF;
    END IF;

    IF cardinality(k_thread) > 0 THEN
        -- As `checkpoints::postgres::insert_writes`: the checkpoints' rows serialise
        -- concurrent savers of one step (in a fixed order, so two groups cannot wait for each
        -- other); each new write numbers itself from its checkpoint's last index.
        PERFORM 1 FROM checkpoints
        WHERE (thread_id, checkpoint_ns, checkpoint_id) IN (
            SELECT * FROM UNNEST(k_thread, k_ns, k_id))
        ORDER BY thread_id, checkpoint_ns, checkpoint_id FOR UPDATE;
        WITH replaced AS (
            DELETE FROM checkpoint_writes w
            USING UNNEST(x_thread, x_ns, x_id, x_task, x_channel) AS r(t, ns, c, task, ch)
            WHERE w.thread_id = r.t AND w.checkpoint_ns = r.ns AND w.checkpoint_id = r.c
              AND w.task_id = r.task AND w.channel = r.ch
        ), input AS (
            SELECT * FROM UNNEST(w_thread, w_ns, w_id, w_task, w_channel, w_value)
            WITH ORDINALITY AS u(t, ns, c, task, ch, val, n)
        )
        INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, idx, task_id,
                                       channel, value)
        SELECT i.t, i.ns, i.c,
               COALESCE((SELECT MAX(w.idx) FROM checkpoint_writes w
                         WHERE w.thread_id = i.t AND w.checkpoint_ns = i.ns
                           AND w.checkpoint_id = i.c), -1)
               + ROW_NUMBER() OVER (PARTITION BY i.t, i.ns, i.c ORDER BY i.n),
               i.task, i.ch, i.val
        FROM input i;
    END IF;

    IF cardinality(n_thread) = 0 THEN
        RETURN;
    END IF;
    -- The ends' runs and threads, locked in thread order as every group locks them; each must
    -- be running, held by its worker, not cancelled with `rollback`, and after a stored
    -- checkpoint (else the writer ends it alone, `runs::postgres::end_run`).
    SELECT count(*), count(*) FILTER (WHERE plain) INTO held_count, plain_count FROM (
        SELECT r.cancel IS DISTINCT FROM 'rollback' AND (i.after IS NULL OR EXISTS (
                   SELECT 1 FROM checkpoints c WHERE c.thread_id = i.thread_id
                   AND c.checkpoint_ns = '' AND c.checkpoint_id = i.after)) AS plain
        FROM UNNEST(n_thread, n_run, n_worker, n_after) AS i(thread_id, run_id, worker, after)
        JOIN runs r ON r.run_id = i.run_id AND r.thread_id = i.thread_id
            AND r.status = 'running' AND r.lease_owner = i.worker
        JOIN threads t ON t.thread_id = r.thread_id
        ORDER BY t.thread_id FOR NO KEY UPDATE OF t, r
    ) AS held;
    IF held_count <> cardinality(n_thread) OR plain_count <> held_count THEN
        RAISE EXCEPTION 'an end of the group is not plain' USING ERRCODE = 'SP001';
    END IF;
    -- As `runs::postgres::end_run`, over arrays: a thread stays busy while another of its runs
    -- is active; its error is the run's only when it ends `error`.
    WITH i AS (
        SELECT * FROM UNNEST(n_thread, n_run, n_status, n_error, n_values, n_thread_status,
                             n_interrupts, n_end_data)
            AS i(thread_id, run_id, status, error, vals, thread_status, interrupts, ended)
    ), ended AS (
        UPDATE runs r SET status = i.status, error = i.error::jsonb,
            lease_expires_at = NULL, updated_at = p_now, ended_at = p_now,
            output = i.vals::jsonb
        FROM i WHERE r.run_id = i.run_id
        RETURNING r AS run
    ), a AS (
        SELECT i.thread_id, EXISTS (SELECT 1 FROM runs o WHERE o.thread_id = i.thread_id
            AND o.run_id <> i.run_id AND o.status IN ('pending', 'running')) AS busy
        FROM i
    ), t AS (
        UPDATE threads SET event_seq = event_seq + 1,
            status = CASE WHEN a.busy THEN 'busy' ELSE i.thread_status END,
            state_values = i.vals::jsonb, interrupts = i.interrupts::jsonb,
            error = CASE WHEN NOT a.busy AND i.thread_status = 'error'
                         THEN i.error::jsonb END,
            state_updated_at = p_now, updated_at = p_now
        FROM i JOIN a ON a.thread_id = i.thread_id
        WHERE threads.thread_id = i.thread_id
        RETURNING threads.thread_id, threads.event_seq, i.run_id, i.ended, a.busy
    ), e AS (
        INSERT INTO run_events (thread_id, seq, run_id, event, data, created_at)
        SELECT t.thread_id, t.event_seq, t.run_id, p_end_event, t.ended::json, p_now FROM t
    )
    SELECT array_agg(ended.run), array_agg(t.event_seq), bool_or(t.busy)
    INTO ended_runs, ended_seqs, any_busy
    FROM ended JOIN t ON t.run_id = (ended.run).run_id;
    IF any_busy THEN
        -- A run queued behind one of these can start now (`pg_notify::RUNS`).
        PERFORM pg_notify('spindle_runs', '');
    END IF;
END
$$;
