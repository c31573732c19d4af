-- flow.lua: unique keys, pauses, concurrency keys and rate limits.

-- Unique keys: {p}:unique:LEN:NAME:KEY holds the id of the task that holds
-- the key, whose hash holds idempotency_key, and unique_scope and
-- unique_until (ms) when given. A task gives its key up (release_key) when
-- it leaves its scope, in the script that moves it (move_state), when its
-- period is over and the key is wanted again, or when it is deleted.
local function release_key(id)
  local task = key_task(id)
  local f = redis.call('HMGET', task, 'name', 'idempotency_key')
  if f[1] and f[2] then
    local key = key_unique(f[1], f[2])
    if redis.call('GET', key) == tostring(id) then redis.call('DEL', key) end
  end
  redis.call('HDEL', task, 'idempotency_key', 'unique_scope', 'unique_until')
end

-- The id (a string) of the task holding key `key` of `name`, or nil: a key
-- whose holder is gone, or whose period ended, is free (reads only).
local function key_holder(name, key, now)
  local id = redis.call('GET', key_unique(name, key))
  if not id then return nil end
  local f = redis.call('HMGET', key_task(id), 'state', 'unique_until')
  if not f[1] then return nil end
  local period_end = number('unique_until', f[2])
  if period_end and period_end <= now then return nil end
  return id
end

-- Pauses: {p}:pauses maps "queue:NAME" and "task:NAME" to the pause's time.
local function pause_field(kind, name) return kind .. ':' .. name end

-- The queues (a list) and names (a set) that no pause holds back.
local function served(queues, names)
  if redis.call('EXISTS', KEY_PAUSES) == 0 then return queues, names end
  local open_queues, open_names = {}, {}
  for _, queue in ipairs(queues) do
    if redis.call('HEXISTS', KEY_PAUSES, pause_field('queue', queue)) == 0 then
      open_queues[#open_queues + 1] = queue
    end
  end
  for name in pairs(names) do
    if redis.call('HEXISTS', KEY_PAUSES, pause_field('task', name)) == 0 then
      open_names[name] = true
    end
  end
  return open_queues, open_names
end

-- Concurrency keys and rate limits. The memory store
-- (conveyor.backends.memory.flow) is the model; keys.py draws the layout.
--
-- A key has a row, {p}:concurrency:KEY (a hash: max_running, and for a rate
-- its bucket: rate_limit, rate_period, tokens as of refilled_at), while it
-- has pending tasks or its bucket refills: made, with the limit and rate of
-- the task that made it, when a keyed task becomes pending (index_keyed);
-- dropped by a claim that reads it and finds no pending task left (and a
-- full bucket). A key with no pending task takes the limit of the next task
-- made pending, whether its row was dropped or not (ensure_key).
-- {p}:concurrency-keys orders the rows for the claims' turns (score: when a
-- claim last took a task of the key, -inf for never; ties by key, as ZRANGE
-- orders equal scores).
--
-- A keyed pending task is in no ready set of its queue: due, it is in its
-- key's ready set (members in claim order, as the queues' ready sets, with
-- its queue and name after the order so that a claim filters a key's tasks
-- without reading their hashes); delayed, in its queue's delayed set as any
-- task (a claim's promote moves it to its key's ready set). Every pending
-- task of a key is in the key's pending set; every running one in its
-- leases (score: lease expiry), so that a claim counts a key's running
-- tasks without reading them (only those whose lease expired are read).
-- {p}:concurrency-due:Q counts, per task name, the keyed tasks of queue Q in
-- their keys' ready sets, for count_unfinished and a task name's resume.
--
-- A claim reads at most `key_scan` rows, those of the keys claimed from
-- longest ago first; a key without room (its running tasks, its tokens)
-- costs it one hash, one ZCOUNT and the expired leases of the key, never the
-- tasks queued behind it.

local UNLIMITED = 1000000

