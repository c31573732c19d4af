-- enqueue.lua: new tasks, their ids and unique keys.

-- A task's fields, 24 arguments from index i of args (ARGV, or a spawn's
-- decoded array): name, queue, payload, priority, run_at (opt, ms), delay
-- (ms, used without run_at), max_attempts, retry policy (JSON), timeout
-- (opt, seconds), lease (opt, seconds), step (opt), inbox ("0"/"1"),
-- parent id (opt), first message (opt, JSON), unique key (opt), unique
-- scope (opt), unique period (opt, ms), on_conflict, concurrency key (opt),
-- concurrency limit (opt), rate limit (opt), rate period (opt, seconds),
-- trace context (opt, JSON text), expiry time (opt, ms), dependencies (opt:
-- the `after` entries as decimal texts separated by spaces, a negative one
-- the index -1 - n of an earlier task of the same enqueue), after_policy,
-- receives (opt). Python checked them.
local TASK_FIELDS = 27

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
-- which does not move a delayed start); one with dependencies is stored
-- waiting for them (waiting_for: their number), in no index of its queue
-- (wait_for in this file writes its edges).
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
    'inbox', a[i + 11], 'cancel_requested', 0,
  }
  local after = opt(a[i + 24])
  local state = after and 'waiting' or 'pending'
  fields[#fields + 1] = 'state'
  fields[#fields + 1] = state
  if after then
    local count = 0
    for _ in string.gmatch(after, '%S+') do count = count + 1 end
    fields[#fields + 1] = 'waiting_for'
    fields[#fields + 1] = count
    fields[#fields + 1] = 'after_policy'
    fields[#fields + 1] = a[i + 25]
  end
  optional_field(fields, 'receives', a[i + 26])
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
  optional_field(fields, 'expires_at', a[i + 23])
  redis.call('HSET', key, unpack(fields))
  zadd(adds, key_state(state), id, id)  -- a new task gives no key up
  if parent then redis.call('ZADD', key_children(parent), id, id) end
  if not after then
    index_pending(id, queue, name, priority, run_at, now, flow_key or false, adds)
  end
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
-- (on_conflict "replace" updates a pending one); returns its id, and true
-- when this call stored it. `mine`
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
  return id, true
end

-- Dependencies (controls.lua): a dependency that ended settles its edges.
local settle_dependents

-- The first stored id among the dependencies of the batch `a` that names no
-- task, or nil (reads only: an enqueue checks every task before it writes).
local function unknown_dependency(a, count)
  for n = 0, count - 1 do
    local after = opt(a[n * TASK_FIELDS + 25])
    if after then
      for reference in string.gmatch(after, '%S+') do
        if tonumber(reference) > 0 and redis.call('EXISTS', key_task(reference)) == 0 then
          return reference
        end
      end
    end
  end
  return nil
end

-- Task id, just stored waiting, waits for the tasks `after` names (see
-- TASK_FIELDS; `ids` the ids of the batch so far, from ids[2]): one edge per
-- entry, in order ({p}:after:ID), each dependency marked as having
-- dependents; then the dependencies ended already count, in order, as if
-- they ended now (which may end it by its policy, and its own dependents in
-- turn). `adds` (the batch's gathered index writes) is written first then.
local function wait_for(id, after, ids, now, adds)
  local edges, seen, order = {}, {}, {}
  for reference in string.gmatch(after, '%S+') do
    local n = tonumber(reference)
    local dependency = reference
    if n < 0 then dependency = string.format('%d', ids[1 - n]) end
    edges[#edges + 1] = dependency
    if not seen[dependency] then
      seen[dependency] = true
      order[#order + 1] = dependency
    end
    -- The edge, as its dependency's end finds it: DEPENDENT:POSITION.
    redis.call('ZADD', key_dependents(dependency), id, id .. ':' .. (#edges - 1))
  end
  call_chunked('RPUSH', key_after(id), edges)
  for _, dependency in ipairs(order) do
    redis.call('HSET', key_task(dependency), 'dependents', 1)
  end
  for _, dependency in ipairs(order) do
    local state = redis.call('HGET', key_task(dependency), 'state')
    if TERMINAL[state] then
      add_gathered(adds)
      settle_dependents(dependency, state, now)
    end
  end
end

-- Store the batch of tasks of `batch`, one JSON array of TASK_FIELDS
-- strings per task, end to end (enqueue.lua, fire_schedule.lua: one argument
-- decoded in C, not thousands packed and parsed one by one): all of them,
-- or none if a task with on_conflict "raise" meets a held key or a
-- dependency names no stored task (every one checked before anything is
-- written). A task stored with dependencies waits for them (wait_for); one
-- that met its key's holder stores no edge. Returns {1, the ids...}, {0, the
-- index (0-based) of the first task refused, the holder's id}, or {3, the
-- id of a dependency not stored}.
local function store_batch(batch, now)
  local a = cjson.decode(batch)
  local count = #a / TASK_FIELDS
  local unknown = unknown_dependency(a, count)  -- first, as every store orders them
  if unknown then return {3, unknown} end
  for n = 0, count - 1 do
    local holder = refused_key(a, 1 + n * TASK_FIELDS, now)
    if holder then return {0, n, tonumber(holder)} end
  end
  local ids, mine, adds, waiting = {1}, {}, {}, {}
  reserve_ids(count)
  for n = 0, count - 1 do
    local i = 1 + n * TASK_FIELDS
    local id, stored = store_task(a, i, now, mine, adds)
    local after = stored and opt(a[i + 24])
    if after then waiting[#waiting + 1] = {id, after} end
    ids[#ids + 1] = id
  end
  -- Every task is stored before any edge counts an end (as on the SQL
  -- stores): a task its dependencies end at once gives its unique key up
  -- only after the batch's other tasks met it.
  for _, one in ipairs(waiting) do wait_for(one[1], one[2], ids, now, adds) end
  add_gathered(adds)
  return ids
end
