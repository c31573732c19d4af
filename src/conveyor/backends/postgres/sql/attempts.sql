-- The attempt lifecycle: claims (with the reclaim of expired leases),
-- quarantine, heartbeats and finishes.
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

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
-- whole table for them. Its first columns are a claim's row (see
-- conveyor.backends.stored.claimed_task), the 16th the task's expiry time
-- when this is its first attempt and it starts past it, the 17th what it
-- receives of its dependencies; then the columns the claims order and count
-- keys by.
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
              t.lease_seconds, t.lease_expires_at, t.step, t.parent_id, t.run_at,
              t.trace_context,
              case when t.attempt = 1 and t.expires_at <= clock.now then t.expires_at end
                  as expired_at,
              t.receives, t.priority, t.concurrency_key, t.concurrency_limit
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
       expired_at, receives, {part_claim_inbox},
       w.keys_waiting
from (select exists (select 1 from {schema}.concurrency) as keys_waiting) as w
left join claimed on true
order by priority desc, run_at, id;

-- name: end_expired
-- The expired leases of the worker's queues and names that must not run
-- again: the task's attempts are spent (the crash budget) or its
-- cancellation was requested. Each task ends now (failed, cancelled: all of
-- them, whatever the claim's limit), and the attempt its lease lost is
-- logged as lease_lost, with the reason. The claims that take back expired
-- leases (claim_reclaim, and the keyed claim beside it) run right after, in
-- statements of their own: what these ends move by trigger (a dependent
-- released, a parent woken by its child's end) is then due for them, as in
-- every backend. Within the claim's own statement it was not (a statement
-- reads the rows as they were when it began, not as its own writes left
-- them), and the claim took a task fewer than it could.
-- {text:crash_budget_spent} reads the columns spent and max_attempts (of
-- exhausted, the only table where it is used).
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now
),
{part_served},
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
-- The conflict arm serves an attempt logged at its claim, as before
-- migration 0005, whose row is still open.
lost as (
    insert into {schema}.attempts as a
        (task_id, number, worker_id, outcome, started_at, finished_at, error_type,
         error_message, step)
    select x.id, x.attempt, x.worker_id, 'lease_lost',
           coalesce(x.attempt_started_at, clock.now), clock.now, {text:lease_expired_error},
           case when x.cancel_requested
                then {text:cancelled_meanwhile}
                else {text:crash_budget_spent}
           end,
           x.step
    from exhausted x, clock
    on conflict (task_id, number) do update
    set outcome = excluded.outcome,
        finished_at = excluded.finished_at,
        error_type = excluded.error_type,
        error_message = excluded.error_message
    where a.outcome = 'in_progress'
)
select count(*) from ended;

-- name: claim_reclaim
-- claim, and take back expired leases: up to %(limit)s::int tasks in one
-- statement, due pending tasks of the worker's queues and names plus
-- in-progress tasks whose lease expired and that may run again (those that
-- may not were ended by end_expired, just before),
-- merged in claim order (priority, run_at, id). Every candidate set sits
-- behind a MATERIALIZED CTE: an optimisation fence, without which the
-- planner may lock more rows than the LIMIT asks for. The attempt each
-- reclaimed lease lost is logged as lease_lost in the same statement. The
-- running attempt is not logged at
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
-- The attempt each reclaimed task's expired lease lost. The conflict arm
-- serves an attempt logged at its claim, as before migration 0005, whose
-- row is still open.
lost as (
    insert into {schema}.attempts as a
        (task_id, number, worker_id, outcome, started_at, finished_at, error_type,
         error_message, step)
    select e.id, e.attempt, e.worker_id, 'lease_lost',
           coalesce(e.attempt_started_at, clock.now), clock.now, {text:lease_expired_error},
           {text:lease_expired}, e.step
    from expired e, clock
    where e.id in (select id from claimed)
    on conflict (task_id, number) do update
    set outcome = excluded.outcome,
        finished_at = excluded.finished_at,
        error_type = excluded.error_type,
        error_message = excluded.error_message
    where a.outcome = 'in_progress'
)
-- In claim order, like every backend: the claimed rows whole (their last
-- three columns are left out by the caller; naming the others would take
-- this statement over psycopg's 4 KiB of cached statement).
select * from claimed
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

-- name: report_progress
-- Store each progress report on its task where the report's lease is live
-- (the heartbeat's fence: this attempt, this worker, not expired), with the
-- store's clock as its time. A row locked by a commit in flight (its attempt
-- is ending) is skipped, not waited for: a report is a hint. Returns the
-- lease tokens whose report was stored. For the planner, the fence is
-- written as join conditions of the input, as in heartbeat.
with clock as (
    select coalesce(%(now)s::timestamptz, statement_timestamp()) as now,
           %(worker_id)s::text as worker_id
),
reports as materialized (
    select r.id, r.attempt, r.progress, clock.now, clock.worker_id
    from unnest(%(ids)s::bigint[], %(attempts)s::int[], %(progress)s::text[])
             as r(id, attempt, progress), clock
),
free as materialized (
    select t.id
    from {schema}.tasks t
    join reports r on t.id = r.id
    where t.id = any(%(ids)s::bigint[])
      and t.attempt = r.attempt
      and t.worker_id = r.worker_id
      and t.lease_expires_at > r.now
    for no key update of t skip locked
)
update {schema}.tasks t
set progress = r.progress, progress_at = r.now
from free f
join reports r on r.id = f.id
where t.id = f.id
returning t.id, t.attempt;

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
