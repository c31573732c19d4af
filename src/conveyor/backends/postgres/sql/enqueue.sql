-- Inserting tasks: in batches, one alone, handed off to a standby worker
-- (and the standby offers themselves), and with idempotency keys.
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

-- name: enqueue
-- Insert many tasks in one statement. Ids come back as one array, in
-- insertion order (identity values are drawn in insertion order within one
-- statement, so ascending ids are the input order): one row to decode, not
-- one per task.
with inserted as (
    insert into {schema}.tasks
        (name, queue, payload, priority, run_at, max_attempts, retry_policy,
         timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, expires_at, created_at)
    select i.name, i.queue, i.payload::jsonb, i.priority,
           coalesce(i.run_at, coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => i.delay)),
           i.max_attempts, i.retry_policy::jsonb, i.timeout_seconds, i.lease_seconds, i.step,
           i.inbox, i.parent_id, i.trace_context, i.expires_at,
           coalesce(%(now)s::timestamptz, statement_timestamp())
    from unnest(%(names)s::text[], %(queues)s::text[], %(payloads)s::text[],
                %(priorities)s::int[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
                %(max_attempts)s::int[], %(retry_policies)s::text[],
                %(timeouts)s::float8[], %(leases)s::float8[], %(steps)s::text[],
                %(inboxes)s::boolean[], %(parent_ids)s::bigint[], %(traces)s::text[],
                %(expires)s::timestamptz[])
        as i(name, queue, payload, priority, run_at, delay, max_attempts, retry_policy,
             timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, expires_at)
    returning id
)
select array_agg(id order by id) from inserted;

-- name: enqueue_uniform
-- Insert many tasks that share every option (what enqueue_many makes): the
-- options travel once and the payloads as one JSON array, several times
-- cheaper to send than one array per column. Ids come back as in enqueue.
with inserted as (
    insert into {schema}.tasks
        (name, queue, payload, priority, run_at, max_attempts, retry_policy,
         timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, expires_at, created_at)
    select %(name)s::text, %(queue)s::text, p.value, %(priority)s::int,
           coalesce(%(run_at)s::timestamptz,
                    coalesce(%(now)s::timestamptz, statement_timestamp())
                    + make_interval(secs => %(delay)s::float8)),
           %(max_attempts)s::int, %(retry_policy)s::jsonb, %(timeout)s::float8,
           %(lease)s::float8, %(step)s::text, %(inbox)s::boolean, %(parent_id)s::bigint,
           %(trace)s::text, %(expires_at)s::timestamptz,
           coalesce(%(now)s::timestamptz, statement_timestamp())
    from jsonb_array_elements(%(payloads)s::jsonb) with ordinality as p(value, ord)
    order by p.ord
    returning id
)
select array_agg(id order by id) from inserted;

-- name: enqueue_one
-- Insert one task (what enqueue makes): enqueue_uniform without the JSON
-- array to take apart, about a third less time on the server. Its id comes
-- back as in enqueue, an array.
insert into {schema}.tasks
    (name, queue, payload, priority, run_at, max_attempts, retry_policy,
     timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, expires_at, created_at)
values (%(name)s::text, %(queue)s::text, %(payloads)s::jsonb, %(priority)s::int,
        coalesce(%(run_at)s::timestamptz,
                 coalesce(%(now)s::timestamptz, statement_timestamp())
                 + make_interval(secs => %(delay)s::float8)),
        %(max_attempts)s::int, %(retry_policy)s::jsonb, %(timeout)s::float8,
        %(lease)s::float8, %(step)s::text, %(inbox)s::boolean, %(parent_id)s::bigint,
        %(trace)s::text, %(expires_at)s::timestamptz,
           coalesce(%(now)s::timestamptz, statement_timestamp()))
returning array[id];

