-- Concurrency keys (see the PostgreSQL migration of the same purpose): a
-- keyed pending task leaves the claim index for its key's index; a row per
-- key with pending tasks in conveyor_concurrency, made by the trigger below
-- whenever a keyed task becomes pending. SQLite's one writer makes each
-- claim see every running task: no lock is needed to stay within a limit.

alter table conveyor_tasks add column concurrency_key text;
alter table conveyor_tasks add column concurrency_limit integer;

drop index conveyor_tasks_pending_claim;
create index conveyor_tasks_pending_claim on conveyor_tasks (queue, priority desc, run_at, id)
    where state = 'pending' and concurrency_key is null;
create index conveyor_tasks_pending_keyed
    on conveyor_tasks (concurrency_key, priority desc, run_at, id)
    where state = 'pending' and concurrency_key is not null;
create index conveyor_tasks_running_keyed on conveyor_tasks (concurrency_key)
    where state = 'in_progress' and concurrency_key is not null;

create table conveyor_concurrency (
    key          text primary key,
    max_running  integer not null,
    claimed_at   real
) without rowid;

create trigger conveyor_tasks_concurrency_key_inserted
after insert on conveyor_tasks
when new.concurrency_key is not null and new.state = 'pending'
begin
    insert or ignore into conveyor_concurrency (key, max_running)
    values (new.concurrency_key, coalesce(new.concurrency_limit, 1));
end;

create trigger conveyor_tasks_concurrency_key_pending
after update of state on conveyor_tasks
when new.concurrency_key is not null and new.state = 'pending'
begin
    insert or ignore into conveyor_concurrency (key, max_running)
    values (new.concurrency_key, coalesce(new.concurrency_limit, 1));
end;
