-- Concurrency keys: at most max_running attempts of the tasks that share a
-- key run at once, across every worker; enqueues never fail for it.
--
-- A keyed pending task leaves the claim index for an index of its key, so
-- that a claim of plain tasks never walks the tasks queued behind a full
-- key. Keyed tasks are claimed in a transaction of their own: it first locks
-- the rows of `concurrency` (one per key with pending tasks) it will take
-- from, skipping locked ones, then, in a statement whose snapshot is taken
-- after those locks, counts each key's running tasks (a small index) and
-- takes at most the room left. Two claims never fill one key twice: the
-- second either skips the locked row, or locks it after the first
-- committed and sees its tasks running.
--
-- Whoever makes a keyed task pending (an enqueue, a retry, a release, a
-- next step, a message) makes sure its key's row exists and holds it KEY
-- SHARE until it commits (the trigger below): a claim deletes a key row
-- with no pending task left only while it holds the row locked FOR UPDATE,
-- which that lock excludes, so no pending task is ever left without its
-- row. KEY SHARE locks do not conflict with each other: writers of many
-- keys never deadlock. Rebuilding the claim index reads every pending task.

alter table {schema}.tasks
    add column concurrency_key text,
    add column concurrency_limit integer check (concurrency_limit between 1 and 1000000);

drop index {schema}.tasks_pending_claim;
create index tasks_pending_claim on {schema}.tasks (queue, priority desc, run_at, id)
    where state = 'pending' and concurrency_key is null;
create index tasks_pending_keyed on {schema}.tasks (concurrency_key, priority desc, run_at, id)
    where state = 'pending' and concurrency_key is not null;
create index tasks_running_keyed on {schema}.tasks (concurrency_key)
    where state = 'in_progress' and concurrency_key is not null;

create table {schema}.concurrency (
    key          text primary key,
    max_running  integer not null check (max_running >= 1),
    claimed_at   timestamptz
);

create function {schema}.concurrency_key_pending() returns trigger
language plpgsql as $$
begin
    perform 1 from {schema}.concurrency where key = new.concurrency_key for key share;
    if not found then
        insert into {schema}.concurrency (key, max_running)
        values (new.concurrency_key, coalesce(new.concurrency_limit, 1))
        on conflict (key) do nothing;
        perform 1 from {schema}.concurrency where key = new.concurrency_key for key share;
    end if;
    return null;
end
$$;

create trigger tasks_concurrency_key_pending
    after insert or update of state on {schema}.tasks
    for each row
    when (new.concurrency_key is not null and new.state = 'pending')
    execute function {schema}.concurrency_key_pending();