-- name: enqueue_handoff
-- enqueue_one for a task due now, handed to an idle worker when one offers a
-- free slot for its queue and name (standby_offer) and neither is paused:
-- the task is inserted already leased to that worker (attempt 1, as a claim
-- would lease it), the offer gives up the slot, and the worker is told on a
-- channel of its own, whose payload carries what a claim returns. All in
-- this statement's commit: the task starts after one durable commit instead
-- of two. With no offer (or every offer locked by another enqueue at that
-- moment: skipped, not waited for), or a notice that would not fit in
-- pg_notify's 8,000 bytes, the task is inserted pending, as by
-- enqueue_one. The worker's channel is drawn from the schema's, its id and
-- its process's nonce (conveyor.backends.postgres.handoffs.channel says the
-- same). Its id comes back as in enqueue, an array.
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
-- The task's own fields as the notice carries them (the stored payload's
-- text: jsonb's, which may be longer than the one sent).
notice as (
    select json_build_array(%(name)s::text, %(queue)s::text, %(payloads)s::jsonb::text,
                            %(max_attempts)s::int, %(retry_policy)s::text, %(timeout)s::float8,
                            %(lease)s::float8, %(step)s::text, %(parent_id)s::bigint,
                            %(trace)s::text)::text as fields
),
offer as materialized (
    select s.worker_id
    from {schema}.standby s, clock, notice n
    where s.free > 0
      and s.until > clock.now
      and %(queue)s::text = any(s.queues)
      and %(name)s::text = any(s.names)
      and octet_length(n.fields) <= 7800  -- the id and two times: under 100 more
      and not exists (select 1 from {schema}.pauses p
                      where (p.kind = 'queue' and p.name = %(queue)s::text)
                         or (p.kind = 'task' and p.name = %(name)s::text))
    limit 1
    for no key update of s skip locked
),
taken as (
    update {schema}.standby s
    set free = s.free - 1
    from offer o
    where s.worker_id = o.worker_id
    returning s.worker_id, s.nonce, s.lease_seconds
),
inserted as (
    insert into {schema}.tasks
        (name, queue, payload, priority, run_at, max_attempts, retry_policy,
         timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, expires_at, created_at,
         state, attempt, spent, worker_id, attempt_started_at, lease_expires_at)
    select %(name)s::text, %(queue)s::text, %(payloads)s::jsonb, %(priority)s::int, clock.now,
           %(max_attempts)s::int, %(retry_policy)s::jsonb, %(timeout)s::float8,
           %(lease)s::float8, %(step)s::text, false, %(parent_id)s::bigint,
           %(trace)s::text, %(expires_at)s::timestamptz, clock.now,
           case when k.worker_id is null then 'pending' else 'in_progress' end,
           (k.worker_id is not null)::int, (k.worker_id is not null)::int, k.worker_id,
           case when k.worker_id is not null then clock.now end,
           case when k.worker_id is not null
                then clock.now + make_interval(secs => coalesce(%(lease)s::float8,
                                                               k.lease_seconds))
           end
    from clock left join taken k on true
    returning id, worker_id, lease_expires_at, run_at
),
-- The notice: [id, lease start, lease end (epoch seconds), [fields]].
told as (
    select pg_notify('conveyor_handoff_' || md5({channel} || ' ' || k.worker_id || ' ' || k.nonce),
                     json_build_array(i.id, extract(epoch from i.run_at),
                                      extract(epoch from i.lease_expires_at),
                                      n.fields::json)::text)
    from inserted i, taken k, notice n
)
select array[i.id], (select count(*) from told) from inserted i;