-- A key's ready member: the claim order (order_member, ORDER_WIDTH bytes),
-- then "|LEN:QUEUE:NAME" (LEN is the queue's length in bytes).
local ORDER_WIDTH = 42
local function keyed_member(priority, run_at, id, queue, name)
  return order_member(priority, run_at, id) .. '|' .. #queue .. ':' .. queue .. ':' .. name
end

-- The claim order, queue and name of a key's ready member; nil for one
-- that does not read (written around conveyor).
local function keyed_member_parts(member)
  local len, tail = string.match(string.sub(member, ORDER_WIDTH + 2), '^(%d+):(.*)$')
  len = tonumber(len)
  if not len or string.sub(member, ORDER_WIDTH + 1, ORDER_WIDTH + 1) ~= '|'
      or not tonumber(string.sub(member, ORDER_WIDTH - 14, ORDER_WIDTH))
      or string.sub(tail, len + 1, len + 1) ~= ':' then
    return nil
  end
  return string.sub(member, 1, ORDER_WIDTH), string.sub(tail, 1, len), string.sub(tail, len + 2)
end

-- Floats (tokens) are stored and returned as text: a script's number reply
-- is truncated to an integer.
local function float_text(x) return string.format('%.17g', x) end

-- The key's row exists (a new one takes this limit and rate, its bucket full).
-- A key none of whose tasks is pending takes this limit when a task becomes
-- pending, as a new row would: whether a claim dropped its row
-- meanwhile changes nothing. `staying`: the task was pending and stays so
-- (a promotion, a replace, run_now), which changes no limit. Called before
-- the task joins the key's pending set.
local function ensure_key(key, limit, rate, period, now, staying)
  local row = key_concurrency(key)
  if redis.call('EXISTS', row) == 1 then
    if not staying and redis.call('SCARD', key_concurrency_pending(key)) == 0 then
      redis.call('HSET', row, 'max_running', limit or UNLIMITED)
    end
    return
  end
  redis.call('HSET', row, 'max_running', limit or UNLIMITED)
  if rate and period then
    redis.call('HSET', row, 'rate_limit', rate, 'rate_period', period, 'tokens', rate,
      'refilled_at', now)
  end
  redis.call('ZADD', KEY_CONCURRENCY_KEYS, '-inf', key)
end

-- A keyed task becomes pending (index_pending in indexes.lua calls this).
-- Its limit and rate are read in their bounds (number in numbers.lua): one
-- that does not read (written around conveyor) counts as none given, and
-- never reaches the key's row.
index_keyed = function(id, key, queue, name, priority, run_at, now, staying)
  local f = redis.call('HMGET', key_task(id), 'concurrency_limit', 'rate_limit', 'rate_period')
  local function read(field, text) return number(field, text) and text or nil end
  ensure_key(key, read('concurrency_limit', f[1]), read('rate_limit', f[2]),
    read('rate_period', f[3]), now, staying)
  redis.call('SADD', key_concurrency_pending(key), id)
  if run_at <= now then
    local member = keyed_member(priority, run_at, id, queue, name)
    if redis.call('ZADD', key_concurrency_ready(key), 0, member) == 1 then
      redis.call('HINCRBY', key_concurrency_due(queue), name, 1)
    end
    woke(queue)
  else
    redis.call('ZADD', key_delayed(queue), run_at, id)
  end
end

-- A keyed task leaves its key's pending and ready sets (`member`, its place
-- there when due): claimed, cancelled, moved or deleted.
local function unready_keyed(id, key, queue, name, member)
  redis.call('ZREM', key_pending(queue), id)
  redis.call('SREM', key_concurrency_pending(key), id)
  if redis.call('ZREM', key_concurrency_ready(key), member) == 1 then
    local due = key_concurrency_due(queue)
    if redis.call('HINCRBY', due, name, -1) <= 0 then redis.call('HDEL', due, name) end
  end
end

-- The same, from the task's fields (unindex_pending in indexes.lua calls
-- this; it takes the task out of its queue's delayed set).
unindex_keyed = function(id, key, queue, name, priority, run_at)
  unready_keyed(id, key, queue, name, keyed_member(priority, run_at, id, queue, name))
end

-- A keyed task's lease (a claim, a heartbeat); its end (end_lease): out of
-- its key's leases; or it is set aside (set_aside, `pending` true): out of
-- its key's pending set as well.
local function lease_keyed(id, key, expires)
  redis.call('ZADD', key_concurrency_leases(key), expires, id)
end
drop_keyed = function(id, pending, key)
  if key == nil then key = redis.call('HGET', key_task(id), 'concurrency_key') end
  if key then
    redis.call('ZREM', key_concurrency_leases(key), id)
    if pending then redis.call('SREM', key_concurrency_pending(key), id) end
  end
end

-- An attempt of `key` (false or nil: none) ended: a slot of the key is
-- free, so the queue of its next due task (the head of its ready set) is
-- woken at once, as for a workflow's next step; without it the key's tasks
-- would wait for a poll between each slot.
local function key_freed(key)
  if not key then return end
  local head = redis.call('ZRANGE', key_concurrency_ready(key), 0, 0)[1]
  if not head then return end
  local _, queue = keyed_member_parts(head)
  if queue then woke(queue) end
