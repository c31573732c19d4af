-- A key's running limit once none of its tasks is pending: the next task
-- made pending brings its own, as it would to a key whose row a claim had
-- dropped (a claim drops the row of a key left with no pending task, but
-- only a claim that reads the key, and which claims read it differs from
-- one store to another). So the limit a key holds never depends on whether
-- its row outlived its last pending task.
--
-- The trigger now runs BEFORE the row is written, so that it sees the rows
-- its statement wrote before this one and not those it writes after: of
-- several tasks of a key made pending by one statement, the first sets the
-- limit. A statement's task that is not stored after all (its unique key
-- taken) may still have set it: it has no task pending then, and the next
-- task made pending sets it again. The limit is changed only if the row is
-- not locked by another writer changing it (skipped, not waited for: two
-- enqueues changing two keys in opposite orders would deadlock), which
-- leaves the limit of whichever of them changed it.

create or replace function {schema}.concurrency_key_pending() returns trigger
language plpgsql as $$
declare
    running_limit integer := coalesce(new.concurrency_limit, 1000000);
    found_limit integer;
begin
    select max_running into found_limit
    from {schema}.concurrency where key = new.concurrency_key for key share;
    if not found then
        insert into {schema}.concurrency
            (key, max_running, rate_limit, rate_period, tokens, refilled_at)
        values (new.concurrency_key, running_limit,
                new.rate_limit, new.rate_period, new.rate_limit, statement_timestamp())
        on conflict (key) do nothing;
        perform 1 from {schema}.concurrency where key = new.concurrency_key for key share;
    elsif found_limit <> running_limit
          and not exists (select 1 from {schema}.tasks t
                          where t.concurrency_key = new.concurrency_key
                            and t.state = 'pending' and t.id <> new.id) then
        perform 1 from {schema}.concurrency where key = new.concurrency_key
        for no key update skip locked;
        if found then
            update {schema}.concurrency set max_running = running_limit
            where key = new.concurrency_key;
        end if;
    end if;
    return new;
end
$$;

drop trigger tasks_concurrency_key_pending on {schema}.tasks;
create trigger tasks_concurrency_key_pending
    before insert or update of state on {schema}.tasks
    for each row
    when (new.concurrency_key is not null and new.state = 'pending')
    execute function {schema}.concurrency_key_pending();
