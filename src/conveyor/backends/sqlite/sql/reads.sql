-- The inspector's reads: tasks, attempts, listings and summaries, counts,
-- backlogs, activity and concurrency keys. They change nothing.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: task_state
select state from conveyor_tasks where id = :id;

-- name: get_task
select id, name, queue, payload, state, priority, run_at, attempt, max_attempts,
       retry_policy, timeout_seconds, lease_seconds, result, created_at, finished_at,
       worker_id, lease_expires_at, cancel_requested, step, parent_id, inbox, idempotency_key,
       concurrency_key, waiting_for, progress, progress_at
from conveyor_tasks
where id = :id;

-- name: dependencies
-- A dependent's edges in the order given, each with its dependency as it is
-- now (null columns: no longer stored) and the latest ended attempt of it.
select e.task_id, e.settled_at is not null, t.name, t.state, t.result,
       a.outcome, a.error_type, a.error_message
from conveyor_dependencies e
left join conveyor_tasks t on t.id = e.task_id
left join conveyor_attempts a on a.task_id = e.task_id and a.number = (
    select max(l.number) from conveyor_attempts l
    where l.task_id = e.task_id and l.finished_at is not null)
where e.dependent_id = :id
order by e.position;

-- name: edges
-- Every edge whose dependent or dependency is among :ids (a JSON array),
-- each once, by dependent then position: the dependents' side off the
-- edges' primary key, the dependencies' side off conveyor_dependencies_task.
-- An edge to a task no longer stored (task_id has no foreign key) is found
-- from its dependent's side only, as the stores without such rows find it.
select e.dependent_id, e.position, e.task_id, e.settled_at is not null
from conveyor_dependencies e
where e.dependent_id in (select value from json_each(:ids))
union
select e.dependent_id, e.position, e.task_id, e.settled_at is not null
from conveyor_dependencies e
where e.task_id in (select value from json_each(:ids))
  and exists (select 1 from conveyor_tasks t where t.id = e.task_id)
order by 1, 2;

-- name: get_attempts
select task_id, number, worker_id, outcome, started_at, finished_at, error_type,
       error_message, traceback, step
from conveyor_attempts
where task_id = :id
order by number;

-- name: list_tasks
-- Newest first, each filter optional.
select id, name, queue, payload, state, priority, run_at, attempt, max_attempts,
       retry_policy, timeout_seconds, lease_seconds, result, created_at, finished_at,
       worker_id, lease_expires_at, cancel_requested, step, parent_id, inbox, idempotency_key,
       concurrency_key, waiting_for, progress, progress_at
from conveyor_tasks
where (:state is null or state = :state)
  and (:name is null or name = :name)
  and (:queue is null or queue = :queue)
  and (:before is null or id < :before)
order by id desc
limit :limit;

-- name: list_children
-- A parent's children, newest first, off its index of children.
select id, name, queue, payload, state, priority, run_at, attempt, max_attempts,
       retry_policy, timeout_seconds, lease_seconds, result, created_at, finished_at,
       worker_id, lease_expires_at, cancel_requested, step, parent_id, inbox, idempotency_key,
       concurrency_key, waiting_for, progress, progress_at
from conveyor_tasks indexed by conveyor_tasks_parent
where parent_id = :parent
  and (:state is null or state = :state)
  and (:name is null or name = :name)
  and (:queue is null or queue = :queue)
  and (:before is null or id < :before)
order by id desc
limit :limit;

-- name: part_summarized
-- The columns of a task's summary, for the ids of the page `page` names: the task's narrow columns (no
-- payload, no result) and, for a task not running that did not succeed,
-- its latest attempt, found by key (the last row of its log).
select t.id, t.name, t.queue, t.state, t.priority, t.run_at, t.attempt, t.max_attempts,
       t.created_at, t.finished_at,
       case when t.state = 'in_progress' then t.worker_id end, t.cancel_requested, t.step,
       e.outcome, substr(e.error_type, 1, :error_chars), substr(e.error_message, 1, :error_chars)
from page
join conveyor_tasks t on t.id = page.id
left join conveyor_attempts e
  on t.state not in ('in_progress', 'succeeded')
 and e.task_id = t.id
 and e.number = (select max(a.number) from conveyor_attempts a where a.task_id = t.id)
order by t.id desc