end

-- The bucket's tokens at `now` (nil: no rate), from the row's fields
-- max_running, rate_limit, rate_period, tokens, refilled_at (f[1..5]).
local function tokens_at(f, now)
  local rate, period, tokens = tonumber(f[2]), tonumber(f[3]), tonumber(f[4])
  if not (rate and period and tokens) then return nil end
  local refilled = tonumber(f[5]) or now
  return math.min(rate, tokens + (now - refilled) / 1000 * rate / period)
end

local ROW_FIELDS = {'max_running', 'rate_limit', 'rate_period', 'tokens', 'refilled_at'}

-- The room a key has at `now`: max_running less its running tasks (but for
-- a lease that expired with nothing left to run: its next sweep ends it),
-- at most its whole tokens; and its tokens (nil: no rate) and rate.
local function key_room(key, now)
  local f = redis.call('HMGET', key_concurrency(key), unpack(ROW_FIELDS))
  local leases = key_concurrency_leases(key)
  local running = redis.call('ZCOUNT', leases, '(' .. now, '+inf')
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now)) do
    local t = redis.call('HMGET', key_task(id), 'state', 'cancel_requested', 'spent',
      'max_attempts')
    local spent, max_attempts = number('spent', t[3]), number('max_attempts', t[4])
    if t[1] ~= 'in_progress' then
      redis.call('ZREM', leases, id)  -- left by a writer that did not know keys
    elseif not (t[2] == '1' or (spent and max_attempts and spent >= max_attempts)) then
      running = running + 1
    end
  end
  local room = (tonumber(f[1]) or 1) - running
  local tokens = tokens_at(f, now)
  if tokens then room = math.min(room, math.floor(tokens)) end
  return room, tokens, tonumber(f[2])
end

-- The due pending tasks of the keys with room, of these queues (a set) and
-- names, each key at most its room and `limit`, in claim order within a
-- key, as claim candidates {order, queue, name, false, member, key}; and
-- every key read, {key, tokens, rate} (at most `scan`, their turn first).
-- A key's ready set is walked a page at a time past the tasks of other
-- queues and names; a member that does not read is dropped from it (a
-- warning in the server's log), as a claim sets a corrupt task aside.
local KEY_PAGE = 100
local function keyed_due(queues, names, now, limit, scan)
  local found, read = {}, {}
  for _, key in ipairs(redis.call('ZRANGE', KEY_CONCURRENCY_KEYS, 0, scan - 1)) do
    local room, tokens, rate = key_room(key, now)
    read[#read + 1] = {key, tokens, rate}
    local wanted, offset = math.min(room, limit), 0
    while wanted > 0 do
      local page = redis.call('ZRANGEBYLEX', key_concurrency_ready(key), '-', '+',
        'LIMIT', offset, KEY_PAGE)
      if #page == 0 then break end
      offset = offset + #page
      for _, member in ipairs(page) do
        local order, queue, name = keyed_member_parts(member)
        if not order then
          redis.call('ZREM', key_concurrency_ready(key), member)
          offset = offset - 1
          redis.log(redis.LOG_WARNING, 'conveyor: a member of ' .. key_concurrency_ready(key)
            .. ' does not read, dropped: ' .. member)
        elseif queues[queue] and names[name] then
          found[#found + 1] = {order, queue, name, false, member, key}
          wanted = wanted - 1
          if wanted == 0 then break end
        end
      end
    end
  end
  return found, read
end

-- After a claim: the keys it took tasks of (`taken`: key -> {count, the
-- limit of the newest task taken}) take their turn last next time, the
-- limit of their newest task, and pay their tokens; the other keys read
-- that have no pending task left lose their row (one with a rate once its
-- bucket is full).
local function settle_keys(read, taken, now)
  for _, r in ipairs(read) do
    local key, tokens, rate = r[1], r[2], r[3]
    local row, took = key_concurrency(key), taken[key]
    if took then
      redis.call('ZADD', KEY_CONCURRENCY_KEYS, now, key)
      redis.call('HSET', row, 'max_running', took.limit or UNLIMITED)
      if tokens then
        redis.call('HSET', row, 'tokens', float_text(tokens - took.count), 'refilled_at', now)
      end
    elseif redis.call('EXISTS', key_concurrency_pending(key)) == 0
        and (not rate or (tokens and tokens >= rate)) then
      redis.call('DEL', row)
      redis.call('ZREM', KEY_CONCURRENCY_KEYS, key)
    end
  end
end
