-- common.lua: composed in front of every operation's script when the scripts
-- are loaded (conveyor.backends.redis.scripts), so that the clock, the
-- bounds of a task's numbers, claim order and the attempt log are written
-- once. The table TEXTS (the attempt log's texts, from
-- conveyor.backends.stored) and the key names are composed in front of it.
--
-- KEYS[1] is the store's base, "{prefix}" (see begin). Every key starts with it,
-- so all of one store's keys share one hash tag and one cluster slot: a
-- script may then name keys it computes (Redis Cluster requires only that
-- they live in the slot of the keys it declares). The key names (KEY_*,
-- key_*, CHANNEL_*, set_base) are composed in front of this file, written
-- from keys.py's LAYOUT.
--
-- Times are integer milliseconds since the Unix epoch. Optional arguments
-- come as "" for none and "=" followed by the value otherwise (see opt).

-- The store's base and the names built from it (set_base), and the state one call
-- keeps (the queues it woke, the names it indexed, the ids it reserved, the
-- index writes it gathered): begin sets them all at the start of every call.
-- As a Redis function the chunk runs once, at load, and every call reuses
-- it, so nothing may carry over from one call to the next.
local WOKEN, QUEUE_KNOWN, READY_NAMED, gathered
local reserved_next, reserved_last
local function begin(base)
  set_base(base)
  WOKEN, QUEUE_KNOWN, READY_NAMED, gathered = {}, {}, {}, nil
  reserved_next, reserved_last = 1, 0
end

-- The caller's injected time (tests), else the server's clock: the only
-- authority on leases and due times.
local function clock(given)
  if given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function opt(text)
  if text == '' then return nil end
  return string.sub(text, 2)
end

local TERMINAL = {succeeded = true, failed = true, cancelled = true}
local STATES = {
  pending = true, in_progress = true, waiting = true,
  succeeded = true, failed = true, cancelled = true,
}

-- A task's hash may hold any text when it was written around conveyor, and
-- Lua's tonumber takes 'nan', 'inf', '1e400' and '0x1f': arithmetic on one
-- of those, a ZADD of it or a string.format of it fails a script halfway
-- (Redis does not roll back what it already wrote), and an infinite lease
-- never expires. So every numeric field of a task is read through `number`:
-- nil unless finite and within the field's bounds, the bounds the SQL
-- stores hold by CHECK constraints and triggers (docs/guarantees.md, item
-- 16): counters 0 to 2,147,483,646, max_attempts 1 to 10^9 (as the API),
-- 32-bit priorities, times in years 1 to 9999 (ms), a lease of 0.5 s to
-- 100 years, a timeout up to 100 years.
-- {lowest, highest, integer, lowest excluded}
local MAX_SECONDS = 3155760000
local EARLIEST_MS, LATEST_MS = -62135510400000, 253402128000000
local MAX_COUNTER = 2147483646
local TIME_BOUNDS = {EARLIEST_MS, LATEST_MS, true}
local BOUNDS = {
  attempt = {0, MAX_COUNTER, true},
  spent = {0, MAX_COUNTER, true},
  max_attempts = {1, 1000000000, true},  -- conveyor.model.MAX_ATTEMPTS
  priority = {-2147483648, 2147483647, true},
  run_at = TIME_BOUNDS,
  created_at = TIME_BOUNDS,
  finished_at = TIME_BOUNDS,
  started_at = TIME_BOUNDS,
  lease_expires_at = TIME_BOUNDS,
  unique_until = TIME_BOUNDS,
  lease = {0.5, MAX_SECONDS, false},
  timeout = {0, MAX_SECONDS, false, true},
  parent_id = {1, 999999999999999, true},
  concurrency_limit = {1, 2147483647, true},
  rate_limit = {1, 2147483647, true},
  rate_period = {0, MAX_SECONDS, false, true},
}
local function number(field, text)
  local v = tonumber(text)
  local b = BOUNDS[field]
  if not v or v ~= v or v < b[1] or v > b[2] or (b[3] and v ~= math.floor(v))
      or (b[4] and v <= b[1]) then
    return nil
  end
  return v
