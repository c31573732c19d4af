-- maintenance.lua: retention of finished tasks and stopped workers.

-- Retention: the ids (up to `limit`; nil for no limit) of the tasks finished
-- in `state` before `before`, oldest finish first (ids breaking ties), but
-- never a child of a live parent (it may read the child's end yet), nor a
-- task an unfinished dependent waits for (awaited in controls.lua), read a
-- page at a time from the state's finished index.
local function prunable(state, before, limit)
  local found, offset, cutoff = {}, 0, finished_cutoff(before)
  while not limit or #found < limit do
    local page = redis.call('ZRANGEBYLEX', key_finished(state), '-', cutoff, 'LIMIT', offset, 200)
    if #page == 0 then break end
    offset = offset + #page
    for _, member in ipairs(page) do
      local id = member_id(member)
      if not ALIVE[parent_state(id) or ''] and not awaited(id) then
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
