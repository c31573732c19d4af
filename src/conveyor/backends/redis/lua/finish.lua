-- finish: apply each completion whose lease is live (fenced as a heartbeat:
-- this attempt, this worker, this claim's nonce, not expired); the others
-- change nothing. As on the other backends (the memory store is the model):
-- first every applied poll's effects (consumed messages, spawned children,
-- sends: a child's last messages precede its end), then the completions,
-- then the endings, then a resting poll whose inbox still holds messages is
-- due again.
--
-- A completion that would make a task pending or waiting after its cancel was
-- requested ends it cancelled. A transition (a workflow's next step, a
-- coroutine's rest) brings a new state, options and a fresh budget; an
-- interrupted attempt is given back to the budget. A task that ends sends
-- its end message to its live parent, a cancelled one cancels its live
-- children, and its dependents count its end (ended, in lib/controls.lua). A poll's send to a task that is missing,
-- finished or has no inbox is dropped.
--
-- ARGV: now, worker id, then the completions as one JSON array of arrays
-- (decoded here in C): task id (a string), attempt, next state (succeeded,
-- failed, cancelled, pending or waiting), outcome, result (JSON text),
-- error type, message and traceback, retry delay (ms), transition (an array
-- of step (opt), state, max_attempts, retry policy, timeout (opt), lease
-- (opt), run_at (opt, ms), delay (ms)), effects (an array of the consumed
-- message ids, the sends as [task id, body, trace context (opt)] and the spawns as TASK_FIELDS
-- arrays); null for none of those after the outcome; the lease's nonce
-- (last: see claim.lua). Returns per completion
-- 1 (applied) or 0 (rejected).
local now = clock(ARGV[1])
local worker = ARGV[2]
local NULL = cjson.null
local function given(value)
  if value == NULL then return nil end
  return value
end

gather_indexes()

-- Every fence is checked before anything is written. A task whose fence
-- holds (this attempt, this worker, this claim's nonce, a live lease) but whose other fields do
-- not read is set aside (set_aside in lib/attempts.lua) and its completion
-- rejected; one whose fence fields do not read is rejected, unwritten: its
-- lease expires and a claim sets it aside. So is a second completion of one
-- task.
local FENCED = {'state', 'attempt', 'worker_id', 'lease_expires_at', 'queue', 'name',
  'priority', 'unique_scope', 'concurrency_key', 'parent_id', 'started_at', 'step', 'spent', 'nonce',
  'dependents'}
local held, applied, seen, corrupt = {}, {}, {}, {}
for _, c in ipairs(cjson.decode(ARGV[3])) do
  local id, attempt = c[1], c[2]
  local f = redis.call('HMGET', key_task(id), unpack(FENCED))
  local expires = number('lease_expires_at', f[4])
  local fenced = not seen[id] and f[1] == 'in_progress' and number('attempt', f[2]) == attempt
    and f[3] == worker and f[14] == c[12] and expires and expires > now
    and f[5] and f[5] ~= ''
  local running = running_attempt(f[2], f[3], f[11], f[12])
  local field, value = unreadable(FENCED, f)
  if fenced then seen[id] = true end
  if fenced and (field or not running) then
    if not field then field, value = 'started_at', f[11] end
    corrupt[#corrupt + 1] = {id, f[5], unread_message(field, value)}
    applied[#applied + 1] = 0
  elseif fenced then
    -- Read once: a task's unique scope (but for a release, which a second
    -- one repeats harmlessly), concurrency key and parent stay as they are
    -- in this script.
    held[#held + 1] = {c = c, id = id, queue = f[5], name = f[6],
      priority = number('priority', f[7]), scope = f[8], flow_key = f[9], parent = f[10],
      running = running, effects = given(c[11]), dependents = f[15] == '1'}
    applied[#applied + 1] = 1
  else
    applied[#applied + 1] = 0
  end
end

local function apply_effects(h)
  local consumed, sends, spawns = h.effects[1], h.effects[2], h.effects[3]
  for _, message_id in ipairs(consumed) do
    redis.call('ZREMRANGEBYSCORE', key_inbox(h.id), message_id, message_id)
  end
  for _, spawn in ipairs(spawns) do
    store_task(spawn, 1, now, nil)
  end
  for _, send in ipairs(sends) do
    local target = send[1]
    local f = redis.call('HMGET', key_task(target), 'state', 'inbox')
    if f[1] and f[2] == '1' and not TERMINAL[f[1]] then
      deliver(target, h.id, 'message', send[2], now, opt(send[3]))
    end
  end
end

local function take_state(key, move)
  local step, timeout, lease = opt(move[1]), opt(move[5]), opt(move[6])
  redis.call('HSET', key, 'payload', move[2], 'spent', 0, 'max_attempts', move[3],
    'retry', move[4])
  if step then redis.call('HSET', key, 'step', step) else redis.call('HDEL', key, 'step') end
  if timeout then redis.call('HSET', key, 'timeout', timeout)
  else redis.call('HDEL', key, 'timeout') end
  if lease then redis.call('HSET', key, 'lease', lease) else redis.call('HDEL', key, 'lease') end
end

local function complete(h)
  local c, id = h.c, h.id
  local key = key_task(id)
  local state, outcome, result = c[3], c[4], given(c[5])
  local move = given(c[10])
  -- A cancel requested while the attempt ran ends it cancelled.
  if (state == 'pending' or state == 'waiting')
      and redis.call('HGET', key, 'cancel_requested') == '1' then
    state = 'cancelled'
  end
  if outcome == 'interrupted' then redis.call('HINCRBY', key, 'spent', -1) end
  if move then take_state(key, move) end
  if state == 'pending' then
    local run_at
    if move then
      run_at = tonumber(opt(move[7]) or '') or now + tonumber(move[8])
    else
      run_at = now + (given(c[9]) or 0)
    end
    redis.call('HSET', key, 'run_at', run_at)
    index_pending(id, h.queue, h.name, h.priority, run_at, now, h.flow_key)
  end
  close_attempt(id, now, outcome, given(c[6]), given(c[7]), given(c[8]), h.running)
  if state == 'succeeded' and result then
    finish_task(id, 'in_progress', state, now, h.scope, 'result', result)
  elseif TERMINAL[state] then
    if state == 'succeeded' then redis.call('HDEL', key, 'result') end
    finish_task(id, 'in_progress', state, now, h.scope)
  else
    move_state(id, 'in_progress', state, h.scope)
  end
  end_lease(id, h.queue, h.flow_key)
  key_freed(h.flow_key)
  return TERMINAL[state] and (h.parent or state == 'cancelled' or h.dependents)
end

for _, h in ipairs(held) do
  if h.effects then apply_effects(h) end
end
-- An ending tells a parent, a cancelled task cancels its children, and a
-- task something depends on settles its dependents (ended): after
-- every completion of the call, as the SQL backends' row triggers fire after
-- their statement, so that a child ending beside its parent finds it ended.
local endings = {}
for _, h in ipairs(held) do
  if complete(h) then endings[#endings + 1] = h.id end
end
for _, id in ipairs(endings) do ended(id, now) end
for _, bad in ipairs(corrupt) do
  set_aside(bad[1], bad[2], worker, bad[3], now)
end
for _, h in ipairs(held) do
  if h.effects and redis.call('EXISTS', key_inbox(h.id)) == 1 then wake(h.id, now) end
end
flush_indexes()
return applied
