-- open: mark a new store with this layout's version, or convert a store of
-- an older layout this one upgrades, in one script (so two processes that
-- open one store at once convert it once). Returns the store's layout after.
--
-- ARGV: this layout's version, then the versions it upgrades.
--
-- Layouts 3 and 4 kept a running attempt as the last row of its task's log,
-- with outcome in_progress; this one keeps it in the task's hash (see
-- close_attempt), and has no index of every task ({p}:tasks). The
-- conversion moves each running task's row into its hash (started_at),
-- reading every task of the in_progress index once, and deletes {p}:tasks.
-- Stop the workers of the older version first: they would write rows this
-- one does not read.
local version = ARGV[1]
local found = redis.call('GET', KEY_LAYOUT)
if not found then
  redis.call('SET', KEY_LAYOUT, version)
  return version
end
local upgrades = false
for i = 2, #ARGV do
  if found == ARGV[i] then upgrades = true end
end
if not upgrades then return found end
for _, id in ipairs(redis.call('ZRANGE', key_state('in_progress'), 0, -1)) do
  local text = redis.call('LINDEX', key_attempts(id), -1)
  local ok, row = pcall(cjson.decode, text or '')
  if ok and type(row) == 'table' and row.outcome == 'in_progress' and tonumber(row.started_at) then
    redis.call('RPOP', key_attempts(id))
    redis.call('HSET', key_task(id), 'started_at', row.started_at)
  else
    redis.log(redis.LOG_WARNING, 'conveyor: task ' .. id .. ' of ' .. BASE
      .. ' has no running attempt row to convert; a claim will set it aside')
  end
end
-- The index of every task is gone too: the per-state indexes serve its reads.
redis.call('DEL', KEY_TASKS)
redis.call('SET', KEY_LAYOUT, version)
return version