end

-- Fields without which a task cannot run, nor be indexed.
local REQUIRED = {
  name = true, queue = true, payload = true, state = true, priority = true, run_at = true,
  attempt = true, spent = true, max_attempts = true, retry = true,
}
-- The first of `fields` whose value (in `values`, an HMGET's reply) does not
-- read, and that value (nil: missing): a required one missing, a name,
-- queue or state empty, a state unknown, a number out of its bounds. nil
-- when every one reads.
local function unreadable(fields, values)
  for i, field in ipairs(fields) do
    local text = values[i]
    if not text then
      if REQUIRED[field] then return field, nil end
    elseif BOUNDS[field] then
      if not number(field, text) then return field, text end
    elseif field == 'state' then
      if not STATES[text] then return field, text end
    elseif text == '' and (field == 'name' or field == 'queue') then
      return field, text
    end
  end
  return nil
end

-- Why a field does not read, for the attempt log (TEXTS from
-- conveyor.backends.stored, composed in front of this file): the stored
-- value cut short, its bytes beyond printable ASCII shown as '?'.
local function fill(template, holes)
  return (string.gsub(template, '{([%w_]+)}', function(hole) return holes[hole] end))
end
local function unread_message(field, value)
  local shown = 'missing'
  if value then
    shown = "'" .. string.sub((string.gsub(value, '[^%w%p ]', '?')), 1, 40) .. "'"
  end
  return fill(TEXTS.corrupt_field, {field = field, value = shown})
end

-- Concurrency keys and rate limits, defined in keys.lua (composed after
-- this file): a keyed pending task's indexes, and a keyed task's lease.
local index_keyed, unindex_keyed, drop_keyed

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

-- One command with many arguments after its key, in calls of CHUNK (an even
-- number: score and member pairs stay together), well below Lua's stack limit.
local CHUNK = 1000
local function call_chunked(command, key, values)
  for first = 1, #values, CHUNK do
    redis.call(command, key, unpack(values, first, math.min(first + CHUNK - 1, #values)))
  end
end

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

-- Every write of a task's state goes through here, so that the per-state
-- index (the inspector's lists) stays in step with the hashes, and a task
-- that leaves its unique scope gives its key up in the same script.
-- `scope` is the task's unique_scope when the caller read it already (false:
-- none), else nil (read here). Further arguments are more field/value pairs
-- of the task's hash, written with its state (one HSET).
local function move_state(id, from, to, scope, ...)
  if gathered then
    local key = tostring(id)
    if gathered.from[key] == nil then
      gathered.from[key] = from or false
      gathered.order[#gathered.order + 1] = key
    end
    gathered.to[key] = to
  elseif from ~= to then
    if from then redis.call('ZREM', key_state(from), id) end
    redis.call('ZADD', key_state(to), id, id)
  end
  local task = key_task(id)
  redis.call('HSET', task, 'state', to, ...)
  if scope == nil then scope = redis.call('HGET', task, 'unique_scope') end
  if scope and (TERMINAL[to] or (scope == 'pending' and to ~= 'pending')) then
    release_key(id)
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

-- A task ends in a terminal state `state` from `from` (scope, and further
-- field/value pairs: as move_state).
local function finish_task(id, from, state, now, scope, ...)
  move_state(id, from, state, scope, 'finished_at', now, ...)
  index_finished(id, state, now)
end

-- The task is no longer finished in `state` (retried, or deleted).
local function unmark_finished(id, state)
  local task = key_task(id)
  local finished_at = number('finished_at', redis.call('HGET', task, 'finished_at'))
  if finished_at and state then
    redis.call('ZREM', key_finished(state), finished_member(finished_at, id))
  end
  redis.call('HDEL', task, 'finished_at')
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
-- (index_keyed in keys.lua).
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

-- A task's fields, 22 arguments from index i of args (ARGV, or a spawn's
-- decoded array): name, queue, payload, priority, run_at (opt, ms), delay
-- (ms, used without run_at), max_attempts, retry policy (JSON), timeout
-- (opt, seconds), lease (opt, seconds), step (opt), inbox ("0"/"1"),
-- parent id (opt), first message (opt, JSON), unique key (opt), unique
-- scope (opt), unique period (opt, ms), on_conflict, concurrency key (opt),
-- concurrency limit (opt), rate limit (opt), rate period (opt, seconds),
-- trace context (opt, JSON text). Python checked them.
local TASK_FIELDS = 23

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

-- An optional argument's value (see opt), appended to a field list when given.
local function optional_field(fields, field, argument)
  local value = opt(argument)
  if value then
    fields[#fields + 1] = field
    fields[#fields + 1] = value
  end
  return value
end

-- Store a new pending task with this id (its first message from its parent,
-- which does not move a delayed start).
local function insert_task(id, a, i, now, adds)
  local name, queue = a[i], a[i + 1]
  local priority = tonumber(a[i + 3])
  local run_at = opt(a[i + 4])
  run_at = run_at and tonumber(run_at) or now + tonumber(a[i + 5])
  local key = key_task(id)
  local fields = {
    'name', name, 'queue', queue, 'payload', a[i + 2],
    'priority', a[i + 3], 'run_at', run_at, 'attempt', 0, 'spent', 0,
    'max_attempts', a[i + 6], 'retry', a[i + 7], 'created_at', now,
    'inbox', a[i + 11], 'cancel_requested', 0, 'state', 'pending',
  }
  optional_field(fields, 'timeout', a[i + 8])
  optional_field(fields, 'lease', a[i + 9])
  optional_field(fields, 'step', a[i + 10])
  local parent = optional_field(fields, 'parent_id', a[i + 12])
  local unique = optional_field(fields, 'idempotency_key', a[i + 14])
  if unique then
    optional_field(fields, 'unique_scope', a[i + 15])
    local period = opt(a[i + 16])
    if period then
      fields[#fields + 1] = 'unique_until'
      fields[#fields + 1] = now + tonumber(period)
    end
    redis.call('SET', key_unique(name, unique), id)
  end
  local flow_key = optional_field(fields, 'concurrency_key', a[i + 18])
  optional_field(fields, 'concurrency_limit', a[i + 19])
  optional_field(fields, 'rate_limit', a[i + 20])
  optional_field(fields, 'rate_period', a[i + 21])
  local trace = optional_field(fields, 'trace_context', a[i + 22])
  redis.call('HSET', key, unpack(fields))
  zadd(adds, key_state('pending'), id, id)  -- a new task gives no key up
  if parent then redis.call('ZADD', key_children(parent), id, id) end
  index_pending(id, queue, name, priority, run_at, now, flow_key or false, adds)
  local message = opt(a[i + 13])
  if message then append_message(id, parent, 'message', message, now, trace) end
end

-- The id of the stored task holding the unique key of the task at index i
-- of args that an enqueue with on_conflict "raise" may not pass, or nil
-- (reads only: an enqueue checks every task before it writes).
local function refused_key(a, i, now)
  local key = opt(a[i + 14])
  if not key or a[i + 17] ~= 'raise' then return nil end
  return key_holder(a[i], key, now)
end

-- An enqueue of a held key with on_conflict "replace": a pending holder
-- takes the new payload, priority and due time (its fields checked first;
-- one that does not read is left as it is, with a warning in the log).
local function replace_holder(id, a, i, now)
  local task = key_task(id)
  local f = redis.call('HMGET', task, 'state', 'queue', 'name', 'priority', 'run_at')
  if f[1] ~= 'pending' then return end
  local priority, run_at = number('priority', f[4]), number('run_at', f[5])
  if not (f[2] and f[3] and priority and run_at) then
    redis.log(redis.LOG_WARNING,
      'conveyor: task ' .. id .. ' of ' .. BASE .. ' not replaced, its fields do not read')
    return
  end
  unindex_pending(id, f[2], f[3], priority, run_at)
  local new_run_at = opt(a[i + 4])
  new_run_at = new_run_at and tonumber(new_run_at) or now + tonumber(a[i + 5])
  redis.call('HSET', task, 'payload', a[i + 2], 'priority', a[i + 3], 'run_at', new_run_at)
  index_pending(id, f[2], f[3], tonumber(a[i + 3]), new_run_at, now, nil, nil, true)
end

-- Task ids: INCR of {p}:ids, or the next of the ids a batch reserved at
-- once (reserve_ids); a reserved id a batch does not use (a task that met
-- its unique key's holder) is never given.
local function reserve_ids(count)
  if count <= 0 then return end
  reserved_last = redis.call('INCRBY', KEY_IDS, count)
  reserved_next = reserved_last - count + 1
end
local function new_id()
  if reserved_next <= reserved_last then
    reserved_next = reserved_next + 1
    return reserved_next - 1
  end
  return redis.call('INCR', KEY_IDS)
end

-- Store the task at index i of args, or find the holder of its unique key
-- (on_conflict "replace" updates a pending one); returns its id. `mine`
-- (when given) is the set of ids this enqueue stored: a key repeated in one
-- enqueue is its first task's, whatever the later one's on_conflict. `adds`
-- gathers a new task's index writes (see zadd).
local function store_task(a, i, now, mine, adds)
  local key = opt(a[i + 14])
  if key then
    local holder = key_holder(a[i], key, now)
    if holder then
      if not (mine and mine[holder]) and a[i + 17] == 'replace' then
        -- The holder leaves its ready set at once: this batch's gathered
        -- tasks must be in it first, or a set emptied of the holder alone
        -- would take its name out of the queue's ready names, and claims
        -- would not see this batch's tasks of that name.
        if adds then add_gathered(adds) end
        replace_holder(holder, a, i, now)
      end
      return tonumber(holder)
    end
    -- A key whose holder's period ended (or whose holder is gone) is free.
    local stale = redis.call('GET', key_unique(a[i], key))
    if stale then release_key(stale) end
  end
  local id = new_id()
  insert_task(id, a, i, now, adds)
  if mine then mine[tostring(id)] = true end
  return id
end

-- Store the batch of tasks of `batch`, one JSON array of TASK_FIELDS
-- strings per task, end to end (enqueue.lua, fire_schedule.lua: one argument
-- decoded in C, not thousands packed and parsed one by one): all of them,
-- or none if a task with on_conflict "raise" meets a held key (every one
-- checked before anything is written). Returns {1, the ids...}, or {0, the
-- index (0-based) of the first task refused, the holder's id}.
local function store_batch(batch, now)
  local a = cjson.decode(batch)
  local count = #a / TASK_FIELDS
  for n = 0, count - 1 do
    local holder = refused_key(a, 1 + n * TASK_FIELDS, now)
    if holder then return {0, n, tonumber(holder)} end
  end
  local ids, mine, adds = {1}, {}, {}
  reserve_ids(count)
  for n = 0, count - 1 do
    ids[#ids + 1] = store_task(a, 1 + n * TASK_FIELDS, now, mine, adds)
  end
  add_gathered(adds)
  return ids
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

-- A task reached a terminal state (its hash says so): its live parent gets
-- its end message, {"child", "name", "state", "result"}; a cancelled task's
-- live children are cancelled too (a running one has its cancel requested),
-- each of them ending in turn.
local cancel_task
ended = function(id, now)
  local f = redis.call('HMGET', key_task(id), 'parent_id', 'name', 'state', 'result')
  local parent = f[1]
  if parent then
    local parent_state = redis.call('HGET', key_task(parent), 'state')
    if parent_state and not TERMINAL[parent_state] then
      local body = '{"child":' .. id .. ',"name":' .. cjson.encode(f[2] or '')
        .. ',"state":' .. cjson.encode(f[3]) .. ',"result":' .. (f[4] or 'null') .. '}'
      deliver(parent, id, 'end', body, now)
    end
  end
  if f[3] == 'cancelled' then
    for _, child in ipairs(redis.call('ZRANGE', key_children(id), 0, -1)) do
      cancel_task(child, now)
    end
  end
end

-- Cancel one task: a pending or waiting one ends cancelled at once, a
-- running one has its cancel requested. Returns its state after, or nil
-- when it is finished (or missing); an error reply, before any write, when
-- a pending one's index fields do not read.
cancel_task = function(id, now)
  local key = key_task(id)
  local f = redis.call('HMGET', key, 'state', 'queue', 'name', 'priority', 'run_at')
  local state = f[1]
  if state == 'pending' or state == 'waiting' then
    local priority, run_at = number('priority', f[4]), number('run_at', f[5])
    if not (f[2] and f[3] and priority and run_at) then
      redis.log(redis.LOG_WARNING, 'conveyor: task ' .. id .. ' of ' .. BASE
        .. ' not cancelled, its queue, name, priority or run_at does not read')
      return nil
    end
    unindex_pending(id, f[2], f[3], priority, run_at)
    finish_task(id, state, 'cancelled', now)
    ended(id, now)
    return 'cancelled'
  end
  if state == 'in_progress' then
    redis.call('HSET', key, 'cancel_requested', 1)
    redis.call('PUBLISH', CHANNEL_CANCEL, id)
    return 'in_progress'
  end
  return nil
end

-- A failed or cancelled task is pending again, due now, with a fresh budget
-- (attempt numbers go on), no result and no cancel request; the caller
-- checked its queue, name and priority read.
local function retry_task(id, state, queue, name, priority, now)
  unmark_finished(id, state)
  move_state(id, state, 'pending')
  local key = key_task(id)
  redis.call('HSET', key, 'spent', 0, 'run_at', now, 'cancel_requested', 0)
  redis.call('HDEL', key, 'result')
  index_pending(id, queue, name, priority, now, now)
end

local ALIVE = {pending = true, in_progress = true, waiting = true}

-- A bulk action's selection (retry_many, cancel_many, delete_many), read in
-- the script that acts on it, so that a task whose state changed since a
-- caller listed it is judged by its state now: the tasks in `states` with
-- ids above `after` (among `ids`, a list of decimal texts, repeats
-- allowed, when given), of `name` and `queue` and created in [since, before) where given
-- (each nil when not), at most `limit`, ascending by id, each once as {id,
-- state, queue, name, priority}. A task whose queue, name, created_at or
-- priority does not read is passed over.
--
-- Cost: with ids, one hash per id; without, each state's index is walked
-- by id from `after`, SELECT_PAGE ids at a time, until `limit` tasks match:
-- a rare name or queue costs a walk of that state's tasks.
local SELECT_PAGE = 200
local function select_tasks(states, after, limit, name, queue, since, before, ids)
  local chosen = {}
  local function take(id, state)
    local f = redis.call('HMGET', key_task(id), 'name', 'queue', 'created_at', 'priority', 'state')
    local created, priority = number('created_at', f[3]), number('priority', f[4])
    if f[5] == state and f[1] and f[2] and priority and created
        and (not name or f[1] == name) and (not queue or f[2] == queue)
        and (not since or created >= since) and (not before or created < before) then
      chosen[#chosen + 1] = {tonumber(id), state, f[2], f[1], priority}
      return true
    end
    return false
  end
  if ids then
    local wanted = {}
    for _, state in ipairs(states) do wanted[state] = true end
    table.sort(ids, function(a, b) return tonumber(a) < tonumber(b) end)
    local last
    for _, id in ipairs(ids) do
      if #chosen >= limit then break end
      local given = tonumber(id)
      local state = given ~= last and given > after
        and redis.call('HGET', key_task(id), 'state')
      if state and wanted[state] then take(id, state) end
      last = given
    end
    return chosen
  end
  for _, state in ipairs(states) do
    local found, low = 0, '(' .. after
    while found < limit do
      local page = redis.call('ZRANGEBYSCORE', key_state(state), low, '+inf',
        'LIMIT', 0, SELECT_PAGE)
      if #page == 0 then break end
      for _, id in ipairs(page) do
        if take(id, state) then
          found = found + 1
          if found >= limit then break end
        end
      end
      low = '(' .. page[#page]
    end
  end
  table.sort(chosen, function(a, b) return a[1] < b[1] end)
  for i = #chosen, limit + 1, -1 do chosen[i] = nil end
  return chosen
end

-- The selection of a bulk action from its arguments `args` (ARGV), from
-- index i on: after, limit, name (opt), queue (opt), since (opt, ms), until
-- (opt, ms), ids (opt, a JSON array of decimal texts), then the states.
local function selection_args(args, i)
  local states = {}
  for s = i + 7, #args do states[#states + 1] = args[s] end
  local ids = opt(args[i + 6])
  return select_tasks(states, tonumber(args[i]), tonumber(args[i + 1]), opt(args[i + 2]),
    opt(args[i + 3]), tonumber(opt(args[i + 4]) or ''), tonumber(opt(args[i + 5]) or ''),
    ids and cjson.decode(ids))
end

-- The state of task id's parent, or nil (no parent, or a parent gone).
local function parent_state(id)
  local parent = redis.call('HGET', key_task(id), 'parent_id')
  return parent and redis.call('HGET', key_task(parent), 'state') or nil
end

-- Delete a task that is not running, with everything stored for it: its
-- attempt log, inbox, send keys, unique key and index entries; its
-- children lose their parent. The caller checked that a pending one's
-- index fields read.
local function forget_task(id)
  local key = key_task(id)
  local f = redis.call('HMGET', key, 'state', 'queue', 'name', 'priority', 'run_at', 'parent_id')
  local state, queue = f[1], f[2]
  if state == 'pending' then
    unindex_pending(id, queue, f[3], number('priority', f[4]), number('run_at', f[5]))
  elseif queue then
    redis.call('ZREM', key_leases(queue), id)
    drop_keyed(id)
  end
  unmark_finished(id, state)
  if state then redis.call('ZREM', key_state(state), id) end
  release_key(id)
  if f[6] then redis.call('ZREM', key_children(f[6]), id) end
  for _, child in ipairs(redis.call('ZRANGE', key_children(id), 0, -1)) do
    redis.call('HDEL', key_task(child), 'parent_id')
  end
  redis.call('SREM', KEY_CORRUPT, id)
  redis.call('DEL', key, key_attempts(id), key_inbox(id), key_sent(id), key_children(id))
end

-- Retention: the ids (up to `limit`; nil for no limit) of the tasks finished
-- in `state` before `before`, oldest finish first (ids breaking ties), but
-- never a child of a live parent (it may read the child's end yet), read a
-- page at a time from the state's finished index.
local function prunable(state, before, limit)
  local found, offset, cutoff = {}, 0, finished_cutoff(before)
  while not limit or #found < limit do
    local page = redis.call('ZRANGEBYLEX', key_finished(state), '-', cutoff, 'LIMIT', offset, 200)
    if #page == 0 then break end
    offset = offset + #page
    for _, member in ipairs(page) do
      local id = member_id(member)
      if not ALIVE[parent_state(id) or ''] then
        found[#found + 1] = id
        if limit and #found >= limit then break end
      end
    end
  end
  return found
end

-- The ids of the workers stopped (or, never stopped, last seen) before
-- `before`: every registered worker is read.
local function old_workers(before)
  local found = {}
  for _, id in ipairs(redis.call('ZRANGE', KEY_WORKERS, 0, -1)) do
    local f = redis.call('HMGET', key_worker(id), 'stopped_at', 'last_seen_at')
    local last = tonumber(f[1]) or tonumber(f[2])
    if last and last < before then found[#found + 1] = id end
  end
  return found
end
