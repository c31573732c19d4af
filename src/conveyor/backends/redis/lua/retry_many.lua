-- retry_many: one batch of a bulk retry. Tasks in the given states with ids
-- above `after`, of this name and queue and created in [since, until) where
-- given, at most `limit`, oldest first, each retried as retry.lua does. A
-- task whose queue, name or priority does not read is passed over.
-- ARGV: now, after, limit, name (opt), queue (opt), since (opt, ms), until
-- (opt, ms), then the states (failed, cancelled). Returns the ids retried.
--
-- Cost: each state's index is walked by id from `after`, PAGE ids at a
-- time, until `limit` tasks match: a rare name or queue costs a walk of
-- that state's tasks.
local PAGE = 200
local now = clock(ARGV[1])
local after, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
local name, queue = opt(ARGV[4]), opt(ARGV[5])
local since, before = tonumber(opt(ARGV[6]) or ''), tonumber(opt(ARGV[7]) or '')
local chosen = {}
for s = 8, #ARGV do
  local state, found, low = ARGV[s], 0, '(' .. after
  while found < limit do
    local ids = redis.call('ZRANGEBYSCORE', key_state(state), low, '+inf', 'LIMIT', 0, PAGE)
    if #ids == 0 then break end
    for _, id in ipairs(ids) do
      local f = redis.call('HMGET', key_task(id), 'name', 'queue', 'created_at', 'priority')
      local created = number('created_at', f[3])
      if f[1] and f[2] and number('priority', f[4]) and created
          and (not name or f[1] == name) and (not queue or f[2] == queue)
          and (not since or created >= since) and (not before or created < before) then
        chosen[#chosen + 1] = {tonumber(id), state, f[2], f[1], number('priority', f[4])}
        found = found + 1
        if found >= limit then break end
      end
    end
    low = '(' .. ids[#ids]
  end
end
table.sort(chosen, function(a, b) return a[1] < b[1] end)
local retried = {}
for i = 1, math.min(limit, #chosen) do
  local id, state, task_queue, task_name, priority = unpack(chosen[i])
  retry_task(id, state, task_queue, task_name, priority, now)
  retried[#retried + 1] = id
end
return retried
