-- Every statement of the SQLite backend, as named blocks.
--
-- Every write runs inside BEGIN IMMEDIATE: SQLite has one writer at a time,
-- and taking the write lock first (waiting up to busy_timeout for it) means
-- a transaction never has to upgrade a read lock, which could fail at once
-- with SQLITE_BUSY. With one writer there is nothing to skip: no SKIP LOCKED.
--
-- :now is the clock of the transaction, read once from SQLite by `clock`
-- (tests pass a time to move it without sleeping). Lists travel as JSON
-- arrays and are unpacked with json_each. {text:NAME} is a text every
-- backend writes alike (an error type of the attempt log,
-- conveyor.backends.stored.SQL_TEXTS), composed in at load as an SQL
-- literal; the messages come from the same module as parameters.

-- name: clock
-- Seconds since the epoch: SQLite's own clock unless a test injects one.
select coalesce(:now, (julianday('now') - 2440587.5) * 86400.0);

-- name: enqueue
-- One task; run many times in one transaction (executemany).
insert into conveyor_tasks
    (name, queue, payload, priority, run_at, max_attempts, retry_policy,
     timeout_seconds, lease_seconds, created_at, step, inbox, parent_id, idempotency_key,
     concurrency_key, concurrency_limit, rate_limit, rate_period, trace_context)
values (:name, :queue, :payload, :priority, coalesce(:run_at, :now + :delay), :max_attempts,
        :retry_policy, :timeout, :lease, :now, :step, :inbox, :parent_id, :idempotency_key,
        :concurrency_key, :concurrency_limit, :rate_limit, :rate_period, :trace);

