-- Inboxes: deliveries and their wake-ups, idempotency keys of sends, a
-- poll's fence, consumption and rewakes.
--
-- Named blocks of the SQLite backend; what their placeholders stand for is
-- said once, in conveyor.backends.sqlite.statements.

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
