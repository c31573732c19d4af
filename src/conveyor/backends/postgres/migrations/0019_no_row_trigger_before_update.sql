-- No row trigger runs BEFORE an update of `tasks`. A BEFORE UPDATE row
-- trigger, whatever its WHEN condition says, makes PostgreSQL lock each row
-- before the update writes it, to hand the trigger the row as it stands: an
-- update that had not locked its rows (a finish) pays a second write of
-- each row header and a WAL record of the lock, on every task. Measured on
-- a table of the same shape: 37% more time and 24% more WAL for an update
-- of 100,000 rows whose trigger never fired. The two triggers that ran
-- BEFORE an update now run AFTER it, when the statement has written its
-- rows; an AFTER trigger's WHEN is checked against rows already in hand.
--
-- tasks_unique_scope_left: a task that leaves the scope of its unique key
-- gives the key up. It cleared the key in the row the update wrote; it now
-- clears it in an update of its own, in the same transaction, so the next
-- enqueue of the key goes through from the same commit as before. Until the
-- statement ends, the row that left its scope still holds its key: no
-- statement of conveyor both moves a keyed task out of its scope and
-- stores another task of the key (replace_pending clears the key itself).
-- A unique task that leaves its scope writes its row twice; others, once.
--
-- tasks_concurrency_key_pending: a task of a concurrency key made pending
-- sets the key's running limit when none of the key's other tasks is
-- pending (see 0015). It still runs BEFORE an insert (an insert locks no
-- row for it), so that of several tasks of a key stored by one statement,
-- the first sets the limit. On an update its function now runs AFTER
-- (tasks_concurrency_key_made_pending), and sees every row its statement
-- made pending: those are not counted as the key's other pending tasks
-- (their row version was written by this very command of this
-- transaction), so when one statement makes several tasks of a key with
-- different limits pending, one of them sets the limit, which one following
-- the order the statement wrote them in (guarantees.md, Limits, as before).

drop trigger tasks_unique_scope_left on {schema}.tasks;

create or replace function {schema}.unique_scope_left() returns trigger
language plpgsql as $$
begin
    update {schema}.tasks set idempotency_key = null where id = new.id;
    return null;
end
$$;

create trigger tasks_unique_scope_left
    after update of state on {schema}.tasks
    for each row
    when (new.unique_scope is not null and new.idempotency_key is not null
          and (new.state in ('succeeded', 'failed', 'cancelled')
               or (new.unique_scope = 'pending' and new.state <> 'pending')))
    execute function {schema}.unique_scope_left();

-- One function serves both triggers of a key made pending: BEFORE an insert
-- (the row is not written yet) and AFTER an update (the row and every row
-- of its statement are).
create or replace function {schema}.concurrency_key_pending() returns trigger
language plpgsql as $$
declare
    running_limit integer := coalesce(new.concurrency_limit, 1000000);
    found_limit integer;
    own_xmin xid;
    own_cmin cid;
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
    elsif found_limit <> running_limit then
        if tg_when = 'AFTER' then
            -- The command that made this task pending wrote its row version:
            -- rows written by the same command of this transaction are this
            -- statement's, not the key's other pending tasks.
            select t.xmin, t.cmin into own_xmin, own_cmin
            from {schema}.tasks t where t.id = new.id;
        end if;
        if not exists (select 1 from {schema}.tasks t
                       where t.concurrency_key = new.concurrency_key
                         and t.state = 'pending' and t.id <> new.id
                         and (own_xmin is null
                              or not (t.xmin = own_xmin and t.cmin = own_cmin))) then
            perform 1 from {schema}.concurrency where key = new.concurrency_key
            for no key update skip locked;
            if found then
                update {schema}.concurrency set max_running = running_limit
                where key = new.concurrency_key;
            end if;
        end if;
    end if;
    return new;  -- (an AFTER trigger's is ignored)
end
$$;

drop trigger tasks_concurrency_key_pending on {schema}.tasks;
create trigger tasks_concurrency_key_pending
    before insert on {schema}.tasks
    for each row
    when (new.concurrency_key is not null and new.state = 'pending')
    execute function {schema}.concurrency_key_pending();

create trigger tasks_concurrency_key_made_pending
    after update of state on {schema}.tasks
    for each row
    when (new.concurrency_key is not null and new.state = 'pending')
    execute function {schema}.concurrency_key_pending();