-- name: enqueue_keyed
-- One task that may carry an idempotency key: skipped when its name and key
-- are stored already (then stored_key reads the stored task's id).
insert into conveyor_tasks
    (name, queue, payload, priority, run_at, max_attempts, retry_policy,
     timeout_seconds, lease_seconds, created_at, step, inbox, parent_id, idempotency_key,
     unique_scope, unique_until, concurrency_key, concurrency_limit, rate_limit, rate_period,
     trace_context)
values (:name, :queue, :payload, :priority, coalesce(:run_at, :now + :delay), :max_attempts,
        :retry_policy, :timeout, :lease, :now, :step, :inbox, :parent_id, :idempotency_key,
        :unique_scope, :now + :unique_for, :concurrency_key, :concurrency_limit, :rate_limit,
        :rate_period, :trace)
on conflict (name, idempotency_key) where idempotency_key is not null do nothing
returning id;

-- name: stored_key
-- The task holding a unique key, and whether its period is over (then
-- release_key frees the key for the enqueue that wants it).
select id, coalesce(unique_until <= :now, 0), state
from conveyor_tasks where name = :name and idempotency_key = :idempotency_key;

-- name: release_key
update conveyor_tasks set idempotency_key = null where id = :id;

-- name: replace_pending
-- on_conflict "replace": a pending holder takes the enqueue's payload,
-- priority and due time.
update conveyor_tasks
set payload = :payload, priority = :priority, run_at = coalesce(:run_at, :now + :delay)
where id = :id and state = 'pending'
returning queue;

-- name: end_expired
-- Expired leases that must not run again: the crash budget is spent or a
-- cancel was requested. The task ends here; close_lost_attempt closes its
-- attempt next.
update conveyor_tasks indexed by conveyor_tasks_in_progress_lease
set state = case when cancel_requested then 'cancelled' else 'failed' end,
    worker_id = null,
    lease_expires_at = null,
    finished_at = :now
where state = 'in_progress'
  and lease_expires_at <= :now
  and (cancel_requested or spent >= max_attempts)
  and queue in (select value from json_each(:queues))
  and name in (select value from json_each(:names))
returning id, state, spent, max_attempts;

-- name: claim_due
-- The head of one queue's due pending tasks, in claim order. INDEXED BY
-- pins the partial claim index: it holds only pending rows, already in
-- claim order, so this reads about :limit rows however long the queue or
-- the history is (without statistics the planner would pick the state
-- index and sort every pending row). The backend runs it once per queue.
select id, state, priority, run_at from conveyor_tasks indexed by conveyor_tasks_pending_claim
where state = 'pending'
  and concurrency_key is null  -- keyed tasks: claim_keyed
  and queue = :queue
  and run_at <= :now
  and name in (select value from json_each(:names))
  and attempt <= 2147483645 and spent <= 2147483645  -- see quarantine
order by priority desc, run_at, id
limit :limit;

-- name: claim_expired
-- In-progress tasks whose lease expired and that may run again (end_expired
-- has already ended the others), in claim order, from the lease index (few
-- rows are in progress, so sorting them is cheap).
select id, state, priority, run_at from conveyor_tasks indexed by conveyor_tasks_in_progress_lease
where state = 'in_progress'
  and lease_expires_at <= :now
  and queue in (select value from json_each(:queues))
  and name in (select value from json_each(:names))
  and attempt <= 2147483645 and spent <= 2147483645  -- see quarantine
order by priority desc, run_at, id
limit :limit;

-- name: quarantine_find
-- Tasks the claims pass by because a counter stands at the limit (only a
-- row written around conveyor gets there): due, or with an expired lease,
-- in the worker's queues and names. quarantine_end ends each one failed and
-- quarantine_log says why in its attempt log, so it neither blocks its
-- queue nor hides in it.
select id, attempt, spent, state from conveyor_tasks indexed by conveyor_tasks_unclaimable
where state in ('pending', 'in_progress') and (attempt > 2147483645 or spent > 2147483645)
  and ((state = 'pending' and run_at <= :now)
       or (state = 'in_progress' and lease_expires_at <= :now))
  and queue in (select value from json_each(:queues))
  and name in (select value from json_each(:names));

-- name: quarantine_end
update conveyor_tasks
set state = 'failed', worker_id = null, lease_expires_at = null, finished_at = :now
where id = :task_id;

-- name: quarantine_log
-- The open attempt of a task that was running is closed with the reason; a
-- pending one gets an attempt row of its own for it.
insert into conveyor_attempts
    (task_id, number, worker_id, outcome, started_at, finished_at, error_type, error_message)
values (:task_id, :number, :worker_id, 'failed', :now, :now, {text:corrupt_task_error}, :message)
on conflict (task_id, number) do update
set outcome = excluded.outcome, finished_at = excluded.finished_at,
    error_type = excluded.error_type, error_message = excluded.error_message;

-- name: claim_take
-- Hand the picked tasks to the worker under a fresh lease.
update conveyor_tasks
set state = 'in_progress',
    attempt = attempt + 1,
    spent = spent + 1,
    worker_id = :worker_id,
    lease_expires_at = :now + coalesce(lease_seconds, :lease)
where id in (select value from json_each(:ids))
returning id, attempt, name, queue, payload, spent, max_attempts, retry_policy,
          timeout_seconds, lease_seconds, lease_expires_at, step, parent_id, run_at,
          trace_context;

-- name: claim_log
-- One attempt row per claimed task, in the same transaction as the claim.
insert into conveyor_attempts (task_id, number, worker_id, started_at, step)
select id, attempt, :worker_id, :now, step from conveyor_tasks
where id in (select value from json_each(:ids));

-- name: heartbeat_seen
update conveyor_workers set last_seen_at = :now where id = :worker_id;

-- name: heartbeat
-- Renew every lease the worker still holds, fenced by the lease token and a
-- live lease: an expired lease is not renewed (it may have been reclaimed).
-- :leases is a JSON array of [id, attempt] pairs.
update conveyor_tasks
set lease_expires_at = :now + coalesce(lease_seconds, :lease)
from (select json_extract(value, '$[0]') as id, json_extract(value, '$[1]') as attempt
      from json_each(:leases)) as l
where conveyor_tasks.id = l.id
  and conveyor_tasks.attempt = l.attempt
  and conveyor_tasks.worker_id = :worker_id
  and conveyor_tasks.lease_expires_at > :now
returning conveyor_tasks.id, conveyor_tasks.attempt, conveyor_tasks.cancel_requested;

-- name: finish
-- Record many attempt completions, each fenced by its lease token and a live
-- lease; a late write from a lost lease changes nothing and is missing from
-- the result. A task whose cancel was requested is not made pending or
-- waiting again. A completion with a new state (a workflow's next step, a
-- coroutine's poll) stores it, its options and run time, with a fresh budget.
-- Each row says whether its task is due at once, or held a concurrency
-- key's slot that is free now (either way its queue's idle workers are
-- woken; other processes see the commit). :completions is a JSON array of objects (see rows.completions_json).
update conveyor_tasks
set state = case when conveyor_tasks.cancel_requested and i.state in ('pending', 'waiting')
                 then 'cancelled' else i.state end,
    result = case when i.state = 'succeeded' then i.result else conveyor_tasks.result end,
    run_at = case when i.state = 'pending' and not conveyor_tasks.cancel_requested
                  then coalesce(i.run_at, :now + coalesce(i.delay, 0))
                  else conveyor_tasks.run_at end,
    spent = case when i.step_state is not null then 0
                 else conveyor_tasks.spent - (i.outcome = 'interrupted') end,
    -- A new state: the next step (none for a coroutine), the state, its options.
    step = case when i.step_state is not null then i.step else conveyor_tasks.step end,
    payload = coalesce(i.step_state, conveyor_tasks.payload),
    max_attempts = coalesce(i.max_attempts, conveyor_tasks.max_attempts),
    retry_policy = coalesce(i.retry_policy, conveyor_tasks.retry_policy),
    timeout_seconds = case when i.step_state is not null then i.timeout_seconds
                           else conveyor_tasks.timeout_seconds end,
    lease_seconds = case when i.step_state is not null then i.lease_seconds
                         else conveyor_tasks.lease_seconds end,
    worker_id = null,
    lease_expires_at = null,
    finished_at = case when i.state in ('succeeded', 'failed', 'cancelled')
                         or conveyor_tasks.cancel_requested
                       then :now end
from (select json_extract(value, '$.id') as id, json_extract(value, '$.attempt') as attempt,
             json_extract(value, '$.state') as state,
             json_extract(value, '$.outcome') as outcome,
             json_extract(value, '$.delay') as delay,
             json_extract(value, '$.result') as result,
             json_extract(value, '$.step') as step,
             json_extract(value, '$.step_state') as step_state,
             json_extract(value, '$.run_at') as run_at,
             json_extract(value, '$.max_attempts') as max_attempts,
             json_extract(value, '$.retry_policy') as retry_policy,
             json_extract(value, '$.timeout') as timeout_seconds,
             json_extract(value, '$.lease') as lease_seconds
      from json_each(:completions)) as i
where conveyor_tasks.id = i.id
  and conveyor_tasks.attempt = i.attempt
  and conveyor_tasks.worker_id = :worker_id
  and conveyor_tasks.lease_expires_at > :now
returning conveyor_tasks.id, conveyor_tasks.attempt, conveyor_tasks.parent_id, conveyor_tasks.queue,
          (conveyor_tasks.state = 'pending' and conveyor_tasks.run_at <= :now)
          or conveyor_tasks.concurrency_key is not null;

-- name: finish_log
-- Close the attempts of the completions `finish` applied (only those are passed).
update conveyor_attempts
set outcome = i.outcome,
    finished_at = :now,
    error_type = i.error_type,
    error_message = i.error_message,
    traceback = i.traceback
from (select json_extract(value, '$.id') as id, json_extract(value, '$.attempt') as attempt,
             json_extract(value, '$.outcome') as outcome,
             json_extract(value, '$.error_type') as error_type,
             json_extract(value, '$.error_message') as error_message,
             json_extract(value, '$.traceback') as traceback
      from json_each(:completions)) as i
where conveyor_attempts.task_id = i.id and conveyor_attempts.number = i.attempt;

-- name: cancel
-- Cancel a task: pending and waiting ones at once; a running one is flagged
-- and its worker stops it once it hears of it (a cancel hint, or its next
-- heartbeat). Returns the state after.
update conveyor_tasks
set state = case when state = 'in_progress' then state else 'cancelled' end,
    cancel_requested = (state = 'in_progress'),
    finished_at = case when state = 'in_progress' then null else :now end
where id = :id and state in ('pending', 'waiting', 'in_progress')
returning state;

-- name: cancel_requested
-- Which of these leases (a JSON array of [id, attempt]), held by
-- :worker_id, have a cancel requested.
select t.id, t.attempt
from conveyor_tasks t
join (select json_extract(value, '$[0]') as id, json_extract(value, '$[1]') as attempt
      from json_each(:leases)) as l on l.id = t.id and l.attempt = t.attempt
where t.worker_id = :worker_id and t.cancel_requested;

-- name: retry
-- Run a failed or cancelled task again now, with a fresh attempt budget.
update conveyor_tasks
set state = 'pending', spent = 0, run_at = :now, cancel_requested = 0, result = null,
    finished_at = null
where id = :id and state in ('failed', 'cancelled')
returning state;

-- name: task_state
select state from conveyor_tasks where id = :id;

-- name: get_task
select id, name, queue, payload, state, priority, run_at, attempt, max_attempts,
       retry_policy, timeout_seconds, lease_seconds, result, created_at, finished_at,
       worker_id, lease_expires_at, cancel_requested, step, parent_id, inbox, idempotency_key,
       concurrency_key
from conveyor_tasks
where id = :id;

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
       concurrency_key
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
       concurrency_key
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

-- name: paused
-- What the claims leave out: every paused queue and task name.
select kind, name from conveyor_pauses;

-- name: pause
-- Pause a queue or a task name (again: nothing changes); a row back if paused now.
insert into conveyor_pauses (kind, name, paused_at) values (:kind, :name, :now)
on conflict (kind, name) do nothing
returning 1;

-- name: resume
delete from conveyor_pauses where kind = :kind and name = :name returning 1;

-- name: list_pauses
select kind, name, paused_at from conveyor_pauses order by kind, name;

-- name: next_run_at
-- The earliest time a pending task of these queues becomes due.
select min(run_at) from conveyor_tasks
where state = 'pending' and queue in (select value from json_each(:queues));

-- name: register_worker
insert into conveyor_workers
    (id, host, pid, queues, concurrency, started_at, last_seen_at, tasks, beat_seconds)
values (:id, :host, :pid, :queues, :concurrency, :now, :now, :tasks, :beat_seconds)
on conflict (id) do update set
    last_seen_at = :now, stopped_at = null,
    queues = :queues, tasks = :tasks, beat_seconds = :beat_seconds;

-- name: stop_worker
update conveyor_workers set stopped_at = :now, last_seen_at = :now where id = :id;

-- name: list_workers
select id, host, pid, queues, concurrency, started_at, last_seen_at, stopped_at,
       tasks, beat_seconds
from conveyor_workers
order by started_at desc;

-- name: data_version
-- Changes whenever another connection commits to the file: the cross-process
-- wake-up signal (workers check it every few tens of milliseconds).
pragma data_version;

-- name: migrations_table
create table if not exists conveyor_migrations (
    version     integer primary key,
    name        text not null,
    applied_at  real not null default ((julianday('now') - 2440587.5) * 86400.0)
);

-- name: migrations_table_exists
select 1 from sqlite_master where type = 'table' and name = 'conveyor_migrations';

-- name: latest_migration
select max(version) from conveyor_migrations;

-- name: migration_applied
select 1 from conveyor_migrations where version = :version;

-- name: record_migration
insert into conveyor_migrations (version, name) values (:version, :name);

-- name: record_migration_script
-- The record of a migration, as a reviewed script (migrate --sql) writes it:
-- the values are the migration's own number and file name.
insert into conveyor_migrations (version, name) values ({version}, '{name}');

-- name: applied_migrations
select version from conveyor_migrations order by version;

-- name: close_lost_attempt
-- Close the open attempt of a task whose lease expired, saying why.
update conveyor_attempts
set outcome = 'lease_lost', finished_at = :now, error_type = {text:lease_expired_error},
    error_message = :message
where task_id = :task_id and outcome = 'in_progress';

-- name: drop_messages
drop table if exists conveyor_messages;

-- name: drop_attempts
drop table if exists conveyor_attempts;

-- name: drop_workers
drop table if exists conveyor_workers;

-- name: drop_tasks
drop table if exists conveyor_tasks;

-- name: drop_migrations
drop table if exists conveyor_migrations;

-- name: recipient
select state, inbox from conveyor_tasks where id = :id;

-- name: deliver
-- One message into a live coroutine task's inbox (others are skipped);
-- `wake` follows it.
insert into conveyor_messages (task_id, sender_id, kind, body, created_at, trace_context)
select id, :sender_id, 'message', :body, :now, :trace from conveyor_tasks
where id = :task_id and inbox and state in ('pending', 'in_progress', 'waiting');

-- name: wake
-- A message arrived: a waiting task is pending again, a sleeping one due now
-- (run_at never moves later).
update conveyor_tasks
set state = 'pending', run_at = min(run_at, :now)
where id = :task_id
  and (state = 'waiting' or (state = 'pending' and run_at > :now));

-- name: sent_key
-- The message already sent to :task_id under this idempotency key.
select message_id from conveyor_message_keys where task_id = :task_id and key = :key;

-- name: keep_key
insert into conveyor_message_keys (task_id, key, message_id)
values (:task_id, :key, :message_id);

-- name: drop_message_keys
drop table if exists conveyor_message_keys;

-- name: first_message
insert into conveyor_messages (task_id, sender_id, kind, body, created_at, trace_context)
values (:task_id, :sender_id, 'message', :body, :now, :trace);

-- name: consume
-- Delete the messages a poll saw (its completion was applied).
delete from conveyor_messages
where task_id = :task_id and id in (select value from json_each(:ids));

-- name: rewake
-- A poll ended waiting or sleeping while its inbox holds messages it did
-- not see: due again now.
update conveyor_tasks
set state = 'pending', run_at = min(run_at, :now)
where id = :task_id
  and (state = 'waiting' or (state = 'pending' and run_at > :now))
  and exists (select 1 from conveyor_messages m where m.task_id = :task_id);

-- name: inbox
select id, task_id, sender_id, kind, body, created_at, trace_context
from conveyor_messages
where task_id = :task_id
order by id;

-- name: fence
-- Which of these leases (a JSON array of [id, attempt]) are still held by
-- :worker_id at :now: the completions `finish` will apply. A poll's effects are
-- written first (under the write lock nothing can move the fence), so a
-- child's last messages precede the end-of-stream its completion sends.
select t.id, t.attempt
from conveyor_tasks t
join (select json_extract(value, '$[0]') as id, json_extract(value, '$[1]') as attempt
      from json_each(:leases)) as l on l.id = t.id and l.attempt = t.attempt
where t.worker_id = :worker_id and t.lease_expires_at > :now;

-- name: prune_tasks
-- Delete up to :limit finished tasks of state :state, finished before
-- :before, oldest ids first, whose parent is not alive (see the PostgreSQL
-- prune); attempts, messages and keys go with them (on delete cascade). The
-- state index (state, id) serves the order. Only tasks made before :before
-- can have finished before it: `search` halves the id range down to the first
-- id made at or after it (one probe of the primary key a step), and the walk
-- stops there, so that a state with nothing to prune does not read every
-- task of the state while the database's one writer waits.
delete from conveyor_tasks where id in (
    with recursive search (lo, hi) as (
        select coalesce((select min(id) from conveyor_tasks), 0),
               coalesce((select max(id) from conveyor_tasks) + 1, 0)
        union all
        select case when f.created_at < :before then min(f.id + 1, s.hi) else s.lo end,
               case when f.created_at < :before then s.hi else s.lo + (s.hi - s.lo) / 2 end
        from search s
        left join conveyor_tasks f on f.id = (
            select min(n.id) from conveyor_tasks n where n.id >= s.lo + (s.hi - s.lo) / 2)
        where s.lo < s.hi
    )
    select t.id from conveyor_tasks t
    where t.state = :state
      and t.id < (select min(hi) from search)
      and t.finished_at < :before
      and not exists (
          select 1 from conveyor_tasks p
          where p.id = t.parent_id and p.state in ('pending', 'in_progress', 'waiting'))
    order by t.id
    limit :limit
)
returning id;

-- name: prune_workers
delete from conveyor_workers where coalesce(stopped_at, last_seen_at) < :workers_before
returning id;

-- name: count_prunable
select count(*) from conveyor_tasks t
where t.state = :state
  and t.finished_at < :before
  and not exists (
      select 1 from conveyor_tasks p
      where p.id = t.parent_id and p.state in ('pending', 'in_progress', 'waiting'));

-- name: count_prunable_workers
select count(*) from conveyor_workers where coalesce(stopped_at, last_seen_at) < :workers_before;

-- name: sync_release
-- Record that a release of schedules synced at :now (its first sync gives it
-- the next generation: the rowid, one more than the greatest).
insert into conveyor_schedule_releases (release, tasks, seen_at)
values (:release, :tasks, :now)
on conflict (release) do update set seen_at = excluded.seen_at
returning generation;

-- name: release_superseded
-- Whether a newer release supersedes this one (see the PostgreSQL
-- statement sync_release): live, of a greater generation, and sharing one
-- of its task names (:tasks, a JSON array).
select exists (select 1 from conveyor_schedule_releases newer
               where newer.generation > :generation
                 and newer.seen_at >= :now - :lifetime
                 and exists (select 1 from json_each(newer.tasks) theirs
                             where theirs.value in (select value from json_each(:tasks))));

-- name: sync_schedule
-- Store a schedule as a release defines it (see the PostgreSQL statement).
insert into conveyor_schedules
    (name, task, cron, every_seconds, tz, missed, catch_up, args, fingerprint, last_slot,
     synced_at, release)
values (:name, :task, :cron, :every, :tz, :missed, :catch_up, :args, :fingerprint, :now, :now,
        :release)
on conflict (name) do update
set task = excluded.task, cron = excluded.cron, every_seconds = excluded.every_seconds,
    tz = excluded.tz, missed = excluded.missed, catch_up = excluded.catch_up,
    args = excluded.args, fingerprint = excluded.fingerprint, synced_at = excluded.synced_at,
    release = excluded.release
where (conveyor_schedules.release is not excluded.release
       or conveyor_schedules.fingerprint is not excluded.fingerprint)
  and not exists (select 1 from conveyor_schedule_releases owner
                  where owner.release = conveyor_schedules.release
                    and owner.generation > :generation
                    and owner.seen_at >= :now - :lifetime);

-- name: drop_schedules
-- Remove the stored schedules of these task names (a JSON array) that the
-- syncing release (its schedule names, a JSON array) no longer defines, but
-- for those a newer live release stored.
delete from conveyor_schedules
where task in (select value from json_each(:tasks))
  and name not in (select value from json_each(:names))
  and not exists (select 1 from conveyor_schedule_releases owner
                  where owner.release = conveyor_schedules.release
                    and owner.generation > :generation
                    and owner.seen_at >= :now - :lifetime);

-- name: list_schedules
select name, task, cron, every_seconds, tz, missed, catch_up, args, fingerprint,
       last_slot, last_task_id, synced_at, release
from conveyor_schedules
order by name;

-- name: fire_schedule
-- Take slots :first to :last of a schedule no one fired yet (see the
-- PostgreSQL statement; SQLite's one writer makes concurrent fires take turns).
update conveyor_schedules
set last_slot = :last
where name = :name and fingerprint = :fingerprint
  and (last_slot is null or last_slot < :first)
returning name;

-- name: fired_task
update conveyor_schedules set last_task_id = :task_id where name = :name;

-- name: run_now
-- A pending task becomes due now (see the PostgreSQL statement).
update conveyor_tasks set run_at = min(run_at, :now)
where id = :id and state = 'pending'
returning state, queue;

-- name: delete_task
-- Delete a task that is not in progress (see the PostgreSQL statement).
delete from conveyor_tasks
where id = :id and state <> 'in_progress'
  and (state in ('succeeded', 'failed', 'cancelled')
       or not exists (select 1 from conveyor_tasks p
                      where p.id = conveyor_tasks.parent_id
                        and p.state in ('pending', 'in_progress', 'waiting')))
returning id;

-- name: delete_blocker
select t.state, p.state
from conveyor_tasks t left join conveyor_tasks p on p.id = t.parent_id
where t.id = :id;

-- name: part_selected
-- The tasks a bulk action selects (see the PostgreSQL part_selected;
-- :states and :ids are JSON arrays, :ids null for any). Each bulk action
-- selects in its own statement, under the one writer: a task changed since
-- a caller listed it is judged as it is now.
state in (select value from json_each(:states)) and id > :after
      and (:ids is null or id in (select value from json_each(:ids)))
      and (:name is null or name = :name)
      and (:queue is null or queue = :queue)
      and (:since is null or created_at >= :since)
      and (:until is null or created_at < :until)

-- name: retry_many
-- One batch of a bulk retry (see the PostgreSQL statement), of the tasks
-- part_selected selects.
update conveyor_tasks
set state = 'pending', spent = 0, run_at = :now, cancel_requested = 0, result = null,
    finished_at = null
where id in (
    select id from conveyor_tasks
    where {part_selected}
    order by id
    limit :limit
)
returning id;

-- name: cancel_many
-- One batch of a bulk cancel, each task as cancel (see the PostgreSQL
-- statement); the triggers end children and tell parents as for one.
update conveyor_tasks
set state = case when state = 'in_progress' then state else 'cancelled' end,
    cancel_requested = (state = 'in_progress'),
    finished_at = case when state = 'in_progress' then null else :now end
where id in (
    select id from conveyor_tasks
    where {part_selected}
    order by id
    limit :limit
)
returning id, state;

-- name: delete_many
-- One batch of a bulk delete of finished tasks (see the PostgreSQL
-- statement); attempts and messages go with them as for delete_task.
delete from conveyor_tasks
where id in (
    select id from conveyor_tasks
    where {part_selected}
    order by id
    limit :limit
)
  and state in ('succeeded', 'failed', 'cancelled')
returning id;

-- name: open_keys
-- Up to :key_scan concurrency keys with pending tasks, claimed from longest
-- ago first, each with the room its running tasks leave (max_running less
-- them, but for an expired lease with nothing left to run: see the
-- PostgreSQL claim_keyed) and the tokens of its rate bucket now (null: no
-- rate).
select c.key,
       c.max_running - (
           select count(*) from conveyor_tasks r indexed by conveyor_tasks_running_keyed
           where r.concurrency_key = c.key and r.state = 'in_progress'
             and not (r.lease_expires_at <= :now
                      and (r.cancel_requested or r.spent >= r.max_attempts))),
       case when c.rate_limit is null then null
            else min(c.rate_limit * 1.0,
                     c.tokens + (:now - c.refilled_at) * c.rate_limit / c.rate_period) end,
       c.rate_limit
from conveyor_concurrency c
order by c.claimed_at is not null, c.claimed_at, c.key
limit :key_scan;

-- name: claim_keyed
-- The head of one key's due pending tasks, in claim order, at most its room.
select id, state, priority, run_at, concurrency_key, concurrency_limit
from conveyor_tasks indexed by conveyor_tasks_pending_keyed
where state = 'pending'
  and concurrency_key = :key
  and run_at <= :now
  and queue in (select value from json_each(:queues))
  and name in (select value from json_each(:names))
  and attempt <= 2147483645 and spent <= 2147483645  -- see quarantine
order by priority desc, run_at, id
limit :limit;

-- name: key_claimed
-- Mark a key claimed from (its turn comes last next time), with the limit
-- of its newest claimed task and the tokens left in its rate bucket.
update conveyor_concurrency
set claimed_at = :now, max_running = coalesce(:max_running, 1000000), tokens = :tokens,
    refilled_at = case when rate_limit is null then null else :now end
where key = :key;

-- name: keys_emptied
-- Keys with no pending task left lose their row (one with a rate once its
-- bucket is full again: :keys holds only those).
delete from conveyor_concurrency
where key in (select value from json_each(:keys))
  and not exists (select 1 from conveyor_tasks t
                  where t.concurrency_key = conveyor_concurrency.key and t.state = 'pending');

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
