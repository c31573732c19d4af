-- messages.lua: inboxes, and the wake of a task a message reached.

-- Inboxes: one sorted set per task, scored by message id (ids ascend in
-- send order), each member the message as a JSON array
-- [id, sender id or "", kind, created_at, body (JSON text)], and the
-- sender's trace context (JSON text) as a sixth element when it has one.
local function append_message(id, sender, kind, body, now, trace)
  local message_id = redis.call('INCR', KEY_MESSAGE_IDS)
  local member = {message_id, sender and tostring(sender) or '', kind, now, body}
  if trace then member[6] = trace end
  redis.call('ZADD', key_inbox(id), message_id, cjson.encode(member))
  return message_id
end

-- A message arrived: a waiting task is pending again, a sleeping one due
-- now (its run time never moves later). A task whose fields do not read
-- keeps its message but is not woken (a warning in the server's log): a
-- script must not fail halfway.
local function wake(id, now)
  local f = redis.call('HMGET', key_task(id), 'state', 'queue', 'name', 'priority', 'run_at')
  local state, queue, name = f[1], f[2], f[3]
  local priority, run_at = number('priority', f[4]), number('run_at', f[5])
  if state ~= 'waiting' and not (state == 'pending' and run_at and run_at > now) then return end
  if not (queue and name and priority and run_at) then
    redis.log(redis.LOG_WARNING,
      'conveyor: task ' .. id .. ' of ' .. BASE .. ' not woken, its fields do not read')
    return
  end
  if state == 'pending' then unindex_pending(id, queue, name, priority, run_at) end
  run_at = math.min(run_at, now)
  move_state(id, state, 'pending')
  redis.call('HSET', key_task(id), 'run_at', run_at)
  index_pending(id, queue, name, priority, run_at, now)
end

-- Put a message in a task's inbox and wake it (the caller checked it takes one).
local function deliver(id, sender, kind, body, now, trace)
  local message_id = append_message(id, sender, kind, body, now, trace)
  wake(id, now)
  return message_id
end
