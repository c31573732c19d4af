-- The attempt lifecycle: the end of leases that must not run again,
-- claims (with the reclaim of expired leases), quarantine, heartbeats and
-- finishes.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

-- name: end_expired
-- Expired leases that must not run again: the crash budget is spent or a
-- cancel was requested. The task ends here; close_lost_attempt closes its
-- attempt next. The last column: whether its end may have moved other
-- tasks (its dependents, a cancelled coroutine's children), whose queues
-- are then woken.
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
returning id, state, spent, max_attempts, awaited or inbox;

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
-- Whether the task has dependents (see end_expired).
update conveyor_tasks
set state = 'failed', worker_id = null, lease_expires_at = null, finished_at = :now
where id = :task_id
returning awaited;

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
-- Hand the picked tasks to the worker under a fresh lease (and say which
-- first attempts start past their task's expiry time).
update conveyor_tasks
set state = 'in_progress',
    attempt = attempt + 1,
    spent = spent + 1,
    worker_id = :worker_id,
    lease_expires_at = :now + coalesce(lease_seconds, :lease)
where id in (select value from json_each(:ids))
returning id, attempt, name, queue, payload, spent, max_attempts, retry_policy,
          timeout_seconds, lease_seconds, lease_expires_at, step, parent_id, run_at,
          trace_context,
          -- a first attempt started past the task's expiry: the worker ends it
          case when attempt = 1 and expires_at <= :now then expires_at end,
          receives;

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

-- name: report_progress
-- Store each progress report on its task where the report's lease is live
-- (the heartbeat's fence), with the write's clock as its time.
-- :reports is a JSON array of [id, attempt, progress] triples.
update conveyor_tasks
set progress = r.progress, progress_at = :now
from (select json_extract(value, '$[0]') as id, json_extract(value, '$[1]') as attempt,
             json_extract(value, '$[2]') as progress
      from json_each(:reports)) as r
where conveyor_tasks.id = r.id
  and conveyor_tasks.attempt = r.attempt
  and conveyor_tasks.worker_id = :worker_id
  and conveyor_tasks.lease_expires_at > :now
returning conveyor_tasks.id, conveyor_tasks.attempt;

-- name: finish
-- Record many attempt completions, each fenced by its lease token and a live
-- lease; a late write from a lost lease changes nothing and is missing from
-- the result. A task whose cancel was requested is not made pending or
-- waiting again. A completion with a new state (a workflow's next step, a
-- coroutine's poll) stores it, its options and run time, with a fresh budget.
-- Each row says whether its task is due at once, or held a concurrency
-- key's slot that is free now (either way its queue's idle workers are
-- woken; other processes see the commit), and whether its end may have
-- moved other tasks (its dependents, a cancelled coroutine's children: then
-- every queue's are). :completions is a JSON array of objects (see rows.completions_json).
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
          or conveyor_tasks.concurrency_key is not null,
          conveyor_tasks.finished_at is not null
          and (conveyor_tasks.awaited or conveyor_tasks.inbox);

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

-- name: close_lost_attempt
-- Close the open attempt of a task whose lease expired, saying why.
update conveyor_attempts
set outcome = 'lease_lost', finished_at = :now, error_type = {text:lease_expired_error},
    error_message = :message
where task_id = :task_id and outcome = 'in_progress';
