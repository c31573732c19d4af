-- attempts.lua: the attempt log, the end of a lease, and a task set aside.

-- The attempt log: {p}:attempts:ID holds one JSON row per ended attempt.
-- The running attempt lives in the task's hash until it ends: its number
-- (attempt), worker (worker_id), start (started_at) and step (the task's
-- step while it runs); a claim writes them with the lease, and its end
-- appends its row (one write per attempt, never a rewrite). The lease's
-- nonce (the claim's random value, in every lease token) lives there too:
-- a store that lost its data and gives a task id out again (a restart
-- without persistence, an older snapshot) never takes an older attempt of
-- that id for the new task's, whatever the worker and attempt number.
local RUNNING_FIELDS = {'attempt', 'worker_id', 'started_at', 'step'}

-- The running attempt of task id from its hash fields (attempt, worker_id,
-- started_at, step), or nil when they do not read.
local function running_attempt(attempt, worker, started_at, step)
  attempt, started_at = number('attempt', attempt), number('started_at', started_at)
  if not (attempt and worker and started_at) then return nil end
  return {number = attempt, worker_id = worker, started_at = started_at, step = step}
end

-- The running attempt of task id, read from its hash (nil: does not read).
local function read_running(id)
  return running_attempt(unpack(redis.call('HMGET', key_task(id), unpack(RUNNING_FIELDS))))
end

-- The running attempt (from running_attempt) ended: its row joins the log.
-- The caller ends the lease (end_lease), which clears it from the hash.
-- The row is written as text here (cjson.encode of a table costs several
-- times more): numbers as integers, each string through cjson.encode.
local function json_text(value)
  if not value then return 'null' end
  return cjson.encode(value)
end
local function close_attempt(id, now, outcome, error_type, message, traceback, running)
  redis.call('RPUSH', key_attempts(id), string.format(
    '{"number":%d,"worker_id":%s,"started_at":%d,"step":%s,"outcome":"%s","finished_at":%d,'
      .. '"error_type":%s,"error_message":%s,"traceback":%s}',
    running.number, json_text(running.worker_id), running.started_at, json_text(running.step),
    outcome, now, json_text(error_type), json_text(message), json_text(traceback)))
end

-- The attempt is over: no owner, no lease.
local function end_lease(id, queue, key)
  redis.call('HDEL', key_task(id), 'worker_id', 'lease_expires_at', 'started_at', 'nonce')
  redis.call('ZREM', key_leases(queue), id)
  drop_keyed(id, nil, key)
end

-- Every script checks what it reads before it writes anything: Redis does
-- not roll back a script that fails halfway. A task whose stored fields do
-- not read (written around conveyor) is set aside alone by the script that
-- meets it (a claim, a heartbeat, a completion): out of every index of its
-- queue and key, into the corrupt set, and ended `failed` with an attempt
-- row saying why (CorruptTask; its running attempt's when it ran, else one
-- of its own); its other fields stay as they were, its parent hears of its
-- end, and a warning goes to the server's log. It then blocks nothing and
-- stays readable. `queue` is its queue's name (the index it was met in),
-- `worker` the worker whose script met it, `message` why.
local ended
local function set_aside(id, queue, worker, message, now)
  local task = key_task(id)
  local f = redis.call('HMGET', task, 'state', 'attempt', 'worker_id', 'started_at', 'step')
  local state = f[1]
  redis.call('SADD', KEY_CORRUPT, id)
  redis.call('ZREM', key_delayed(queue), id)
  redis.call('ZREM', key_pending(queue), id)
  redis.call('ZREM', key_leases(queue), id)
  drop_keyed(id, true)
  if TERMINAL[state] then return end
  local number_ = number('attempt', f[2]) or 0
  local running = {number = number_, worker_id = worker, started_at = now, step = f[5] or nil}
  if state == 'in_progress' then
    running.worker_id = f[3] or worker
    running.started_at = number('started_at', f[4]) or now
  else
    running.number = number_ + 1
  end
  close_attempt(id, now, 'failed', TEXTS.corrupt_task_error, message, nil, running)
  finish_task(id, STATES[state] and state or nil, 'failed', now)
  end_lease(id, queue)
  ended(id, now)
  redis.log(redis.LOG_WARNING,
    'conveyor: task ' .. id .. ' of ' .. BASE .. ' set aside (failed): ' .. message)
end
