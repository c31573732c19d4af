-- Every statement of the PostgreSQL backend, as named blocks.
--
-- {schema} is the validated schema identifier, composed in once at load,
-- {channel} the schema's wake-up channel for pg_notify (a string literal),
-- {cancel_channel} the one for cancels of running tasks, and {lock_space}
-- the first key of the schema's advisory locks (an integer).
-- A block named part_* is not a statement: it is composed in once at load
-- where a statement says {part_...}, for text that several statements share.
-- {text:NAME} is a text every backend writes alike (an error type or
-- message of the attempt log, conveyor.backends.stored.SQL_TEXTS), composed
-- in first as an SQL literal; one with holes reads the columns they name.
-- %(now)s is NULL in production: the database clock is the only authority on
-- lease expiry; tests pass a time to move the clock without sleeping. The
-- clock is statement_timestamp(), not now(): inside a long transaction (an
-- attempt's own transaction) now() would be the stale transaction start.

-- name: enqueue
-- Insert many tasks in one statement. Ids come back as one array, in
-- insertion order (identity values are drawn in insertion order within one
-- statement, so ascending ids are the input order): one row to decode, not
-- one per task.
with inserted as (
    insert into {schema}.tasks
        (name, queue, payload, priority, run_at, max_attempts, retry_policy,
         timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, created_at)
    select i.name, i.queue, i.payload::jsonb, i.priority,
           coalesce(i.run_at, coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => i.delay)),
           i.max_attempts, i.retry_policy::jsonb, i.timeout_seconds, i.lease_seconds, i.step,
           i.inbox, i.parent_id, i.trace_context,
           coalesce(%(now)s::timestamptz, statement_timestamp())
    from unnest(%(names)s::text[], %(queues)s::text[], %(payloads)s::text[],
                %(priorities)s::int[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
                %(max_attempts)s::int[], %(retry_policies)s::text[],
                %(timeouts)s::float8[], %(leases)s::float8[], %(steps)s::text[],
                %(inboxes)s::boolean[], %(parent_ids)s::bigint[], %(traces)s::text[])
        as i(name, queue, payload, priority, run_at, delay, max_attempts, retry_policy,
             timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context)
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
         timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, created_at)
    select %(name)s::text, %(queue)s::text, p.value, %(priority)s::int,
           coalesce(%(run_at)s::timestamptz,
                    coalesce(%(now)s::timestamptz, statement_timestamp())
                    + make_interval(secs => %(delay)s::float8)),
           %(max_attempts)s::int, %(retry_policy)s::jsonb, %(timeout)s::float8,
           %(lease)s::float8, %(step)s::text, %(inbox)s::boolean, %(parent_id)s::bigint,
           %(trace)s::text, coalesce(%(now)s::timestamptz, statement_timestamp())
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
     timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, created_at)
values (%(name)s::text, %(queue)s::text, %(payloads)s::jsonb, %(priority)s::int,
        coalesce(%(run_at)s::timestamptz,
                 coalesce(%(now)s::timestamptz, statement_timestamp())
                 + make_interval(secs => %(delay)s::float8)),
        %(max_attempts)s::int, %(retry_policy)s::jsonb, %(timeout)s::float8,
        %(lease)s::float8, %(step)s::text, %(inbox)s::boolean, %(parent_id)s::bigint,
        %(trace)s::text, coalesce(%(now)s::timestamptz, statement_timestamp()))
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
         timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, created_at,
         state, attempt, spent, worker_id, attempt_started_at, lease_expires_at)
    select %(name)s::text, %(queue)s::text, %(payloads)s::jsonb, %(priority)s::int, clock.now,
           %(max_attempts)s::int, %(retry_policy)s::jsonb, %(timeout)s::float8,
           %(lease)s::float8, %(step)s::text, false, %(parent_id)s::bigint,
           %(trace)s::text, clock.now,
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
-- Insert tasks some of which carry an idempotency key. A task whose name
-- and key are stored already is skipped, by the unique index (so concurrent
-- enqueues of one key store one task: the later waits for the earlier's
-- commit, then skips). The inserted rows come back with their name and key;
-- unkeyed ones in input order (ids are drawn in insertion order). The ids
-- of skipped tasks are read by stored_keys, in a statement of its own,
-- whose snapshot sees the commit that made this one skip.
insert into {schema}.tasks
    (name, queue, payload, priority, run_at, max_attempts, retry_policy,
     timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, idempotency_key,
     unique_scope, unique_until, concurrency_key, concurrency_limit, rate_limit, rate_period,
     created_at)
select i.name, i.queue, i.payload::jsonb, i.priority,
       coalesce(i.run_at, coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => i.delay)),
       i.max_attempts, i.retry_policy::jsonb, i.timeout_seconds, i.lease_seconds, i.step,
       i.inbox, i.parent_id, i.trace_context, i.idempotency_key, i.unique_scope,
       coalesce(%(now)s::timestamptz, statement_timestamp()) + make_interval(secs => i.unique_for),
       i.concurrency_key, i.concurrency_limit, i.rate_limit, i.rate_period,
       coalesce(%(now)s::timestamptz, statement_timestamp())
from unnest(%(names)s::text[], %(queues)s::text[], %(payloads)s::text[],
            %(priorities)s::int[], %(run_ats)s::timestamptz[], %(delays)s::float8[],
            %(max_attempts)s::int[], %(retry_policies)s::text[],
            %(timeouts)s::float8[], %(leases)s::float8[], %(steps)s::text[],
            %(inboxes)s::boolean[], %(parent_ids)s::bigint[], %(traces)s::text[],
            %(keys)s::text[], %(scopes)s::text[], %(periods)s::float8[],
            %(concurrency_keys)s::text[], %(concurrency_limits)s::int[],
            %(rate_limits)s::int[], %(rate_periods)s::float8[])
    with ordinality
    as i(name, queue, payload, priority, run_at, delay, max_attempts, retry_policy,
         timeout_seconds, lease_seconds, step, inbox, parent_id, trace_context, idempotency_key,
         unique_scope, unique_for, concurrency_key, concurrency_limit, rate_limit, rate_period,
         ord)
order by i.ord
on conflict (name, idempotency_key) where idempotency_key is not null do nothing
returning id, name, idempotency_key;

