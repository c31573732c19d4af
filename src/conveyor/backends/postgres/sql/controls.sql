-- Operators' controls of tasks: cancel, retry, run now, delete, and their
-- bulk forms over a selection.
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

-- name: cancel
-- Cancel a task: pending and waiting ones at once; a running one is flagged
-- and its worker is told on the cancel channel (the payload is the task id;
-- its heartbeat would find the flag too). Returns the state after.
with cancelled as (
    update {schema}.tasks
    set state = case when state = 'in_progress' then state else 'cancelled' end,
        cancel_requested = (state = 'in_progress'),
        finished_at = case when state = 'in_progress' then null
                           else coalesce(%(now)s::timestamptz, statement_timestamp()) end
    where id = %(id)s and state in ('pending', 'waiting', 'in_progress')
    returning id, state
),
notified as (
    select count(pg_notify({cancel_channel}, c.id::text)) as n
    from cancelled c where c.state = 'in_progress'
)
select c.state from cancelled c, notified;

-- name: cancel_requested
-- Which of these leases (ids and attempts, held by %(worker_id)s) have a
-- cancel requested: read when the cancel channel names one of them.
select t.id, t.attempt
from {schema}.tasks t
join unnest(%(ids)s::bigint[], %(attempts)s::int[]) as l(id, attempt)
  on l.id = t.id and l.attempt = t.attempt
where t.id = any(%(ids)s::bigint[])
  and t.worker_id = %(worker_id)s::text
  and t.lease_expires_at is not null
  and t.cancel_requested;

-- name: retry
-- Run a failed or cancelled task again now, with a fresh attempt budget.
-- Attempt numbers keep growing: the log keeps every earlier attempt.
update {schema}.tasks
set state = 'pending',
    spent = 0,
    run_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
    cancel_requested = false,
    result = null,
    finished_at = null
where id = %(id)s and state in ('failed', 'cancelled')
returning state;

-- name: run_now
-- A pending task (delayed, backing off, snoozed or asleep) becomes due now;
-- its queue's idle workers are told. Its state back, or no row.
with moved as (
    update {schema}.tasks
    set run_at = least(run_at, coalesce(%(now)s::timestamptz, statement_timestamp()))
    where id = %(id)s and state = 'pending'
    returning state, queue
)
select m.state, pg_notify({channel}, m.queue) from moved m;

-- name: part_awaited
-- Part of the deletes and prunes: whether an unfinished task depends on
-- task `t` (and reads its outcome when it runs). Only a task marked as
-- depended on looks at its edges; the edges are looked at through a scalar
-- subquery, one probe of their index per candidate (as a parent is in
-- prune).
(t.dependents and coalesce((select true from {schema}.dependencies e
                            join {schema}.tasks d on d.id = e.task_id
                            where e.depends_on = t.id
                              and d.state in ('pending', 'in_progress', 'waiting')
                            limit 1), false))

-- name: delete_task
-- Delete a task that is not in progress, with its attempts, messages, keys
-- and own edges (on delete cascade); an unfinished one only if no parent of
-- it is alive (the parent waits for its end); none that an unfinished task
-- depends on. Its id back, or no row.
with gone as (
    delete from {schema}.tasks t
    where t.id = %(id)s and t.state <> 'in_progress'
      and (t.state in ('succeeded', 'failed', 'cancelled')
           or not exists (select 1 from {schema}.tasks p
                          where p.id = t.parent_id
                            and p.state in ('pending', 'in_progress', 'waiting')))
      and not {part_awaited}
    returning t.id
),
-- The attempt log has no foreign key to its task (migration 0004).
attempts_gone as (
    delete from {schema}.attempts a using gone g where a.task_id = g.id
)
select id from gone;

-- name: delete_blocker
-- Why delete_task deleted nothing: the task's state, its parent's, and
-- whether an unfinished task depends on it.
select t.state, p.state, {part_awaited}
from {schema}.tasks t left join {schema}.tasks p on p.id = t.parent_id
where t.id = %(id)s;