-- name: standby_offer
-- A worker process (%(nonce)s) offers %(free)s::int more of its free slots
-- to enqueues (enqueue_handoff), or only renews its offer (0), until
-- %(ttl)s seconds from now; an offer of the worker's id by another process
-- (a predecessor under the same id) is replaced, not added to. Returns the
-- store's clock (epoch seconds: the worker reckons the leases of
-- handed-off tasks from it) and whether the offer was made anew (this
-- process had none stored). Each call also sends %(ping)s::text (digits)
-- on the process's channel: hearing it proves the listener hears the
-- hand-offs.
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
stored as (
    insert into {schema}.standby as s
        (worker_id, nonce, queues, names, free, lease_seconds, until)
    select %(worker_id)s::text, %(nonce)s::text, %(queues)s::text[], %(names)s::text[],
           %(free)s::int, %(lease)s::float8, clock.now + make_interval(secs => %(ttl)s::float8)
    from clock
    on conflict (worker_id) do update
    set free = case when s.nonce = excluded.nonce then s.free + excluded.free
                    else excluded.free end,
        nonce = excluded.nonce,
        queues = excluded.queues,
        names = excluded.names,
        lease_seconds = excluded.lease_seconds,
        until = excluded.until
    returning (s.xmax = 0) as inserted
)
select extract(epoch from (select now from clock))::float8,
       coalesce((select inserted from stored), false),
       pg_notify('conveyor_handoff_' || md5({channel} || ' ' || %(worker_id)s::text
                                            || ' ' || %(nonce)s::text), %(ping)s::text);

-- name: standby_withdraw
-- A worker withdraws its offer: the slots no enqueue took come back (as
-- free), so the worker knows how many were handed off. Rows of other
-- workers' offers that lapsed a day ago (workers that died offering) go
-- too.
with lapsed as (
    delete from {schema}.standby s
    where s.until < coalesce(%(now)s::timestamptz, statement_timestamp()) - interval '1 day'
      and s.worker_id <> %(worker_id)s::text
)
delete from {schema}.standby s
where s.worker_id = %(worker_id)s::text
returning s.free;

-- name: standby_adopt
-- The tasks handed off to a worker that it did not hear of (its listener
-- was away when their notices came): in progress under its id with a live
-- lease, started at their enqueue (a claimed task starts later than it was
-- made), and not among %(known)s::bigint[], the hand-offs it holds or held.
-- Rows as enqueue_handoff's notice carries them. There are few tasks in
-- progress: they are read off their lease index.
select t.id, extract(epoch from t.run_at)::float8,
       extract(epoch from t.lease_expires_at)::float8,
       json_build_array(t.name, t.queue, t.payload::text, t.max_attempts,
                        t.retry_policy::text, t.timeout_seconds, t.lease_seconds, t.step,
                        t.parent_id, t.trace_context)
from {schema}.tasks t
where t.state = 'in_progress'
  and t.lease_expires_at > coalesce(%(now)s::timestamptz, statement_timestamp())
  and t.worker_id = %(worker_id)s::text
  and t.attempt = 1
  and t.attempt_started_at = t.created_at
  and not (t.id = any(%(known)s::bigint[]));

-- name: enqueue_keyed
-- Insert tasks some of which carry an idempotency key, a concurrency key or
-- dependencies. A task whose name and key are stored already is skipped, by
-- the unique index (so concurrent enqueues of one key store one task: the
-- later waits for the earlier's commit, then skips). The inserted rows come
-- back with their name and key; unkeyed ones in input order (ids are drawn
-- in insertion order). The ids of skipped tasks are read by stored_keys, in
-- a statement of its own, whose snapshot sees the commit that made this one
-- skip. A task with dependencies is stored waiting for them (waiting_for:
-- their number); its edges are the script's next statements (wait_for).
insert into {schema}.tasks
    (name, queue, payload, priority, run_at, max_attempts, retry_policy,
     timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, expires_at,
     idempotency_key, unique_scope, unique_until, concurrency_key, concurrency_limit, rate_limit, rate_period,
     state, waiting_for, after_policy, receives, created_at)
select i.name, i.queue, i.payload::jsonb, i.priority,
       coalesce(i.run_at, coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => i.delay)),
       i.max_attempts, i.retry_policy::jsonb, i.timeout_seconds, i.lease_seconds, i.step,
       i.inbox, i.parent_id, i.trace_context, i.expires_at, i.idempotency_key, i.unique_scope,
       coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => i.unique_for),
       i.concurrency_key, i.concurrency_limit, i.rate_limit, i.rate_period,
       case when i.waiting_for is null then 'pending' else 'waiting' end,
       i.waiting_for, i.after_policy, i.receives,
       coalesce(%(now)s::timestamptz, statement_timestamp())