-- name: part_summary_filter
-- The optional filters of a summarized listing besides its state and parent.
(:name is null or name = :name)
and (:queue is null or queue = :queue)
and id < coalesce(:before, 9223372036854775807)

-- name: list_summaries
-- What list_tasks lists (no state, no parent), as summaries. The page's
-- ids come first, newest first down the table's rowids, in a CTE of their
-- own; only then are the other columns of those rows read, so no wide row
-- is read for a row the page leaves out, whatever the plan.
with page as materialized (
    select id from conveyor_tasks
    where {part_summary_filter}
    order by id desc
    limit :limit
)
{part_summarized};

-- name: list_summaries_in_state
-- The same for one state, off the listing index (state, id desc).
with page as materialized (
    select id from conveyor_tasks indexed by conveyor_tasks_state_id
    where state = :state and {part_summary_filter}
    order by id desc
    limit :limit
)
{part_summarized};

-- name: list_child_summaries
-- What list_children lists, as summaries (see list_summaries).
with page as materialized (
    select id from conveyor_tasks indexed by conveyor_tasks_parent
    where parent_id = :parent
      and (:state is null or state = :state)
      and {part_summary_filter}
    order by id desc
    limit :limit
)
{part_summarized};

-- name: summaries
-- The stored tasks among :ids (a JSON array), as summaries, highest id
-- first: each id off the rowids.
with page as materialized (
    select id from conveyor_tasks where id in (select value from json_each(:ids))
)
{part_summarized};

-- name: running_by_worker
-- Running tasks by owner, off the lease index (running rows only).
select worker_id, count(*)
from conveyor_tasks indexed by conveyor_tasks_in_progress_lease
where state = 'in_progress'
group by worker_id;

-- name: count_tasks
-- Tasks by state, queue and name (reads every row).
select state, queue, name, count(*)
from conveyor_tasks
group by state, queue, name
order by state, queue, name;

-- name: count_unfinished
-- Tasks a burst worker would still have to wait for: running, or due
-- pending ones that a claim would take (not paused).
select count(*) from conveyor_tasks
where queue in (select value from json_each(:queues))
  and name in (select value from json_each(:names))
  and (state = 'in_progress'
       or (state = 'pending' and run_at <= :now
           and queue not in (select name from conveyor_pauses where kind = 'queue')
           and name not in (select name from conveyor_pauses where kind = 'task')));

-- name: queue_backlogs
-- Pending tasks by queue: due now, due later, and the oldest due run time.
select queue, sum(run_at <= :now), sum(run_at > :now),
       min(case when run_at <= :now then run_at end)
from conveyor_tasks
where state = 'pending'
group by queue
order by queue;

-- name: activity
-- Succeeded and failed tasks by the bucket of their finish time (bucket n
-- covers [since + n * bucket, since + (n + 1) * bucket)), times in epoch
-- seconds. No index holds finish times: this reads the newest :scan tasks
-- of each state off the state index (see the PostgreSQL statement).
select cast((f.finished_at - :since) / :bucket as integer) as bucket,
       sum(f.state = 'succeeded'),
       sum(f.state = 'failed')
from (select * from (select state, finished_at from conveyor_tasks
                     where state = 'succeeded' order by id desc limit :scan)
      union all
      select * from (select state, finished_at from conveyor_tasks
                     where state = 'failed' order by id desc limit :scan)) as f
where f.finished_at >= :since
group by 1
order by 1;

-- name: key_holders
-- The running tasks of one concurrency key, lowest id first.
select id from conveyor_tasks
where concurrency_key = :key and state = 'in_progress'
order by id
limit :limit;

-- name: list_keys
-- The concurrency keys that hold tasks back, with their running and pending
-- tasks and their rate bucket now (see the PostgreSQL statement), by key.
select * from (
    select c.key, c.max_running,
           (select count(*) from conveyor_tasks r indexed by conveyor_tasks_running_keyed
            where r.concurrency_key = c.key and r.state = 'in_progress') as running,
           (select count(*) from conveyor_tasks p indexed by conveyor_tasks_pending_keyed
            where p.concurrency_key = c.key and p.state = 'pending') as pending,
           c.rate_limit, c.rate_period,
           case when c.rate_limit is null then null
                else min(c.rate_limit * 1.0,
                         c.tokens + (:now - c.refilled_at) * c.rate_limit / c.rate_period)
           end as tokens
    from conveyor_concurrency c
)
where pending > 0 or tokens < rate_limit
order by key
limit :limit;
