-- Inboxes: outside sends (their locks and idempotency keys), deliveries,
-- a poll's completion (its locks and fence), consumption and rewakes.
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

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