from unnest(%(names)s::text[], %(queues)s::text[], %(payloads)s::text[],
            %(priorities)s::int[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
            %(max_attempts)s::int[], %(retry_policies)s::text[],
            %(timeouts)s::float8[], %(leases)s::float8[], %(steps)s::text[],
            %(inboxes)s::boolean[], %(parent_ids)s::bigint[], %(traces)s::text[],
            %(expires)s::timestamptz[], %(keys)s::text[], %(scopes)s::text[],
            %(periods)s::float8[],
            %(concurrency_keys)s::text[], %(concurrency_limits)s::int[],
            %(rate_limits)s::int[], %(rate_periods)s::float8[],
            %(waiting_fors)s::int[], %(after_policies)s::text[], %(receives)s::text[])
    with ordinality
    as i(name, queue, payload, priority, run_at, delay, max_attempts, retry_policy,
         timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, expires_at,
         idempotency_key, unique_scope, unique_for, concurrency_key, concurrency_limit, rate_limit, rate_period,
         waiting_for, after_policy, receives, ord)
order by i.ord
on conflict (name, idempotency_key) where idempotency_key is not null do nothing
returning id, name, idempotency_key;

-- name: dependencies_stored
-- Which of these dependencies are stored: an enqueue refuses, before it
-- inserts anything, one that names a task that is not.
select id from {schema}.tasks where id = any(%(ids)s::bigint[]);

-- name: lock_dependencies
-- Lock, in id order, the tasks an enqueue's new tasks depend on, mark them
-- as depended on (so that their ends fire the settling trigger), and read
-- their states: a dependency ending at this moment is then counted once,
-- by its end or by this enqueue (see settle_ended in migration 0022). Rows
-- locked by others are passed by, not waited for: a finish that ends
-- several of them locks them in the order its plan meets them, and waiting
-- for one while holding another could deadlock with it. The script then
-- rolls back to a savepoint (dropping what it locked), waits for one row
-- it could not lock, holding none (wait_for_task), and tries again.
with locked as materialized (
    select t.id, t.state, t.dependents from {schema}.tasks t
    where t.id = any(%(ids)s::bigint[])
    order by t.id
    for no key update of t skip locked
),
flagged as (
    update {schema}.tasks t set dependents = true
    from locked l
    where t.id = l.id and not l.dependents
)
select l.id, l.state from locked l;

-- name: wait_for_task
-- Wait until the transaction that locks task %(id)s ends (see
-- lock_dependencies; the caller rolls the lock taken here back at once).
select 1 from {schema}.tasks where id = %(id)s::bigint for no key update;

-- name: dependencies_savepoint
-- See lock_dependencies.
savepoint conveyor_dependencies;

-- name: dependencies_rollback
-- See lock_dependencies.
rollback to savepoint conveyor_dependencies;

-- name: dependencies_release
-- See lock_dependencies.
release savepoint conveyor_dependencies;

-- name: insert_edges
-- A new task's edges, one per entry of its `after`, by position.
insert into {schema}.dependencies (task_id, position, depends_on)
select * from unnest(%(task_ids)s::bigint[], %(positions)s::int[], %(depends_on)s::bigint[]);

-- name: settle_at_enqueue
-- Count the ends of the dependencies found ended (ids and states), at the
-- enqueue's time, as if they ended now: the edges to them are the new
-- tasks' only (their other edges were settled when they ended).
select {schema}.settle_ended(
    %(ids)s::bigint[], %(states)s::text[],
    array_fill(coalesce(%(now)s::timestamptz, statement_timestamp()),
               array[cardinality(%(ids)s::bigint[])]),
    {channel});
