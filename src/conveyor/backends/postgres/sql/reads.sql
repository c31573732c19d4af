-- The inspector's reads: tasks, attempts, listings and summaries, counts,
-- backlogs, activity and concurrency keys. They change nothing.
--
-- Named blocks of the PostgreSQL backend; what their placeholders stand for is
-- said once, in conveyor.backends.postgres.statements.

-- name: task_state
select state from {schema}.tasks where id = %(id)s;

-- name: get_task
-- A task's columns (as part_listed's), then how many of its dependencies
-- have not ended (null: it has none), and its latest progress report and
-- when it was stored.
select id, name, queue, payload::text as payload, state, priority, run_at, attempt,
       max_attempts, retry_policy::text as retry_policy, timeout_seconds, lease_seconds,
       result::text as result, created_at, finished_at,
       case when state = 'in_progress' then worker_id end as worker_id, lease_expires_at,
       cancel_requested, step, parent_id, inbox, idempotency_key, concurrency_key, waiting_for,
       progress, progress_at
from {schema}.tasks
where id = %(id)s::bigint;

-- name: dependencies
-- A task's dependencies in the order given: each edge, whether it was
-- settled, and the task waited for (null columns: no longer stored) with
-- its latest ended attempt's outcome and error (stored.dependency_record
-- decides what of them to report).
select e.depends_on, e.settled, t.name, t.state, t.result::text,
       a.outcome, a.error_type, a.error_message
from {schema}.dependencies e
left join {schema}.tasks t on t.id = e.depends_on
left join lateral (
    select l.outcome, l.error_type, l.error_message
    from {schema}.attempt_log l
    where l.task_id = t.id
    order by l.number desc
    limit 1
) as a on true
where e.task_id = %(id)s::bigint
order by e.position;

-- name: edges
-- Every edge whose dependent or dependency is among %(ids)s, each once, by
-- dependent then position: the dependents' side off the edges' primary key,
-- the dependencies' side off dependencies_depends_on. An edge to a task no
-- longer stored (depends_on has no foreign key) is found from its
-- dependent's side only, as the stores without such rows find it.
select e.task_id, e.position, e.depends_on, e.settled
from {schema}.dependencies e
where e.task_id = any(%(ids)s::bigint[])
union
select e.task_id, e.position, e.depends_on, e.settled
from {schema}.dependencies e
where e.depends_on = any(%(ids)s::bigint[])
  and exists (select 1 from {schema}.tasks t where t.id = e.depends_on)
order by 1, 2;

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

-- name: summaries
-- The stored tasks among %(ids)s, as summaries, highest id first: each id
-- off the primary key.
with page as materialized (
    select id from {schema}.tasks where id = any(%(ids)s::bigint[])
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

-- name: store_clock
-- The server's clock: what leases, due times and heartbeats are read by.
select statement_timestamp();
