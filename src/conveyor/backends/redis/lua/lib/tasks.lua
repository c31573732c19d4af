-- tasks.lua: every move of a task's state, and its end.

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
