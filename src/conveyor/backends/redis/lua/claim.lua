-- claim: hand up to `limit` tasks of these names and queues to a worker, in
-- claim order (priority desc, run_at, id): due pending tasks and expired
-- leases with budget left and no cancel requested (reclaimed: the lost
-- attempt is closed lease_lost). Each starts a new attempt under a lease of
-- its own length, else the claim's. Every expired lease of these names and
-- queues whose budget is spent, or whose cancel was requested, ends its task
-- (failed, cancelled) without taking a place in the limit. Paused queues and
-- names are left out, expired leases included: they wait for the resume.
-- Keyed tasks join the candidates from the keys with room, at most each
-- key's room (keyed_due in lib/flow.lua); a reclaim is not limited by its key
-- (it replaces an attempt the key admitted) and spends no token.
--
-- ARGV: now, the claim's nonce and the worker id as one argument ("NONCE
-- WORKER"; the nonce, a random value without spaces, is written with each
-- lease: see RUNNING_FIELDS), limit, lease (seconds), the texts LEASE_EXPIRED_ERROR,
-- LEASE_EXPIRED, CANCELLED_MEANWHILE and CRASH_BUDGET_SPENT (a template with
-- {spent} and {max_attempts}) of conveyor.backends.stored, how many
-- concurrency keys to read at most (key_scan), the number of queues, the
-- queues, then the names.
--
-- Cost: each served queue's due delayed tasks are all promoted to their
-- ready sets (each task once in its life), its expired leases are all read
-- (those of unregistered names stay there), and only the ready sets of
-- registered names are read, at most `limit` members each: a backlog of a
-- name this worker does not know costs it nothing. At most `key_scan`
-- concurrency keys are read; a full key costs its row and its expired
-- leases, not its queued tasks.
local now = clock(ARGV[1])
local nonce, worker = string.match(ARGV[2], '^(%S+) (.*)$')
local limit = tonumber(ARGV[3])
local default_lease = tonumber(ARGV[4])
local LOST_ERROR, LOST, CANCELLED_MEANWHILE, BUDGET_SPENT = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local key_scan = tonumber(ARGV[9])
local queue_count = tonumber(ARGV[10])
local queues = {}
for i = 1, queue_count do queues[i] = ARGV[10 + i] end
local names = {}
for i = 11 + queue_count, #ARGV do names[ARGV[i]] = true end
-- A paused queue or name is neither claimed nor reclaimed (read here, in the
-- claim's own script, so that no claim starts an attempt after a pause).
queues, names = served(queues, names)
gather_indexes()

-- Due delayed tasks move to the ready set of their name; one whose fields
-- do not read is set aside (set_aside in lib/attempts.lua).
local PROMOTED = {'name', 'priority', 'run_at', 'state', 'concurrency_limit', 'rate_limit',
  'rate_period'}
local function promote(queue)
  local delayed = key_delayed(queue)
  local due = redis.call('ZRANGEBYSCORE', delayed, '-inf', now)
  if #due == 0 then return end
  for _, id in ipairs(due) do
    local f = redis.call('HMGET', key_task(id), unpack(PROMOTED))
    local field, value = unreadable(PROMOTED, f)
    if field then
      set_aside(id, queue, worker, unread_message(field, value), now)
    elseif f[4] == 'pending' then
      local priority, run_at = number('priority', f[2]), number('run_at', f[3])
      index_pending(id, queue, f[1], priority, run_at, now, nil, nil, true)
    end
  end
  redis.call('ZREMRANGEBYSCORE', delayed, '-inf', now)
end

-- An expired lease whose task may not run again: the task ends here, its
-- lost attempt closed with the reason.
local function end_expired(id, queue, cancelled, spent, max_attempts, running)
  local message = CANCELLED_MEANWHILE
  if not cancelled then
    message = string.gsub(BUDGET_SPENT, '{spent}', spent)
    message = string.gsub(message, '{max_attempts}', max_attempts)
  end
  close_attempt(id, now, 'lease_lost', LOST_ERROR, message, nil, running)
  finish_task(id, 'in_progress', cancelled and 'cancelled' or 'failed', now)
  end_lease(id, queue)
  ended(id, now)
end

-- The expired leases of a queue: a task whose fields do not read is set
-- aside, whatever its name (no worker could run it: a missing name is no
-- worker's); the others of this claim's names end or are reclaimed.
local SWEPT = {'name', 'cancel_requested', 'spent', 'max_attempts', 'priority', 'run_at',
  'attempt', 'worker_id', 'started_at', 'step', 'state'}
local candidates = {}
for _, queue in ipairs(queues) do
  promote(queue)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', key_leases(queue), '-inf', now)) do
    local f = redis.call('HMGET', key_task(id), unpack(SWEPT))
    local field, value = unreadable(SWEPT, f)
    local running = running_attempt(f[7], f[8], f[9], f[10])
    if not field and f[11] == 'in_progress' and not running then
      field = f[8] and 'started_at' or 'worker_id'
      value = f[8] and f[9] or nil
    end
    if field then
      set_aside(id, queue, worker, unread_message(field, value), now)
    elseif f[11] ~= 'in_progress' then
      redis.call('ZREM', key_leases(queue), id)  -- left by a writer around conveyor
    elseif names[f[1]] then
      local cancelled = f[2] == '1'
      local spent, max_attempts = number('spent', f[3]), number('max_attempts', f[4])
      if cancelled or spent >= max_attempts then
        end_expired(id, queue, cancelled, spent, max_attempts, running)
      else
        local priority, run_at = number('priority', f[5]), number('run_at', f[6])
        candidates[#candidates + 1] = {order_member(priority, run_at, id), queue, f[1], true}
      end
    end
  end
end
-- Read once every expired lease has ended: an ending may cancel children
-- (out of their ready sets) or wake a parent.
for _, queue in ipairs(queues) do
  for _, name in ipairs(redis.call('SMEMBERS', key_ready_names(queue))) do
    if names[name] then
      local head = redis.call('ZRANGEBYLEX', key_ready(queue, name), '-', '+', 'LIMIT', 0, limit)
      for _, member in ipairs(head) do
        candidates[#candidates + 1] = {member, queue, name, false}
      end
    end
  end
end
local served_queues = {}
for _, queue in ipairs(queues) do served_queues[queue] = true end
local keyed, keys_read = keyed_due(served_queues, names, now, limit, key_scan)
for _, candidate in ipairs(keyed) do candidates[#candidates + 1] = candidate end
table.sort(candidates, function(a, b) return a[1] < b[1] end)

-- Hand out the head of the order. A task whose fields do not read, or that
-- is not what the index it was found in says (its name, queue or state), or
-- whose counter stands at the limit (the next attempt would not fit), is set
-- aside instead, and this claim takes one task fewer. Ready tasks leave
-- their ready sets together, per queue and name, after the loop. What goes
-- back is the checked values, written out again (so that '1e3' or '0x1f'
-- reach the worker as numbers it reads).
local HANDED = {
  'attempt', 'spent', 'lease', 'step', 'payload', 'max_attempts', 'retry', 'timeout',
  'parent_id', 'concurrency_key', 'concurrency_limit', 'unique_scope', 'run_at',
  'trace_context', 'name', 'queue', 'state', 'priority', 'expires_at', 'receives',
}
local function misplaced(f, queue, name, reclaim)
  if f[15] ~= name then return 'name', f[15] end
  if f[16] ~= queue then return 'queue', f[16] end
  if f[17] ~= (reclaim and 'in_progress' or 'pending') then return 'state', f[17] end
  return nil
end
local function seconds_text(value)
  return value and '=' .. string.format('%.17g', value) or ''
end
local claimed, taken, leaving = {}, {}, {}
for i = 1, math.min(limit, #candidates) do
  local member, queue, name, reclaim, key_member, flow_key = unpack(candidates[i])
  local id = member_id(member)
  local key = key_task(id)
  local f = redis.call('HMGET', key, unpack(HANDED))
  if flow_key then
    unready_keyed(id, flow_key, queue, name, key_member)
  elseif not reclaim then
    local group = queue .. '\0' .. name
    local out = leaving[group]
    if not out then
      out = {queue = queue, name = name, members = {}, ids = {}}
      leaving[group] = out
    end
    out.members[#out.members + 1] = member
    out.ids[#out.ids + 1] = id
  end
  local running = reclaim and read_running(id)
  local field, value = unreadable(HANDED, f)
  if not field then field, value = misplaced(f, queue, name, reclaim) end
  local attempt, spent = number('attempt', f[1]), number('spent', f[2])
  if field then
    set_aside(id, queue, worker, unread_message(field, value), now)
  elseif reclaim and not running then
    local r = redis.call('HMGET', key, 'worker_id', 'started_at')
    set_aside(id, queue, worker,
      unread_message(r[1] and 'started_at' or 'worker_id', r[1] and r[2] or nil), now)
  elseif attempt >= MAX_COUNTER or spent >= MAX_COUNTER then
    set_aside(id, queue, worker,
      fill(TEXTS.corrupt_counter, {attempt = f[1], spent = f[2]}), now)
  else
    if reclaim then close_attempt(id, now, 'lease_lost', LOST_ERROR, LOST, nil, running) end
    attempt, spent = attempt + 1, spent + 1
    local lease, timeout = number('lease', f[3]), number('timeout', f[8])
    local expires = now + math.floor((lease or default_lease) * 1000 + 0.5)
    local parent, run_at = number('parent_id', f[9]), number('run_at', f[13])
    -- a first attempt started past the task's expiry: the worker ends it
    local expiry = number('expires_at', f[19])
    local expired = attempt == 1 and expiry and expiry <= now
    move_state(id, reclaim and 'in_progress' or 'pending', 'in_progress', f[12],
      'attempt', attempt, 'spent', spent, 'worker_id', worker, 'lease_expires_at', expires,
      'started_at', now, 'nonce', nonce)
    redis.call('ZADD', key_leases(queue), expires, id)
    if f[10] then lease_keyed(id, f[10], expires) end
    if flow_key then
      local took = taken[flow_key] or {count = 0, newest = 0}
      took.count = took.count + 1
      if id > took.newest then took.newest, took.limit = id, f[11] end
      taken[flow_key] = took
    end
    claimed[#claimed + 1] = {
      tostring(id), string.format('%d', attempt), name, queue, f[5], string.format('%d', spent),
      string.format('%d', number('max_attempts', f[6])), f[7], seconds_text(timeout),
      seconds_text(lease), string.format('%d', expires), f[4] and '=' .. f[4] or '',
      parent and '=' .. string.format('%d', parent) or '', string.format('%d', run_at),
      f[14] and '=' .. f[14] or '', expired and string.format('%d', expiry) or '',
      f[20] and '=' .. f[20] or '',
    }
  end
end
for _, out in pairs(leaving) do unready_many(out.queue, out.name, out.members, out.ids) end
settle_keys(keys_read, taken, now)
flush_indexes()
return claimed
