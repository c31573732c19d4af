-- indexes.lua: the per-state and finished indexes (gathered by a script that
-- moves many tasks), claim order, and a pending task's place in its queue's
-- ready, delayed and pending sets.

-- Concurrency keys and rate limits, defined in flow.lua (composed after
-- this file): a keyed pending task's indexes, and a keyed task's lease.
local index_keyed, unindex_keyed, drop_keyed

-- A script that moves many tasks (a claim, a finish) gathers the writes of
-- the per-state and finished indexes (gather_indexes) and makes them at its
-- end, one call per index (flush_indexes): a task moved twice leaves the
-- index of its first state and joins that of its last. Such a script reads
-- none of those indexes in between, and calls neither unmark_finished nor
-- forget_task (which write them at once).
local function gather_indexes()
  gathered = {from = {}, to = {}, order = {}, finished = {}}
end
-- The table lists[name], made empty when it is not there yet.
local function gathered_list(lists, name)
  local list = lists[name]
  if not list then
    list = {}
    lists[name] = list
  end
  return list
end
-- A ZADD made at once, or, given `adds`, gathered there (key: its score and
-- member pairs) for one variadic ZADD per key at the end (add_gathered): an
-- enqueue of many tasks writes each index once.
local function zadd(adds, key, score, member)
  if not adds then
    redis.call('ZADD', key, score, member)
    return
  end
  local list = gathered_list(adds, key)
  list[#list + 1] = score
  list[#list + 1] = member
end
-- Write the gathered ZADDs and empty `adds` (it may gather more).
local function add_gathered(adds)
  for key, values in pairs(adds) do
    call_chunked('ZADD', key, values)
    adds[key] = nil
  end
end
local function flush_indexes()
  local g = gathered
  if not g then return end
  gathered = nil
  local removes, adds = {}, {}
  for _, id in ipairs(g.order) do
    local from, to = g.from[id], g.to[id]
    if from ~= to then
      if from then
        local out = gathered_list(removes, from)
        out[#out + 1] = id
      end
      zadd(adds, key_state(to), id, id)
    end
  end
  for state, ids in pairs(removes) do call_chunked('ZREM', key_state(state), ids) end
  add_gathered(adds)
  for state, members in pairs(g.finished) do
    call_chunked('ZADD', key_finished(state), members)
  end
end

-- Claim order (priority desc, run_at, id) as a string that sorts the same
-- way: a ready set's members all score 0 and ZRANGEBYLEX walks them in
-- order. Priorities are 32-bit (conveyor.options.check_priority), so the
-- inverted one fits 10 digits; run_at is shifted by 10^14 ms so that any
-- datetime's is positive and fits 15 digits; ids fit 15 digits.
local PRIORITY_TOP = 2147483647
local TIME_SHIFT = 100000000000000
local function order_member(priority, run_at, id)
  return string.format(
    '%010d|%015d|%015d', PRIORITY_TOP - priority, run_at + TIME_SHIFT, tonumber(id))
end
local function member_id(member) return string.sub(member, -15) + 0 end

-- Finished tasks by finish time, one index per terminal state, for
-- retention: members ``finished_at|id`` (fixed width, all scored 0) so that
-- ZRANGEBYLEX walks them oldest first, ids breaking ties. Every write of a
-- task's finished_at goes through these two.
local function finished_member(finished_at, id)
  return string.format('%015d|%015d', finished_at + TIME_SHIFT, tonumber(id))
end
local function finished_cutoff(before)
  return '(' .. string.format('%015d|', before + TIME_SHIFT)
end

-- The task's hash gets finished_at = now with its state (move_state).
local function index_finished(id, state, now)
  if gathered then
    local members = gathered_list(gathered.finished, state)
    members[#members + 1] = 0
    members[#members + 1] = finished_member(now, id)
  else
    redis.call('ZADD', key_finished(state), 0, finished_member(now, id))
  end
end

-- Idle workers hear of a queue where tasks became due, once per script.
local function woke(queue)
  if WOKEN[queue] then return end
  WOKEN[queue] = true
  redis.call('PUBLISH', CHANNEL_WAKE, queue)
end

-- The queues added to {p}:queues, and the names known to be in their
-- queue's ready-name set, in this script: each is written once per script
-- (a name taken out of the set is forgotten here too).
local function note_ready_name(queue, name)
  local named = gathered_list(READY_NAMED, queue)
  if not named[name] then
    redis.call('SADD', key_ready_names(queue), name)
    named[name] = true
  end
end
local function drop_ready_name(queue, name)
  redis.call('SREM', key_ready_names(queue), name)
  if READY_NAMED[queue] then READY_NAMED[queue][name] = nil end
end

-- A pending task enters its queue's indexes: the ready set of its name when
-- due (and its queue is woken), else the delayed set (promoted to ready by a
-- claim once due); and, either way, the queue's pending set by run time
-- (next_due_at reads its head). A keyed task's due place is its key's
-- (index_keyed in flow.lua).
-- `key` is the task's concurrency key when the caller knows it (false: none),
-- else nil (read here). `adds` (a new task's) gathers its ZADDs (see zadd).
-- `staying`: the task was pending and stays so (not a move of its state).
local function index_pending(id, queue, name, priority, run_at, now, key, adds, staying)
  if not QUEUE_KNOWN[queue] then
    redis.call('SADD', KEY_QUEUES, queue)
    QUEUE_KNOWN[queue] = true
  end
  zadd(adds, key_pending(queue), run_at, id)
  if key == nil then key = redis.call('HGET', key_task(id), 'concurrency_key') end
  if key then
    index_keyed(id, key, queue, name, priority, run_at, now, staying)
  elseif run_at <= now then
    zadd(adds, key_ready(queue, name), 0, order_member(priority, run_at, id))
    note_ready_name(queue, name)
    woke(queue)
  else
    zadd(adds, key_delayed(queue), run_at, id)
  end
end

-- A task leaves the ready set of its name (and the pending set): claimed,
-- cancelled or moved.
local function unready(queue, name, member)
  redis.call('ZREM', key_pending(queue), member_id(member))
  local ready = key_ready(queue, name)
  if redis.call('ZREM', ready, member) == 1 and redis.call('EXISTS', ready) == 0 then
    drop_ready_name(queue, name)
  end
end

-- Many tasks of one queue and name leave its ready set (and the pending
-- set) at once: `members` their ready members, `ids` their ids (a claim).
local function unready_many(queue, name, members, ids)
  call_chunked('ZREM', key_pending(queue), ids)
  local ready = key_ready(queue, name)
  call_chunked('ZREM', ready, members)
  if redis.call('EXISTS', ready) == 0 then drop_ready_name(queue, name) end
end

local function unindex_pending(id, queue, name, priority, run_at)
  local key = redis.call('HGET', key_task(id), 'concurrency_key')
  if key then
    unindex_keyed(id, key, queue, name, priority, run_at)
  else
    unready(queue, name, order_member(priority, run_at, id))
  end
  redis.call('ZREM', key_delayed(queue), id)
end