-- name: lock_unique_keys
-- The unique keys of a batch, locked (advisory, until commit) in one order
-- before anything is inserted. Two enqueues of the same keys in different
-- orders would otherwise deadlock on the unique index, each waiting for a
-- key the other inserted first; now the later one waits for the earlier's
-- commit before it inserts anything. Keys fold into 32-bit hashes (two keys
-- sharing one only wait for each other) in a space apart from guard_send's.
select count(pg_advisory_xact_lock(({lock_space} # 1), k.h))
from (select distinct hashtext(k.name || chr(31) || k.key) as h
      from unnest(%(names)s::text[], %(keys)s::text[]) as k(name, key)
      where k.key is not null
      order by h) as k;

-- name: ensure_keys
-- The concurrency rows of a batch's keys, made in key order before its tasks
-- are inserted (the trigger then finds them). Inserting a new key waits for
-- another transaction that inserted the same key, uncommitted; two enqueues
-- of new keys in different orders would otherwise deadlock. A key's limit and
-- rate come from the batch's first task with it, as the trigger does. Keys
-- whose row this statement sees are left out: an insert that meets a row
-- another transaction changed, uncommitted (a new limit), would wait for it.
insert into {schema}.concurrency (key, max_running, rate_limit, rate_period, tokens, refilled_at)
select distinct on (k.key)
       k.key, coalesce(k.max_running, 1000000), k.rate_limit, k.rate_period, k.rate_limit,
       statement_timestamp()
from unnest(%(concurrency_keys)s::text[], %(concurrency_limits)s::int[],
            %(rate_limits)s::int[], %(rate_periods)s::float8[])
    with ordinality as k(key, max_running, rate_limit, rate_period, ord)
where k.key is not null
  and not exists (select 1 from {schema}.concurrency c where c.key = k.key)
order by k.key, k.ord
on conflict (key) do nothing
returning key;

-- name: drop_unused_keys
-- After a batch some of whose tasks found their unique key taken: the rows
-- ensure_keys made (%(keys)s::text[]) for keys no pending task has. Without
-- a task, a key has no row: the next task of the key makes it, with its own
-- limit and rate.
delete from {schema}.concurrency c
where c.key = any(%(keys)s::text[])
  and not exists (select 1 from {schema}.tasks t
                  where t.concurrency_key = c.key and t.state = 'pending');

-- name: release_keys
-- Unique keys whose period has ended give way to the enqueue that wants
-- them: cleared, so that enqueue_keyed (next, in the same transaction)
-- stores a new task under each.
update {schema}.tasks t
set idempotency_key = null
from unnest(%(names)s::text[], %(keys)s::text[]) as k(name, key)
where t.name = k.name and t.idempotency_key = k.key
  and t.unique_until <= coalesce(%(now)s::timestamptz, statement_timestamp());

-- name: replace_pending
-- on_conflict "replace": the holders that are still pending take the
-- payload, priority and due time of the enqueue that found them.
update {schema}.tasks t
set payload = r.payload::jsonb,
    priority = r.priority,
    run_at = coalesce(r.run_at,
                      coalesce(%(now)s::timestamptz, statement_timestamp())
                      + make_interval(secs => r.delay))
from unnest(%(ids)s::bigint[], %(payloads)s::text[], %(priorities)s::int[],
            %(run_ats)s::timestamptz[], %(delays)s::float8[])
    as r(id, payload, priority, run_at, delay)
where t.id = r.id and t.state = 'pending'
returning t.id, t.queue;

-- name: stored_keys
-- The tasks holding these names' unique keys, and whether each one's
-- period is over (release_keys then frees the key).
select t.name, t.idempotency_key, t.id,
       coalesce(t.unique_until <= coalesce(%(now)s::timestamptz, statement_timestamp()), false)
from {schema}.tasks t
join unnest(%(names)s::text[], %(keys)s::text[]) as k(name, key)
  on t.name = k.name and t.idempotency_key = k.key;

-- name: part_claim_due
-- Part of both claims (composed in where they say {part_claim_due}): the due
-- pending tasks of the worker's queues and names, up to %(limit)s::int per
-- queue, each queue read in claim order off its index.
--
-- Every claim, reclaim, renewal and completion locks its rows FOR NO KEY UPDATE
-- (the lock its own UPDATE takes), never FOR UPDATE: that one conflicts
-- with the KEY SHARE lock that storing a message takes on its recipient's
-- row (the messages' foreign key) until the send commits, and a busy inbox
-- would keep its task from being claimed or its lease from being renewed.
--
-- Paused queues and names are left out: the statement's `served` CTE
-- ({part_served}) cuts them once, not row by row.
due as materialized (
    select p.id, p.priority, p.run_at
    from served s
    cross join unnest(s.queues) as q(name)
    cross join lateral (
        select t.id, t.priority, t.run_at
        from {schema}.tasks t
        where t.state = 'pending'
          and t.queue = q.name
          and t.concurrency_key is null  -- keyed tasks: claim_keyed
          and t.run_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
          and t.name = any(s.names)
          and t.attempt <= 2147483645 and t.spent <= 2147483645  -- see quarantine
        order by t.priority desc, t.run_at, t.id
        limit %(limit)s::int
        for no key update of t skip locked
    ) as p
)

-- name: part_served
-- Part of the claims (a CTE): the worker's queues and task names that are
-- not paused, as two arrays (uncorrelated sub-selects, run once).
served as (
    select array(select unnest(%(queues)s::text[])
                 except select name from {schema}.pauses where kind = 'queue') as queues,
           array(select unnest(%(names)s::text[])
                 except select name from {schema}.pauses where kind = 'task') as names
)

-- name: part_claimed
-- Part of both claims: the tasks of the statement's own `chosen` CTE start
-- their attempt, under a lease from the statement's `clock`. They are
-- found by key, as an array: joined with `chosen`, the generic plan of a
-- claim beside a backlog the statistics know of (a tenth of it, the
-- planner guesses, passes the LIMIT) hashed the chosen ids and scanned the
-- whole table for them.
claimed as (
    update {schema}.tasks t
    set state = 'in_progress',
        attempt = t.attempt + 1,
        spent = t.spent + 1,
        worker_id = %(worker_id)s::text,
        attempt_started_at = clock.now,
        lease_expires_at = clock.now
            + make_interval(secs => coalesce(t.lease_seconds, %(lease)s::float8))
    from clock
    where t.id = any(array(select c.id from chosen c))
    -- (a cast keeps its column's name: payload, retry_policy)
    returning t.id, t.attempt, t.name, t.queue, t.payload::text, t.spent,
              t.max_attempts, t.retry_policy::text, t.timeout_seconds,
              t.lease_seconds, t.lease_expires_at, t.step, t.parent_id, t.priority, t.run_at,
              t.concurrency_key, t.concurrency_limit, t.trace_context
)

-- name: part_claim_inbox
-- Part of the claims' final select: the inbox of each claimed coroutine task
-- (%(inbox_names)s: the names of the worker's coroutine tasks), read with
-- its claim, so that its poll needs no round trip of its own; NULL for
-- every other task (no read at all). Not in claim_reclaim, which runs once a
-- poll interval and must stay under psycopg's 4 KiB of cached statement:
-- the tasks it claims read their inboxes themselves. A message that arrives after the claim
-- stays in the inbox: the poll's completion sees it and makes the task due
-- again (rewake), as for one that arrives while the poll runs.
case when claimed.name = any(%(inbox_names)s::text[]) then (
    select coalesce(json_agg(json_build_array(m.id, m.sender_id, m.kind, m.body::text,
                                              m.created_at, m.trace_context) order by m.id),
                    '[]')
    from {schema}.messages m
    where m.task_id = claimed.id
) end

-- name: claim
-- Claim up to %(limit)s::int due pending tasks of the worker's queues and
-- names, in claim order (priority, run_at, id), in one statement. The
-- candidates sit behind a MATERIALIZED CTE: an optimisation fence, without
-- which the planner may lock more rows than the LIMIT asks for. The running
-- attempt is not logged at its claim: the task row holds it (attempt,
-- worker_id, attempt_started_at, step) until its completion writes its one row
-- to the attempt log.
--
-- This is the worker's usual claim; claim_reclaim, which also takes back
-- expired leases, runs about once per poll interval. Kept apart, this one is
-- planned once per connection (a generic plan): with the searches for
-- expired leases in the same statement, even switched off by a parameter,
-- the planner planned it anew at every execution, a third of a millisecond.
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
{part_served},
{part_claim_due},
chosen as (
    select id from due
    order by priority desc, run_at, id
    limit %(limit)s::int
),
{part_claimed}
-- In claim order, like every backend. The last column says whether any
-- concurrency key has pending tasks (keys_waiting): a worker whose claim
-- comes back short looks for keyed tasks only then, and learns it without a
-- round trip of its own. When nothing is claimed, one row of nulls carries it.
select id, attempt, name, queue, payload, spent, max_attempts, retry_policy,
       timeout_seconds, lease_seconds, lease_expires_at, step, parent_id, run_at, trace_context,
       {part_claim_inbox},
       w.keys_waiting
from (select exists (select 1 from {schema}.concurrency) as keys_waiting) as w
left join claimed on true
order by priority desc, run_at, id;

-- name: claim_reclaim
-- claim, and take back expired leases: up to %(limit)s::int tasks in one
-- statement, due pending tasks of the worker's queues and names plus
-- in-progress tasks whose lease expired,
-- merged in claim order (priority, run_at, id). Every candidate set sits
-- behind a MATERIALIZED CTE: an optimisation fence, without which the
-- planner may lock more rows than the LIMIT asks for. An expired task whose
-- attempts are spent (the crash budget) or whose cancellation was requested
-- is finished here instead of being run again (all of them, not counted
-- against the limit); the attempt each expired lease lost is logged as
-- lease_lost in the same statement. The running attempt is not logged at
-- its claim: the task row holds it (attempt, worker_id, attempt_started_at,
-- step) until its completion writes its one row to the attempt log.
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
{part_served},
{part_claim_due},
-- Expired leases that may run again, in claim order (there are few rows in
-- progress, so sorting them is cheap).
expired as materialized (
    select t.id, t.priority, t.run_at, t.attempt, t.worker_id, t.attempt_started_at, t.step
    from {schema}.tasks t, clock, served s
    where t.state = 'in_progress'
      and t.lease_expires_at <= clock.now
      and not t.cancel_requested
      and t.spent < t.max_attempts
      and t.queue = any(s.queues)
      and t.name = any(s.names)
      and t.attempt <= 2147483645 and t.spent <= 2147483645  -- see quarantine
    order by t.priority desc, t.run_at, t.id
    limit %(limit)s::int
    for no key update of t skip locked
),
-- Expired leases that must not run again: every one of them ends now.
exhausted as materialized (
    select t.id, t.attempt, t.spent, t.max_attempts, t.cancel_requested, t.worker_id,
           t.attempt_started_at, t.step
    from {schema}.tasks t, clock, served s
    where t.state = 'in_progress'
      and t.lease_expires_at <= clock.now
      and (t.cancel_requested or t.spent >= t.max_attempts)
      and t.queue = any(s.queues)
      and t.name = any(s.names)
    for no key update of t skip locked
),
ended as (
    update {schema}.tasks t
    set state = case when x.cancel_requested then 'cancelled' else 'failed' end,
        worker_id = null,
        lease_expires_at = null,
        finished_at = clock.now
    from exhausted x, clock
    where t.id = x.id
    returning t.id
),
chosen as (
    select id from (
        select id, priority, run_at from due
        union all
        select id, priority, run_at from expired
    ) as c
    order by priority desc, run_at, id
    limit %(limit)s::int
),
{part_claimed},
-- The attempts those expired leases lost: each ended task's, and each
-- reclaimed task's previous one. {text:crash_budget_spent} reads the
-- columns spent and max_attempts (of exhausted, the only table here).
lost_leases as (
    select x.id, x.attempt, x.worker_id, x.attempt_started_at, x.step,
           case when x.cancel_requested
                then {text:cancelled_meanwhile}
                else {text:crash_budget_spent}
           end as message
    from exhausted x
    union all
    select e.id, e.attempt, e.worker_id, e.attempt_started_at, e.step, {text:lease_expired}
    from expired e
    where e.id in (select id from claimed)
),
-- The conflict arm serves an attempt logged at its claim, as before
-- migration 0005, whose row is still open.
lost as (
    insert into {schema}.attempts as a
        (task_id, number, worker_id, outcome, started_at, finished_at, error_type,
         error_message, step)
    select l.id, l.attempt, l.worker_id, 'lease_lost',
           coalesce(l.attempt_started_at, clock.now), clock.now, {text:lease_expired_error},
           l.message, l.step
    from lost_leases l, clock
    on conflict (task_id, number) do update
    set outcome = excluded.outcome,
        finished_at = excluded.finished_at,
        error_type = excluded.error_type,
        error_message = excluded.error_message
    where a.outcome = 'in_progress'
)
-- In claim order, like every backend.
select id, attempt, name, queue, payload, spent, max_attempts, retry_policy,
       timeout_seconds, lease_seconds, lease_expires_at, step, parent_id, run_at, trace_context
from claimed
order by priority desc, run_at, id;

-- name: quarantine
-- Tasks the claims pass by because a counter stands at the limit (the next
-- attempt number would not fit; conveyor's own claims stop short of it, so
-- only a row written around conveyor gets there): due, or with an expired
-- lease, in the worker's queues and names. Each ends failed now, its
-- attempt log saying why, so it neither blocks its queue nor hides in it.
-- The worker runs this with its claims that look for expired leases (about
-- once per poll interval); tasks_unclaimable keeps it to the few such rows.
-- {text:corrupt_counter} reads the columns attempt and spent (of stuck: the
-- clock has neither).
--
-- The candidates are read first, by tasks_unclaimable's own predicate and
-- nothing else: with the due and expired branches in the same filter, the
-- planner drew a bitmap OR over the listing and lease indexes instead, and
-- read every pending task (30 ms a call beside 150,000 of them).
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
unclaimable as materialized (
    select t.id
    from {schema}.tasks t
    where t.state in ('pending', 'in_progress')
      and (t.attempt > 2147483645 or t.spent > 2147483645)
      and t.queue = any(%(queues)s::text[])
      and t.name = any(%(names)s::text[])
),
stuck as materialized (
    select t.id, t.attempt, t.spent, t.state, t.worker_id, t.attempt_started_at, t.step
    from unclaimable u
    join {schema}.tasks t on t.id = u.id
    cross join clock
    where t.state in ('pending', 'in_progress')
      and (t.attempt > 2147483645 or t.spent > 2147483645)
      and ((t.state = 'pending' and t.run_at <= clock.now)
           or (t.state = 'in_progress' and t.lease_expires_at <= clock.now))
    for no key update of t skip locked
),
ended as (
    update {schema}.tasks t
    set state = 'failed', worker_id = null, lease_expires_at = null, finished_at = clock.now
    from stuck s, clock
    where t.id = s.id
)
insert into {schema}.attempts as a
    (task_id, number, worker_id, outcome, started_at, finished_at, error_type, error_message,
     step)
select s.id, s.attempt + (s.state = 'pending')::int, coalesce(s.worker_id, %(worker_id)s::text),
       'failed', coalesce(s.attempt_started_at, clock.now), clock.now, {text:corrupt_task_error},
       {text:corrupt_counter}, s.step
from stuck s, clock
on conflict (task_id, number) do update
set outcome = excluded.outcome, finished_at = excluded.finished_at,
    error_type = excluded.error_type, error_message = excluded.error_message
returning task_id;

-- name: heartbeat
-- Renew every lease the worker still holds, fenced by the lease token, and
-- mark the worker alive. A lease that already expired is not renewed: it may
-- have been reclaimed. Each input lease comes back once: `live` if it is
-- still the worker's, `renewed` if it was renewed now; one more row, with
-- no task, when the worker is not registered (its row was deleted: it
-- registers again). A live lease whose row is locked (its attempt
-- transaction is committing) is skipped, not waited for: one slow commit
-- must not hold back the renewal of every other lease.
--
-- Planner note (heartbeat and finish): statistics about running tasks are
-- nearly always stale (taken when few tasks ran), so any restriction that
-- singles them out of the tasks table (state, owner, lease) is estimated at
-- one row, and the planner then loops the whole input over every running
-- task. So the fence names no constant: the input rows carry the worker id
-- and the clock, behind a MATERIALIZED fence, every condition is a join
-- condition, and the only restriction is id = any(ids), which sends the
-- planner to the primary key. state = 'in_progress' is implied by a live
-- owner and lease (a check constraint on the table).
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now,
           %(worker_id)s::text as worker_id
),
seen as (
    update {schema}.workers w set last_seen_at = clock.now
    from clock where w.id = clock.worker_id
    returning w.id
),
leases as materialized (
    select l.id, l.attempt, clock.now, clock.worker_id
    from unnest(%(ids)s::bigint[], %(attempts)s::int[]) as l(id, attempt), clock
),
-- `live` and `free` state the same fence on purpose: `live` reads it from
-- the snapshot without waiting, `free` takes the row locks it can get, and
-- under its lock PostgreSQL re-checks the fence against the latest row.
live as materialized (
    select t.id, t.attempt, t.cancel_requested
    from {schema}.tasks t
    join leases l on t.id = l.id
    where t.id = any(%(ids)s::bigint[])
      and t.attempt = l.attempt
      and t.worker_id = l.worker_id
      and t.lease_expires_at > l.now
),
free as materialized (
    select t.id
    from {schema}.tasks t
    join leases l on t.id = l.id
    where t.id = any(%(ids)s::bigint[])
      and t.attempt = l.attempt
      and t.worker_id = l.worker_id
      and t.lease_expires_at > l.now
    for no key update of t skip locked
),
renewed as (
    update {schema}.tasks t
    set lease_expires_at = l.now + make_interval(secs => coalesce(t.lease_seconds, %(lease)s::float8))
    from free f
    join leases l on l.id = f.id
    where t.id = f.id
    returning t.id, t.attempt
)
-- Matched on the whole token: a stale token of a task whose current lease
-- is also in the input must come back lost, not live.
select l.id, l.attempt, v.id is not null as live, r.id is not null as renewed,
       coalesce(v.cancel_requested, false) as cancel_requested
from leases l
left join live v on v.id = l.id and v.attempt = l.attempt
left join renewed r on r.id = l.id and r.attempt = l.attempt
union all
select null, null, false, false, false
where not exists (select from seen);

-- name: part_finish_fence
-- Part of both finishes: each completion's fence, its lease token and a live
-- lease, written as join conditions of the input (`i`) with the tasks (`t`)
-- only, for the planner's sake (see heartbeat).
t.id = any(%(ids)s::bigint[])
and t.id = i.id
and t.attempt = i.attempt
and t.worker_id = i.worker_id
and t.lease_expires_at > i.now

-- name: part_keys_freed
-- Part of both finishes: each attempt of a concurrency key that ended (in
-- `finished`, with its key and the statement's now) frees a slot of its
-- key, so the idle workers of the queue of the key's next due task (in
-- claim order, on the key's pending index) are told at once, as for a next
-- step: without it a key's tasks would wait for a poll between each slot.
keys_freed as (
    select count(pg_notify({channel}, q.queue)) as n
    from (select distinct h.queue
          from (select distinct f.concurrency_key, f.now from finished f
                where f.concurrency_key is not null) as k
          cross join lateral (
              select p.queue from {schema}.tasks p
              where p.state = 'pending' and p.concurrency_key = k.concurrency_key
                and p.run_at <= k.now
              order by p.priority desc, p.run_at, p.id
              limit 1
          ) as h) as q
)

-- name: finish
-- Record many attempt completions in one statement, each fenced by its lease
-- token and a live lease; a late write from a lost lease changes nothing
-- and is simply missing from the result. A completion with a new state (a
-- workflow's next step, a coroutine's poll) stores that state, its options
-- and run time, with a fresh budget. The caller decides each next
-- state (retry or not) from the task's retry policy, except that a task
-- whose cancellation was requested while it ran is not made pending or
-- waiting again: it ends cancelled (its worker may not have heard of the
-- cancel yet). A task made due at once (a workflow's next step, a release,
-- a retry without backoff) wakes the idle workers of its queue, as an
-- enqueue does: no insert trigger sees it. The fence is written as join
-- conditions only, for the planner's sake (see heartbeat).
with input as materialized (
    select i.*, coalesce(%(now)s::timestamptz, statement_timestamp()) as now,
           %(worker_id)s::text as worker_id
    from unnest(%(ids)s::bigint[], %(attempts)s::int[], %(states)s::text[],
                %(outcomes)s::text[], %(delays)s::float8[], %(results)s::text[],
                %(error_types)s::text[], %(error_messages)s::text[], %(tracebacks)s::text[],
                %(steps)s::text[], %(step_states)s::text[], %(run_ats)s::timestamptz[],
                %(max_attempts)s::int[], %(retry_policies)s::text[],
                %(timeouts)s::float8[], %(leases)s::float8[])
        as i(id, attempt, state, outcome, delay, result, error_type, error_message,
             traceback, step, step_state, run_at, max_attempts, retry_policy,
             timeout_seconds, lease_seconds)
),
finished as (
    update {schema}.tasks t
    set state = case when t.cancel_requested and i.state in ('pending', 'waiting')
                     then 'cancelled' else i.state end,
        result = case when i.state = 'succeeded' then i.result::jsonb else t.result end,
        run_at = case when i.state = 'pending' and not t.cancel_requested
                      then coalesce(i.run_at, i.now + make_interval(secs => coalesce(i.delay, 0)))
                      else t.run_at end,
        spent = case when i.step_state is not null then 0
                     else t.spent - (i.outcome = 'interrupted')::int end,
        -- A new state: the next step (none for a coroutine), the state, its options.
        step = case when i.step_state is not null then i.step else t.step end,
        payload = coalesce(i.step_state::jsonb, t.payload),
        max_attempts = coalesce(i.max_attempts, t.max_attempts),
        retry_policy = coalesce(i.retry_policy::jsonb, t.retry_policy),
        timeout_seconds = case when i.step_state is not null then i.timeout_seconds
                               else t.timeout_seconds end,
        lease_seconds = case when i.step_state is not null then i.lease_seconds
                             else t.lease_seconds end,
        -- A succeeded attempt stays in the row (see finish_succeeded).
        worker_id = case when i.state = 'succeeded' then t.worker_id end,
        lease_expires_at = null,
        finished_at = case when i.state in ('succeeded', 'failed', 'cancelled')
                            or t.cancel_requested then i.now end
    from input i
    where {part_finish_fence}
    -- The attempt's completion comes along, so that logging it needs no second
    -- join with the input (a generic plan guesses 10 input rows and would
    -- make that join a nested loop, quadratic in the batch). So does the
    -- step the attempt ran: a new state replaces it in the row, and the
    -- subquery reads the row as it was before this statement.
    returning t.id, t.attempt, i.worker_id, t.attempt_started_at,
              case when i.step_state is null then t.step
                   else (select o.step from {schema}.tasks o where o.id = t.id) end as step,
              i.outcome, i.now, i.error_type, i.error_message, i.traceback,
              t.queue, t.state, t.state = 'pending' and t.run_at <= i.now as due,
              t.concurrency_key
),
logged as (
    insert into {schema}.attempts
        (task_id, number, worker_id, outcome, started_at, finished_at, error_type,
         error_message, traceback, step)
    select f.id, f.attempt, f.worker_id, f.outcome, coalesce(f.attempt_started_at, f.now),
           f.now, f.error_type, f.error_message, f.traceback, f.step
    from finished f
    where f.state <> 'succeeded'
),
notified as (
    select count(pg_notify({channel}, q.queue)) as n
    from (select distinct queue from finished where due) as q
),
{part_keys_freed}
select f.id, f.attempt from finished f, notified, keys_freed;

-- name: finish_succeeded
-- The common case of finish, on its own: many plain successes (no next
-- state, no error), each fenced by its lease token and a live lease, the
-- same fence and the same planner care as finish. Its input is cheap to
-- send: ids and attempts as array literals, the results (JSON texts
-- already) as one JSON array, zipped in order by ROWS FROM. It writes the
-- task rows only: each succeeded attempt stays in its row (owner, start,
-- step; see attempt_log in migration 0018). A keyed attempt's end wakes
-- its key's next task's queue (part_keys_freed).
with input as materialized (
    select i.*, coalesce(%(now)s::timestamptz, statement_timestamp()) as now,
           %(worker_id)s::text as worker_id
    from rows from (unnest(%(ids)s::bigint[]), unnest(%(attempts)s::int[]),
                    jsonb_array_elements(%(results)s::jsonb))
        as i(id, attempt, result)
),
finished as (
    update {schema}.tasks t
    set state = 'succeeded',
        result = i.result,
        lease_expires_at = null,
        finished_at = i.now
    from input i
    where {part_finish_fence}
    returning t.id, t.attempt, t.concurrency_key, i.now
),
{part_keys_freed}
select f.id, f.attempt from finished f, keys_freed;

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

-- name: task_state
select state from {schema}.tasks where id = %(id)s;

-- name: get_task
select id, name, queue, payload::text as payload, state, priority, run_at, attempt,
       max_attempts, retry_policy::text as retry_policy, timeout_seconds, lease_seconds,
       result::text as result, created_at, finished_at,
       case when state = 'in_progress' then worker_id end as worker_id, lease_expires_at,
       cancel_requested, step, parent_id, inbox, idempotency_key, concurrency_key
from {schema}.tasks
where id = %(id)s::bigint;

-- name: get_attempts
-- The ended attempts (attempt_log), and the running one, which its task row
-- holds.
select task_id, number, worker_id, outcome, started_at, finished_at, error_type,
       error_message, traceback, step
from {schema}.attempt_log
where task_id = %(id)s
union all
select t.id, t.attempt, t.worker_id, 'in_progress', t.attempt_started_at, null, null, null,
       null, t.step
from {schema}.tasks t
where t.id = %(id)s and t.state = 'in_progress'
  and not exists (select 1 from {schema}.attempts a
                  where a.task_id = t.id and a.number = t.attempt)
order by number;

-- name: part_listed
-- The columns of a listed task (list_tasks, list_children).
id, name, queue, payload::text as payload, state, priority, run_at, attempt,
max_attempts, retry_policy::text as retry_policy, timeout_seconds, lease_seconds,
result::text as result, created_at, finished_at,
case when state = 'in_progress' then worker_id end as worker_id, lease_expires_at,
cancel_requested, step, parent_id, inbox, idempotency_key, concurrency_key

-- name: part_list_filter
-- The optional filters of a listing.
(%(state)s::text is null or state = %(state)s::text)
and (%(name)s::text is null or name = %(name)s::text)
and (%(queue)s::text is null or queue = %(queue)s::text)
and (%(before)s::bigint is null or id < %(before)s::bigint)

-- name: list_tasks
-- Newest first, each filter optional.
select {part_listed}
from {schema}.tasks
where {part_list_filter}
order by id desc
limit %(limit)s::integer;

-- name: list_children
-- A parent's children, newest first, off its index of children.
select {part_listed}
from {schema}.tasks
where parent_id = %(parent)s::bigint and {part_list_filter}
order by id desc
limit %(limit)s::integer;

-- name: part_summary_filter
-- The optional filters of a summarized listing besides its state and parent.
-- `before` is a bound of the index scan even in a generic plan (no `or`).
(%(name)s::text is null or name = %(name)s::text)
and (%(queue)s::text is null or queue = %(queue)s::text)
and id < coalesce(%(before)s::bigint, 9223372036854775807)

-- name: part_summarized
-- The columns of a task's summary, for the ids of the page `page` names:
-- the narrow columns of the task row (no payload, no result), and, for a
-- task not running that did not succeed, its latest attempt, the last row
-- of its log in `attempts` by key (such a task's latest attempt is there:
-- only a succeeded one stays in its task row), its error cut short.
select t.id, t.name, t.queue, t.state, t.priority, t.run_at, t.attempt, t.max_attempts,
       t.created_at, t.finished_at,
       case when t.state = 'in_progress' then t.worker_id end, t.cancel_requested, t.step,
       e.outcome, e.error_type, e.error_message
from page
join {schema}.tasks t on t.id = page.id
left join lateral (
    select a.outcome, left(a.error_type, %(error_chars)s::integer) as error_type,
           left(a.error_message, %(error_chars)s::integer) as error_message
    from {schema}.attempts a
    where a.task_id = t.id and t.state not in ('in_progress', 'succeeded')
    order by a.number desc
    limit 1
) e on true
order by t.id desc

-- name: list_summaries
-- What list_tasks lists (no state, no parent), as summaries. The page's
-- ids come first, newest first off the primary key, in a CTE of their own:
-- only the page's rows are read whole, and no plan, however wrong its
-- guess of the table (no statistics: autovacuum may be off), sorts wide rows.
with page as materialized (
    select id from {schema}.tasks
    where {part_summary_filter}
    order by id desc
    limit %(limit)s::integer
)
{part_summarized};

-- name: list_summaries_in_state
-- The same for one state other than in_progress, off the listing index
-- (state, id desc), which leaves out running tasks: the condition on
-- in_progress lets a generic plan use it too.
with page as materialized (
    select id from {schema}.tasks
    where state = %(state)s::text and state <> 'in_progress' and {part_summary_filter}
    order by id desc
    limit %(limit)s::integer
)
{part_summarized};

-- name: list_running_summaries
-- The same for running tasks, off the lease index (only running rows): the
-- ids of the running tasks are sorted, never their rows.
with page as materialized (
    select id from {schema}.tasks
    where state = 'in_progress' and {part_summary_filter}
    order by id desc
    limit %(limit)s::integer
)
{part_summarized};

-- name: list_child_summaries
-- What list_children lists, as summaries: a parent's children off its index
-- of children, their ids sorted first.
with page as materialized (
    select id from {schema}.tasks
    where parent_id = %(parent)s::bigint
      and (%(state)s::text is null or state = %(state)s::text)
      and {part_summary_filter}
    order by id desc
    limit %(limit)s::integer
)
{part_summarized};

-- name: running_by_worker
-- Running tasks by owner, off the lease index (only running rows).
select worker_id, count(*)
from {schema}.tasks
where state = 'in_progress'
group by worker_id;

-- name: count_tasks
-- Tasks by state, queue and name. Reads every row (no index holds all
-- three: one would cost every state change an index write).
select state, queue, name, count(*)
from {schema}.tasks
group by state, queue, name
order by state, queue, name;

-- name: count_unfinished
-- Tasks a burst worker would still have to wait for: running, or due
-- pending ones that a claim would take (not paused).
with {part_served}
select count(*) from {schema}.tasks t, served s
where t.queue = any(%(queues)s::text[])
  and t.name = any(%(names)s::text[])
  and (t.state = 'in_progress'
       or (t.state = 'pending'
           and t.run_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
           and t.queue = any(s.queues) and t.name = any(s.names)));

-- name: pause
-- Pause a queue or a task name (again: nothing changes). Whether it was
-- paused now comes back.
insert into {schema}.pauses (kind, name, paused_at)
values (%(kind)s, %(name)s, coalesce(%(now)s::timestamptz, statement_timestamp()))
on conflict (kind, name) do nothing
returning true;

-- name: resume
-- Resume a queue or a task name, and wake the idle workers of the queues
-- it holds back (a queue: itself; a name: each queue with due tasks of it).
with resumed as (
    delete from {schema}.pauses where kind = %(kind)s and name = %(name)s
    returning kind, name
),
woken as (
    select r.name as queue from resumed r where r.kind = 'queue'
    union
    select distinct t.queue from {schema}.tasks t, resumed r
    where r.kind = 'task' and t.state = 'pending' and t.name = r.name
)
select (select count(*) from resumed), (select count(pg_notify({channel}, queue)) from woken);

-- name: list_pauses
select kind, name, paused_at from {schema}.pauses order by kind, name;

-- name: next_run_at
-- The earliest time a pending task of these queues becomes due.
select min(run_at) from {schema}.tasks
where state = 'pending' and queue = any(%(queues)s::text[]);

-- name: register_worker
insert into {schema}.workers (id, host, pid, queues, concurrency, tasks, beat_seconds)
values (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s, %(tasks)s, %(beat_seconds)s)
on conflict (id) do update
set last_seen_at = statement_timestamp(), stopped_at = null,
    queues = excluded.queues, tasks = excluded.tasks, beat_seconds = excluded.beat_seconds;

-- name: stop_worker
update {schema}.workers
set stopped_at = statement_timestamp(), last_seen_at = statement_timestamp()
where id = %(id)s;

-- name: list_workers
select id, host, pid, queues, concurrency, started_at, last_seen_at, stopped_at,
       tasks, beat_seconds
from {schema}.workers
order by started_at desc;

-- name: lock_tasks
-- Lock, in id order, the rows a coroutine poll's completion will touch: its own
-- task, its parent (which the end-of-stream trigger writes) and the
-- recipients of its messages. Every writer that takes more than one of
-- these locks takes them in this order, so two polls messaging each other
-- queue up instead of deadlocking. Each row comes back with its fence
-- (attempt, owner, a live lease at this statement's clock) and the clock:
-- under these locks the fence cannot move, so the completion's effects can be
-- written before the completion itself (a child's last messages then precede
-- the end-of-stream its completion sends).
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
-- The wanted ids are joined, not OR-ed into the filter (an OR with a
-- subquery walks the whole primary key), and parents are found by their
-- children's ids only (a `parent_id is not null` test would walk the index
-- of every child ever spawned).
wanted as (
    select unnest(%(ids)s::bigint[]) as id
    union
    select p.parent_id from {schema}.tasks p  -- a null parent joins nothing
    where p.id = any(%(own)s::bigint[])
)
select t.id, t.attempt, t.worker_id, coalesce(t.lease_expires_at > clock.now, false),
       clock.now
from {schema}.tasks t
join wanted w on w.id = t.id
cross join clock
order by t.id
for no key update of t;

-- name: recipients
-- The recipients of an outside send, in id order: read, not locked, so a
-- busy inbox never keeps its task from being claimed or renewed. The send
-- holds guard_send's locks instead.
select id, state, inbox from {schema}.tasks
where id = any(%(ids)s::bigint[])
order by id;

-- name: guard_send
-- An outside send takes a shared advisory lock per recipient (in id order,
-- before anything else) until it commits; a coroutine poll's completion takes
-- the exclusive one of its own task (guard_endings) before it locks its
-- rows. So a completion waits for the sends already under way, whose messages
-- its `rewake` then sees, and a send that comes later waits for the completion
-- and then finds the task waiting (and wakes it): a message is never left
-- behind a task that suspended without seeing it. Senders never wait for
-- each other, and claims, renewals and other completions take no advisory
-- lock. Advisory locks queue fairly: a stream of sends cannot starve an
-- completion. The two-key space of advisory locks ({lock_space}: this schema's)
-- is apart from the one-key space applications often use; ids are folded
-- into 31 bits (two tasks 2^31 ids apart share a lock: harmless).
select count(pg_advisory_xact_lock_shared({lock_space}, (i.id & 2147483647)::int))
from unnest(%(ids)s::bigint[]) with ordinality as i(id, ord);

-- name: guard_endings
-- The exclusive advisory lock of each completing poll's own task, in id order
-- (see guard_send).
select count(pg_advisory_xact_lock({lock_space}, (i.id & 2147483647)::int))
from unnest(%(ids)s::bigint[]) with ordinality as i(id, ord);

-- name: fence_check
-- The last statement of a poll's completion before its COMMIT, sent in the
-- same flight: fails the transaction, so that none of its effects stays, if
-- a completion whose lease lock_tasks found live (%(ids)s::bigint[],
-- %(attempts)s::int[]) still holds it after finish, which clears every lease
-- it records. Under the row locks this cannot happen; it is checked here
-- because the finish's own rows are read only after the commit. Plain SQL
-- fails with a sentence by casting it to int.
select ('a lease fence moved under its row lock: task ' || t.id || ', attempt ' || t.attempt)::int
from {schema}.tasks t
join unnest(%(ids)s::bigint[], %(attempts)s::int[]) as l(id, attempt)
  on t.id = l.id and t.attempt = l.attempt
where t.worker_id = %(worker_id)s::text
  and t.lease_expires_at > %(now)s::timestamptz;

-- name: sent_keys
-- The messages already sent under these (recipient, idempotency key) pairs;
-- a null message_id is a send under way (it holds the key, uncommitted) or
-- one that delivered nothing.
select m.task_id, m.key, m.message_id
from {schema}.message_keys m
join unnest(%(task_ids)s::bigint[], %(keys)s::text[]) as k(task_id, key)
  on m.task_id = k.task_id and m.key = k.key;

-- name: take_keys
-- Take the idempotency keys of a send: a key taken already (or being taken
-- by a send not yet committed, which this waits for) is skipped; the taken
-- ones come back.
insert into {schema}.message_keys (task_id, key)
select k.task_id, k.key from unnest(%(task_ids)s::bigint[], %(keys)s::text[]) as k(task_id, key)
on conflict (task_id, key) do nothing
returning task_id, key;

-- name: keep_keys
-- Record the message each taken key sent.
update {schema}.message_keys m
set message_id = k.message_id
from unnest(%(task_ids)s::bigint[], %(keys)s::text[], %(message_ids)s::bigint[])
    as k(task_id, key, message_id)
where m.task_id = k.task_id and m.key = k.key;

-- name: deliver
-- Put messages in the inboxes of live coroutine tasks (others are skipped)
-- and wake them: a waiting recipient is pending again, a sleeping one due
-- now (run_at never moves later); idle workers of their queues are told.
-- Callers lock the recipients first (lock_tasks, recipients): a recipient
-- whose poll is completing either sees the message or is woken after it.
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
input as (
    select d.task_id, d.sender_id, d.body, d.trace_context, d.ord
    from unnest(%(task_ids)s::bigint[], %(sender_ids)s::bigint[], %(bodies)s::text[],
                %(traces)s::text[])
        with ordinality as d(task_id, sender_id, body, trace_context, ord)
),
target as materialized (
    select t.id from {schema}.tasks t
    where t.id = any(%(task_ids)s::bigint[])
      and t.inbox and t.state in ('pending', 'in_progress', 'waiting')
),
sent as (
    insert into {schema}.messages (task_id, sender_id, kind, body, created_at, trace_context)
    select i.task_id, i.sender_id, 'message', i.body::jsonb, clock.now, i.trace_context
    from input i, clock
    where i.task_id in (select id from target)
    order by i.ord
    returning id
),
woken as (
    update {schema}.tasks t
    set state = 'pending', run_at = least(t.run_at, clock.now)
    from clock
    where t.id = any(%(task_ids)s::bigint[])  -- the primary key, whatever the statistics
      and t.id in (select id from target)
      and (t.state = 'waiting' or (t.state = 'pending' and t.run_at > clock.now))
    returning t.queue
),
notified as (
    select count(pg_notify({channel}, q.queue)) as n
    from (select distinct queue from woken) as q
)
select s.id from sent s, notified order by s.id;

-- name: first_messages
-- The first messages of newly inserted tasks (they are pending already).
insert into {schema}.messages (task_id, sender_id, kind, body, created_at, trace_context)
select m.task_id, m.sender_id, 'message', m.body::jsonb,
       coalesce(%(now)s::timestamptz, statement_timestamp()), m.trace_context
from unnest(%(task_ids)s::bigint[], %(sender_ids)s::bigint[], %(bodies)s::text[],
            %(traces)s::text[])
    with ordinality as m(task_id, sender_id, body, trace_context, ord)
order by m.ord;

-- name: consume
-- Delete the messages a poll saw (its completion was applied).
delete from {schema}.messages m
using unnest(%(task_ids)s::bigint[], %(ids)s::bigint[]) as c(task_id, id)
where m.id = c.id and m.task_id = c.task_id;

-- name: rewake
-- Polls that ended waiting or sleeping while their inbox holds messages
-- they did not see: due again now.
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
woken as (
    update {schema}.tasks t
    set state = 'pending', run_at = least(t.run_at, clock.now)
    from clock
    where t.id = any(%(ids)s::bigint[])
      and (t.state = 'waiting' or (t.state = 'pending' and t.run_at > clock.now))
      and exists (select 1 from {schema}.messages m where m.task_id = t.id)
    returning t.queue
)
select count(pg_notify({channel}, q.queue))
from (select distinct queue from woken) as q;

-- name: inbox
select id, task_id, sender_id, kind, body::text, created_at, trace_context
from {schema}.messages
where task_id = %(id)s
order by id;

-- name: applied_migrations
-- What opening a store reads first, in one round trip and without DDL: a
-- missing schema or table raises (undefined_table), which says the store
-- is not there; only a version missing here makes anyone run DDL.
select version from {schema}.migrations order by version;

-- name: record_migration
-- The record of a migration, as a reviewed script (migrate --sql) writes it.
insert into {schema}.migrations (version, name) values (%(version)s, %(name)s);

-- name: prune
-- Delete up to %(limit)s::int finished tasks, oldest ids first, of each
-- state whose cutoff is given: finished before it, and no parent still alive
-- (its end message may yet be read). Their attempts (attempts_gone), messages
-- and keys (foreign keys, on delete cascade) go with them; a child left behind keeps
-- running with no parent. One pruner at a time: a transaction-scoped
-- advisory lock, tried, not waited for; `held` false means another worker
-- is pruning and nothing was done.
--
-- A task finishes after it is made, so only tasks made before a cutoff can
-- have finished before it. `search` finds, for each cutoff, the first id
-- made at or after it, by halving the id range (each step one probe of the
-- primary key: about 30 for a billion ids), so that no batch walks the tasks
-- made after the cutoff. Ids follow creation order only roughly (concurrent
-- enqueues draw theirs in any order): a task on the wrong side of the bound
-- is pruned by a later prune, never before its cutoff.
--
-- Each state's tasks below its bound are then read off the listing index
-- (tasks_state_id: state, then id), oldest first, skipping rows locked by
-- anyone; `t.state <> 'in_progress'` lets the planner use that partial index
-- for a state it learns only at run time. The walk reads no task of another
-- state (failed tasks kept two weeks lie below the cutoff of succeeded ones
-- kept a day) and stops at the limit: a full batch reads about as many rows
-- as it deletes, and one that finds nothing to delete reads only the tasks
-- of its state made before the cutoff that are kept (those a live parent
-- keeps, those that finished after it). The walk's limit is a subquery:
-- the planner, not knowing how far below the bound the limit stops the walk,
-- takes it as a tenth of the rows (as under a generic plan); knowing the
-- limit and guessing a third of the table below the bound, it once read all
-- of them and sorted. Without statistics (autovacuum off means no ANALYZE
-- either) a plan that read every finished task and sorted them, each batch,
-- fell behind a drain; plan tests guard against both.
-- A parent is looked at through a scalar subquery, which PostgreSQL runs as
-- one probe of the primary key per candidate: written as `not exists`, it
-- could become a join, and statistics that knew no live task (taken before
-- a backlog came) made it a scan of every live task, read again for each
-- candidate. count_prunable looks at parents the same way.
with recursive guard as (
    select pg_try_advisory_xact_lock({lock_space}, -1) as held
),
search (state, before, lo, hi) as (
    select c.state, c.before, coalesce(e.lo, 0), coalesce(e.hi, 0)
    from unnest(%(states)s::text[], %(befores)s::timestamptz[]) as c(state, before),
         (select min(id) as lo, max(id) + 1 as hi from {schema}.tasks) as e
    union all
    select s.state, s.before,
           case when m.created_at < s.before then least(m.id + 1, s.hi) else s.lo end,
           case when m.created_at < s.before then s.hi else s.lo + (s.hi - s.lo) / 2 end
    from search s
    cross join lateral (
        select n.id, n.created_at from {schema}.tasks n
        where n.id >= s.lo + (s.hi - s.lo) / 2
        order by n.id
        limit 1
    ) as m
    where s.lo < s.hi
),
bounds as (
    select state, before, min(hi) as bound from search group by state, before
),
doomed as materialized (
    select d.id
    from guard, bounds c
    cross join lateral (
        select t.id from {schema}.tasks t
        where t.state = c.state and t.state <> 'in_progress'
          and t.id < c.bound
          and t.finished_at < c.before
          and not coalesce((select p.state in ('pending', 'in_progress', 'waiting')
                            from {schema}.tasks p where p.id = t.parent_id), false)
        order by t.id
        limit (select %(limit)s::int)
        for update of t skip locked
    ) as d
    where guard.held
    limit %(limit)s::int
),
gone as (
    delete from {schema}.tasks t using doomed d where t.id = d.id
    returning t.id
),
-- The attempt log has no foreign key to its task (migration 0004): its rows
-- go here, in the same statement.
attempts_gone as (
    delete from {schema}.attempts a using gone g where a.task_id = g.id
),
workers_gone as (
    delete from {schema}.workers w using guard
    where guard.held and %(workers_before)s::timestamptz is not null
      and coalesce(w.stopped_at, w.last_seen_at) < %(workers_before)s::timestamptz
    returning w.id
)
select (select held from guard), (select count(*) from gone), (select count(*) from workers_gone);

-- name: count_prunable
-- How many finished tasks of each state a prune with these cutoffs would
-- delete, all batches together (a full read of those states' rows).
select t.state, count(*)
from {schema}.tasks t
join unnest(%(states)s::text[], %(befores)s::timestamptz[]) as c(state, before)
  on t.state = c.state and t.finished_at < c.before
where not coalesce((select p.state in ('pending', 'in_progress', 'waiting')
                    from {schema}.tasks p where p.id = t.parent_id), false)
group by t.state
order by t.state;

-- name: count_prunable_workers
-- How many workers a prune with this cutoff would delete.
select count(*) from {schema}.workers
where coalesce(stopped_at, last_seen_at) < %(workers_before)s::timestamptz;

-- name: sync_release
-- Record that a release of schedules synced now (its first sync gives it the
-- next generation), and say whether a newer one supersedes it: a live
-- release (synced within %(lifetime)s seconds) of a greater generation that
-- shares one of its task names, a newer release of the same app. Then the
-- sync writes nothing else.
with synced as (
    insert into {schema}.schedule_releases (release, tasks, seen_at)
    values (%(release)s, %(tasks)s::text[],
            coalesce(%(now)s::timestamptz, statement_timestamp()))
    on conflict (release) do update set seen_at = excluded.seen_at
    returning generation, seen_at
)
select generation,
       exists (select from {schema}.schedule_releases newer
               where newer.generation > synced.generation
                 and newer.seen_at >= synced.seen_at - make_interval(secs => %(lifetime)s)
                 and newer.tasks && %(tasks)s::text[])
from synced;

-- name: part_newer_owner
-- Part of the writes of a sync: the stored schedule's release is live and
-- of a greater generation than the syncing one's (another app's newer
-- release stored that name), so the sync leaves the row alone.
exists (select from {schema}.schedule_releases owner
        where owner.release = {schema}.schedules.release
          and owner.generation > %(generation)s
          and owner.seen_at >= coalesce(%(now)s::timestamptz, statement_timestamp())
                               - make_interval(secs => %(lifetime)s))

-- name: sync_schedule
-- Store a schedule as a release defines it: a new one starts from now (it
-- does not fire for slots before it existed); a changed one keeps its last
-- slot; one a newer live release stored stays as it is, and so does one
-- this release stored already (a running worker's syncs write no row then:
-- synced_at is when its release stored it).
insert into {schema}.schedules
    (name, task, cron, every_seconds, tz, missed, catch_up, args, fingerprint, last_slot,
     synced_at, release)
values (%(name)s, %(task)s, %(cron)s, %(every)s, %(tz)s, %(missed)s, %(catch_up)s,
        %(args)s::jsonb, %(fingerprint)s,
        coalesce(%(now)s::timestamptz, statement_timestamp()),
        coalesce(%(now)s::timestamptz, statement_timestamp()), %(release)s)
on conflict (name) do update
set task = excluded.task, cron = excluded.cron, every_seconds = excluded.every_seconds,
    tz = excluded.tz, missed = excluded.missed, catch_up = excluded.catch_up,
    args = excluded.args, fingerprint = excluded.fingerprint, synced_at = excluded.synced_at,
    release = excluded.release
where ({schema}.schedules.release, {schema}.schedules.fingerprint)
      is distinct from (excluded.release, excluded.fingerprint)
  and not {part_newer_owner};

-- name: drop_schedules
-- Remove the stored schedules of these task names that the syncing release
-- no longer defines (schedules of other apps' task names stay, and so do
-- those a newer live release stored).
delete from {schema}.schedules
where task = any(%(tasks)s::text[]) and not (name = any(%(names)s::text[]))
  and not {part_newer_owner};

-- name: list_schedules
select name, task, cron, every_seconds, tz, missed, catch_up, args::text, fingerprint,
       last_slot, last_task_id, synced_at, release, statement_timestamp()
from {schema}.schedules
order by name;

-- name: store_clock
-- The server's clock: what leases, due times and heartbeats are read by.
select statement_timestamp();

-- name: fire_schedule
-- Take the slots %(first)s to %(last)s of a schedule whose stored definition
-- is this worker's (its fingerprint) and that no one fired yet: the row
-- lock makes concurrent fires of one schedule take turns, and the second
-- finds last_slot moved on. A row back: these slots are this caller's to
-- enqueue, in the same transaction.
update {schema}.schedules
set last_slot = %(last)s::timestamptz
where name = %(name)s and fingerprint = %(fingerprint)s
  and (last_slot is null or last_slot < %(first)s::timestamptz)
returning name;

-- name: fired_task
update {schema}.schedules set last_task_id = %(task_id)s where name = %(name)s;

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

-- name: delete_task
-- Delete a task that is not in progress, with its attempts, messages and
-- keys (on delete cascade); an unfinished one only if no parent of it is
-- alive (the parent waits for its end). Its id back, or no row.
with gone as (
    delete from {schema}.tasks t
    where t.id = %(id)s and t.state <> 'in_progress'
      and (t.state in ('succeeded', 'failed', 'cancelled')
           or not exists (select 1 from {schema}.tasks p
                          where p.id = t.parent_id
                            and p.state in ('pending', 'in_progress', 'waiting')))
    returning t.id
),
-- The attempt log has no foreign key to its task (migration 0004).
attempts_gone as (
    delete from {schema}.attempts a using gone g where a.task_id = g.id
)
select id from gone;

-- name: delete_blocker
-- Why delete_task deleted nothing: the task's state and its parent's.
select t.state, p.state
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

-- name: retry_many
-- One batch of a bulk retry: up to %(limit)s selected tasks (failed or
-- cancelled), oldest first, pending again now with a fresh budget (as
-- retry); rows locked by others are passed by. The ids moved, and their
-- queues' idle workers told. FOR NO KEY UPDATE re-reads a row another
-- transaction changed before it is locked, so the filter holds at the write.
with chosen as materialized (
    select t.id from {schema}.tasks t
    where {part_selected}
    order by t.id
    limit %(limit)s::int
    for no key update of t skip locked
),
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
with chosen as materialized (
    select t.id from {schema}.tasks t
    where {part_selected}
    order by t.id
    limit %(limit)s::int
    for no key update of t skip locked
),
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
-- ones only: no parent waits for them), oldest first, with their attempts,
-- messages and keys, as delete_task. It locks each row first and re-reads
-- it: a task retried meanwhile is not deleted; rows locked by others (a
-- retry, a prune under way) are passed by. The ids deleted.
with chosen as materialized (
    select t.id from {schema}.tasks t
    where {part_selected}
      and t.state in ('succeeded', 'failed', 'cancelled')
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

-- name: keys_waiting
-- Whether any concurrency key has pending tasks (a row of its own): only
-- then does a worker run the keyed claim.
select exists (select 1 from {schema}.concurrency);

-- name: lock_keys
-- The first statement of a keyed claim: lock up to %(key_scan)s key rows,
-- those claimed from longest ago first (every key gets its turn), passing by
-- keys another claim, or a writer making a task of the key pending, holds.
select c.key from {schema}.concurrency c
order by c.claimed_at nulls first, c.key
limit %(key_scan)s::int
for update skip locked;

-- name: claim_keyed
-- The second statement of a keyed claim, its snapshot taken after the key
-- rows %(keys)s were locked: up to %(limit)s due pending tasks of those
-- keys, each key at most its room (max_running less its running tasks, read
-- off tasks_running_keyed), in claim order, started as the plain claim
-- starts its tasks. The keys claimed from are marked (their turn comes
-- last next time, and take the limit of their newest claimed task); keys
-- with no pending task left lose their row.
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
{part_served},
bucket as materialized (
    select c.key, c.max_running, c.rate_limit,
           least(c.rate_limit::float8,
                 c.tokens + extract(epoch from clock.now - c.refilled_at)
                            * c.rate_limit / c.rate_period) as tokens
    from {schema}.concurrency c, clock
    where c.key = any(%(keys)s::text[])
),
-- A running task counts against its key's room unless its lease expired
-- with nothing left to run (the next sweep ends it; it may write nothing).
open_keys as materialized (
    select b.key, b.tokens,
           least(b.max_running - (select count(*) from {schema}.tasks r, clock
                                  where r.concurrency_key = b.key and r.state = 'in_progress'
                                    and not (r.lease_expires_at <= clock.now
                                             and (r.cancel_requested
                                                  or r.spent >= r.max_attempts))),
                 coalesce(floor(b.tokens)::bigint, %(limit)s::int)) as room
    from bucket b
),
keyed_due as materialized (
    select p.id, p.priority, p.run_at, k.key
    from open_keys k
    cross join served s
    cross join lateral (
        select t.id, t.priority, t.run_at
        from {schema}.tasks t, clock
        where t.concurrency_key = k.key
          and t.state = 'pending'
          and t.run_at <= clock.now
          and t.queue = any(s.queues)
          and t.name = any(s.names)
          and t.attempt <= 2147483645 and t.spent <= 2147483645  -- see quarantine
        order by t.priority desc, t.run_at, t.id
        limit greatest(least(k.room, %(limit)s::int), 0)
        for no key update of t skip locked
    ) as p
),
chosen as (
    select id from keyed_due
    order by priority desc, run_at, id
    limit %(limit)s::int
),
{part_claimed},
marked as (
    update {schema}.concurrency c
    set claimed_at = clock.now,
        max_running = coalesce(
            (select coalesce(t.concurrency_limit, 1000000) from claimed t
             where t.concurrency_key = c.key order by t.id desc limit 1),
            c.max_running),
        tokens = o.tokens - (select count(*) from claimed t where t.concurrency_key = c.key),
        refilled_at = case when c.rate_limit is null then null else clock.now end
    from clock, open_keys o
    where o.key = c.key
      and c.key in (select d.key from keyed_due d join chosen x on x.id = d.id)
),
emptied as (
    delete from {schema}.concurrency c
    using open_keys o
    where o.key = c.key
      and c.key not in (select d.key from keyed_due d)
      and (c.rate_limit is null or o.tokens >= c.rate_limit)
      and not exists (select 1 from {schema}.tasks t
                      where t.concurrency_key = c.key and t.state = 'pending')
)
select id, attempt, name, queue, payload, spent, max_attempts, retry_policy,
       timeout_seconds, lease_seconds, lease_expires_at, step, parent_id, run_at, trace_context,
       {part_claim_inbox}
from claimed
order by priority desc, run_at, id;

-- name: tables_to_vacuum
-- This schema's tables whose dead rows the server will not vacuum away: its
-- autovacuum is off (for the server, or the table), and they hold more dead
-- rows than 10,000 plus a twentieth of the live ones (autovacuum's default
-- is 50 plus a fifth: a queue's churn makes a larger base more sensible, and
-- a claim steps over the pending index's dead entries until a vacuum, so
-- history must not put the vacuum off; migration 0016 sets a twentieth for
-- autovacuum on `tasks` too).
select s.relname
from pg_stat_user_tables s
join pg_class c on c.oid = s.relid
where s.schemaname = %(schema)s::text
  and s.n_dead_tup > 10000 + 0.05 * s.n_live_tup
  and (current_setting('autovacuum') = 'off'
       or 'autovacuum_enabled=false' = any(coalesce(c.reloptions, array[]::text[])))
order by s.n_dead_tup desc;

-- name: queue_backlogs
-- Pending tasks by queue: due now, due later, and the oldest due run time.
select t.queue,
       count(*) filter (where t.run_at <= c.now) as due,
       count(*) filter (where t.run_at > c.now) as later,
       min(t.run_at) filter (where t.run_at <= c.now) as oldest_due_at
from {schema}.tasks t,
     (select coalesce(%(now)s::timestamptz, statement_timestamp()) as now) c
where t.state = 'pending'
group by t.queue
order by t.queue;

-- name: activity
-- Succeeded and failed tasks by the bucket of their finish time (bucket n
-- covers [since + n * bucket, since + (n + 1) * bucket)). No index holds
-- finish times, and one would cost every claim and finish a write: this
-- reads the newest %(scan)s tasks of each state off the state index, a
-- bounded read whatever the table holds.
select floor(extract(epoch from (f.finished_at - %(since)s::timestamptz))
             / %(bucket)s::integer)::bigint as bucket,
       count(*) filter (where f.state = 'succeeded'),
       count(*) filter (where f.state = 'failed')
from ((select state, finished_at from {schema}.tasks where state = 'succeeded'
       order by id desc limit %(scan)s::integer)
      union all
      (select state, finished_at from {schema}.tasks where state = 'failed'
       order by id desc limit %(scan)s::integer)) as f
where f.finished_at >= %(since)s::timestamptz
group by 1
order by 1;

-- name: key_holders
-- The running tasks of one concurrency key (tasks_running_keyed), lowest id first.
select id from {schema}.tasks
where concurrency_key = %(key)s::text and state = 'in_progress'
order by id
limit %(limit)s::integer;

-- name: list_keys
-- The concurrency keys that hold tasks back: those with pending tasks or a
-- rate bucket still refilling (a row left with neither waits for the next
-- keyed claim to drop it), with their running and pending tasks (counted
-- off their indexes) and their rate bucket now, by key.
with clock as (select coalesce(%(now)s::timestamptz, statement_timestamp()) as now),
bucket as (
    select c.key, c.max_running, c.rate_limit, c.rate_period,
           least(c.rate_limit::float8,
                 c.tokens + extract(epoch from clock.now - c.refilled_at)
                            * c.rate_limit / c.rate_period) as tokens,
           clock.now,
           (select count(*) from {schema}.tasks r
            where r.concurrency_key = c.key and r.state = 'in_progress') as running,
           (select count(*) from {schema}.tasks p
            where p.concurrency_key = c.key and p.state = 'pending') as pending
    from {schema}.concurrency c, clock
)
select b.key, b.max_running, b.running, b.pending, b.rate_limit, b.rate_period, b.tokens,
       case when b.tokens < 1
            then b.now + make_interval(secs => (1 - b.tokens) * b.rate_period / b.rate_limit)
       end
from bucket b
where b.pending > 0 or b.tokens < b.rate_limit
order by b.key
limit %(limit)s::int;

-- name: turn_take
-- Waits for the wake-up turn of one kind of worker (%(kind)s: a 32-bit key
-- drawn from its queues and task names), a session lock held until
-- turn_give or the session's end; waiters are granted in turn (see
-- conveyor.backends.postgres.turns). The first key keeps these locks apart
-- from the schema's others.
select pg_advisory_lock(({lock_space} # 2), %(kind)s::int);

-- name: turn_give
select pg_advisory_unlock(({lock_space} # 2), %(kind)s::int);