-- name: part_selected
-- Part of the bulk actions: the tasks `t` of one selection (see
-- TaskSelection): in %(states)s, ids above %(after)s (among %(ids)s when
-- given), of the name, queue and creation window given (each optional).
-- Each action reads it in its own statement, under the row locks it takes:
-- a row changed since a caller listed it is judged as it is now.
t.state = any(%(states)s::text[]) and t.id > %(after)s::bigint
and (%(ids)s::bigint[] is null or t.id = any(%(ids)s::bigint[]))
and (%(name)s::text is null or t.name = %(name)s::text)
and (%(queue)s::text is null or t.queue = %(queue)s::text)
and (%(since)s::timestamptz is null or t.created_at >= %(since)s::timestamptz)
and (%(until)s::timestamptz is null or t.created_at < %(until)s::timestamptz)

-- name: part_batch
-- Part of retry_many and cancel_many: the ids of the next batch of the
-- selection (part_selected), up to %(limit)s, oldest first, each row locked
-- FOR NO KEY UPDATE; rows locked by others are passed by.
select t.id from {schema}.tasks t
where {part_selected}
order by t.id
limit %(limit)s::int
for no key update of t skip locked

-- name: retry_many
-- One batch of a bulk retry: up to %(limit)s selected tasks (failed or
-- cancelled), oldest first, pending again now with a fresh budget (as
-- retry); rows locked by others are passed by. The ids moved, and their
-- queues' idle workers told. FOR NO KEY UPDATE re-reads a row another
-- transaction changed before it is locked, so the filter holds at the write.
with chosen as materialized ({part_batch}),
moved as (
    update {schema}.tasks t
    set state = 'pending', spent = 0,
        run_at = coalesce(%(now)s::timestamptz, statement_timestamp()),
        cancel_requested = false, result = null, finished_at = null
    from chosen c
    where t.id = c.id
    returning t.id, t.queue
),
notified as (
    select count(pg_notify({channel}, q.queue)) as n
    from (select distinct queue from moved) as q
)
select array(select id from moved order by id), (select n from notified);

-- name: cancel_many
-- One batch of a bulk cancel: up to %(limit)s selected tasks (pending,
-- waiting or running), oldest first, each as cancel: pending and waiting
-- ones end now, a running one has its cancel requested and its worker is
-- told. Rows locked by others (a heartbeat or a completion being written)
-- are passed by, as retry_many does: waiting for them could deadlock with a
-- completion that locks a batch in another order. A row another transaction
-- changed is re-read once locked: a task that finished or moved meanwhile
-- is left as it is. The ids cancelled.
with chosen as materialized ({part_batch}),
cancelled as (
    update {schema}.tasks t
    set state = case when t.state = 'in_progress' then t.state else 'cancelled' end,
        cancel_requested = (t.state = 'in_progress'),
        finished_at = case when t.state = 'in_progress' then null
                           else coalesce(%(now)s::timestamptz, statement_timestamp()) end
    from chosen c
    where t.id = c.id
    returning t.id, t.state
),
notified as (
    select count(pg_notify({cancel_channel}, c.id::text)) as n
    from cancelled c where c.state = 'in_progress'
)
select array(select id from cancelled order by id), (select n from notified);

-- name: delete_many
-- One batch of a bulk delete: up to %(limit)s selected tasks (finished
-- ones only: no parent waits for them; none an unfinished task depends
-- on), oldest first, with their attempts,
-- messages and keys, as delete_task. It locks each row first and re-reads
-- it: a task retried meanwhile is not deleted; rows locked by others (a
-- retry, a prune under way) are passed by. The ids deleted.
with chosen as materialized (
    select t.id from {schema}.tasks t
    where {part_selected}
      and t.state in ('succeeded', 'failed', 'cancelled')
      and not {part_awaited}
    order by t.id
    limit %(limit)s::int
    for update of t skip locked
),
gone as (
    delete from {schema}.tasks t using chosen c where t.id = c.id
    returning t.id
),
attempts_gone as (
    delete from {schema}.attempts a using gone g where a.task_id = g.id
)
select array(select id from gone order by id);
