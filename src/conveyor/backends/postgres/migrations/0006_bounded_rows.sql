-- Rows a claim can always compute with, and cancels that reach running
-- children's workers at once.
--
-- A claim adds one to the attempt and spent counters and a lease to the
-- clock; a worker arms a timer with the timeout and decodes every time.
-- A row written around conveyor with a counter at the integer limit, or a
-- lease or timeout that is NaN, infinite or absurdly long, made every claim
-- that picked it fail, and the queue behind it stood still. The table now
-- refuses such values, with the same bounds the API checks (durations up
-- to 100 years, run times a datetime can hold). Existing rows are brought
-- within them first: a lease or timeout out of range is dropped (the
-- worker's lease applies; no timeout), a run time is clamped, a negative
-- counter becomes 0 and one past the limit stands at the limit, where the
-- claim sets it aside (see `quarantine`: the task ends failed, saying why).
-- This scans the tasks table once, under its lock: on a large table, run
-- `conveyor migrate` at a quiet moment.

update {schema}.tasks set lease_seconds = null
where lease_seconds is not null
  and not (lease_seconds >= 0.5 and lease_seconds <= 3155760000);

update {schema}.tasks set timeout_seconds = null
where timeout_seconds is not null
  and not (timeout_seconds > 0 and timeout_seconds <= 3155760000);

update {schema}.tasks
set run_at = least(greatest(run_at, '0001-01-02 00:00:00+00'), '9999-12-30 00:00:00+00')
where not (run_at between '0001-01-02 00:00:00+00' and '9999-12-30 00:00:00+00');

update {schema}.tasks
set attempt = least(greatest(attempt, 0), 2147483646),
    spent = least(greatest(spent, 0), 2147483646)
where attempt not between 0 and 2147483646 or spent not between 0 and 2147483646;

alter table {schema}.tasks
    add constraint tasks_counters_in_range
        check (attempt between 0 and 2147483646 and spent between 0 and 2147483646),
    add constraint tasks_lease_in_range
        check (lease_seconds is null or (lease_seconds >= 0.5 and lease_seconds <= 3155760000)),
    add constraint tasks_timeout_in_range
        check (timeout_seconds is null or (timeout_seconds > 0 and timeout_seconds <= 3155760000)),
    add constraint tasks_run_at_in_range
        check (run_at between '0001-01-02 00:00:00+00' and '9999-12-30 00:00:00+00');

-- The tasks whose counters stand at the limit: claims pass them by, and
-- `quarantine` finds them here (the index is empty unless a row was
-- written around conveyor).
create index tasks_unclaimable on {schema}.tasks (id)
    where state in ('pending', 'in_progress')
      and (attempt > 2147483645 or spent > 2147483645);

-- A task reached a terminal state (see migration 0003). Two changes: the
-- parent row is locked FOR NO KEY UPDATE, which waits for a poll ending
-- under way as before but not for a send storing a message (its foreign
-- key's KEY SHARE lock); and a cancelled coroutine's running children,
-- flagged for cancel, are named on the cancel channel, so their workers
-- stop them at once instead of at their next heartbeat.
create or replace function {schema}.task_ended() returns trigger
language plpgsql as $$
declare
    parent_state text;
    woken_queue text;
    flagged bigint;
begin
    if new.parent_id is not null then
        select state into parent_state from {schema}.tasks
        where id = new.parent_id for no key update;
        if parent_state in ('pending', 'in_progress', 'waiting') then
            insert into {schema}.messages (task_id, sender_id, kind, body)
            values (new.parent_id, new.id, 'end',
                    jsonb_build_object('child', new.id, 'name', new.name,
                                       'state', new.state, 'result', new.result));
            update {schema}.tasks
            set state = 'pending', run_at = least(run_at, statement_timestamp())
            where id = new.parent_id
              and (state = 'waiting' or (state = 'pending' and run_at > statement_timestamp()))
            returning queue into woken_queue;
            if woken_queue is not null then
                perform pg_notify('conveyor_' || tg_table_schema, woken_queue);
            end if;
        end if;
    end if;
    if new.state = 'cancelled' and new.inbox then
        for flagged in
            update {schema}.tasks
            set state = case when state = 'in_progress' then state else 'cancelled' end,
                cancel_requested = (state = 'in_progress'),
                finished_at = case when state = 'in_progress' then null
                                   else statement_timestamp() end
            where parent_id = new.id and state in ('pending', 'waiting', 'in_progress')
            returning case when cancel_requested then id end
        loop
            if flagged is not null then
                perform pg_notify('conveyor_' || tg_table_schema || '_cancel', flagged::text);
            end if;
        end loop;
    end if;
    return null;
end
$$;
