-- controls.lua: a task's end, cancels, retries, bulk selections and deletes.

-- Dependencies. A dependent's edges are the ids of {p}:after:ID in the order
-- given, the positions (from 0) of those settled in {p}:settled:ID; each
-- dependency lists its dependents in {p}:dependents:ID and its hash says
-- `dependents` = 1, so that the end of a task nothing depends on reads no
-- edge. A dependent still waiting with waiting_for > 0 counts a dependency's
-- end (count_end): one that succeeded, or any end under the policy `run`,
-- takes one off waiting_for, and the last makes it pending, due at the later
-- of now and its own run_at, its queue woken (index_pending); one that
-- failed or was cancelled ends it cancelled (policy `cancel`) or failed
-- (`fail`). Returns true when it ended it. A dependent whose queue, name,
-- priority or run_at does not read is set aside rather than made pending.
local RELEASED = {'queue', 'name', 'priority', 'run_at'}
local function count_end(id, state, now)
  local key = key_task(id)
  local f = redis.call('HMGET', key, 'state', 'waiting_for', 'after_policy',
    'queue', 'name', 'priority', 'run_at')
  local waiting_for = number('waiting_for', f[2])
  if f[1] ~= 'waiting' or not waiting_for or waiting_for <= 0 then return false end
  if state == 'succeeded' or f[3] == 'run' then
    waiting_for = waiting_for - 1
    if waiting_for > 0 then
      redis.call('HSET', key, 'waiting_for', waiting_for)
      return false
    end
    local read = {f[4], f[5], f[6], f[7]}
    local field, value = unreadable(RELEASED, read)
    if field then
      redis.call('HSET', key, 'waiting_for', 0)
      set_aside(id, f[4] or '', '', unread_message(field, value), now)
      return false
    end
    local run_at = math.max(number('run_at', f[7]), now)
    move_state(id, 'waiting', 'pending', nil, 'waiting_for', 0, 'run_at', run_at)
    index_pending(id, f[4], f[5], number('priority', f[6]), run_at, now)
    return false
  end
  finish_task(id, 'waiting', f[3] == 'fail' and 'failed' or 'cancelled', now)
  return true
end

-- Task id ended in `state`: every edge to it not settled yet is settled, and
-- its dependent counts it (count_end); the dependents this ends join `out`
-- (their own ends are the caller's). Each edge to it is a member
-- "DEPENDENT:POSITION" of {p}:dependents:ID, so an end costs one step per
-- edge to it, whatever the number of its dependent's other edges (a
-- chord's callback has one per member).
local function settle_edges(id, state, now, out)
  local text = string.format('%d', tonumber(id))
  for _, edge in ipairs(redis.call('ZRANGE', key_dependents(text), 0, -1)) do
    local dependent, position = string.match(edge, '^(%d+):(%d+)$')
    if dependent and redis.call('SADD', key_settled(dependent), position) == 1
        and count_end(dependent, state, now) then
      out[#out + 1] = dependent
    end
  end
end

-- A task reached a terminal state (its hash says so): its live parent gets
-- its end message, {"child", "name", "state", "result"}; a cancelled task's
-- live children are cancelled too (a running one has its cancel requested),
-- each of them ending in turn; its dependents count its end (settle_edges),
-- and those this ends move theirs in turn: a worklist, not a recursion, as
-- a chain of dependents may be long. Every path that ends a task calls this
-- (a completion, a cancel, a claim's end of an expired lease, a task set
-- aside, a dependent ended by its policy).
local cancel_task
ended = function(id, now)
  local work = {id}
  while #work > 0 do
    local one = table.remove(work)
    local f = redis.call('HMGET', key_task(one), 'parent_id', 'name', 'state', 'result',
      'dependents')
    local parent = f[1]
    if parent then
      local parent_state = redis.call('HGET', key_task(parent), 'state')
      if parent_state and not TERMINAL[parent_state] then
        local body = '{"child":' .. one .. ',"name":' .. cjson.encode(f[2] or '')
          .. ',"state":' .. cjson.encode(f[3]) .. ',"result":' .. (f[4] or 'null') .. '}'
        deliver(parent, one, 'end', body, now)
      end
    end
    if f[3] == 'cancelled' then
      for _, child in ipairs(redis.call('ZRANGE', key_children(one), 0, -1)) do
        cancel_task(child, now)
      end
    end
    if f[5] == '1' and TERMINAL[f[3]] then settle_edges(one, f[3], now, work) end
  end
end

-- A dependency found ended when its dependent is stored (wait_for in
-- enqueue.lua): its edges not settled yet count it now, as ended would.
settle_dependents = function(id, state, now)
  local work = {}
  settle_edges(id, state, now, work)
  for _, one in ipairs(work) do ended(one, now) end
end

-- Whether an unfinished task (pending, running or waiting) depends on task
-- id, which then is neither deleted nor pruned: that task may read its
-- outcome yet. `flag` is its `dependents` field when the caller read it.
local ALIVE = {pending = true, in_progress = true, waiting = true}
local function awaited(id, flag)
  if flag == nil then flag = redis.call('HGET', key_task(id), 'dependents') end
  if flag ~= '1' then return false end
  for _, edge in ipairs(redis.call('ZRANGE', key_dependents(id), 0, -1)) do
    local dependent = string.match(edge, '^(%d+):')
    if dependent and ALIVE[redis.call('HGET', key_task(dependent), 'state') or ''] then
      return true
    end
  end
  return false
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
-- attempt log, inbox, send keys, unique key, index entries and its own
-- edges (edges of its dependents to it stay: they read it as no longer
-- stored); its children lose their parent. The caller checked that a
-- pending one's index fields read.
local function forget_task(id)
  local key = key_task(id)
  local f = redis.call('HMGET', key, 'state', 'queue', 'name', 'priority', 'run_at', 'parent_id',
    'waiting_for', 'dependents')
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
  if f[7] then
    for position, dependency in ipairs(redis.call('LRANGE', key_after(id), 0, -1)) do
      redis.call('ZREM', key_dependents(dependency), id .. ':' .. (position - 1))
    end
    redis.call('DEL', key_after(id), key_settled(id))
  end
  if f[8] then redis.call('DEL', key_dependents(id)) end
end
