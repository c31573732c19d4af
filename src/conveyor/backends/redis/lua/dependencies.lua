-- dependencies (reads only): a task's edges in the order given, each with
-- what its dependency's record needs (conveyor.backends.stored's
-- dependency_record), read at one moment. ARGV: task id. Returns one array
-- per edge: the dependency's id, "1" when the edge is settled else "0", then,
-- when the dependency is still stored, its name, state and result (each opt)
-- and the last row of its attempt log (opt: every row there is an ended
-- attempt; the running one lives in the task's hash).
local id = ARGV[1]
local edges = redis.call('LRANGE', key_after(id), 0, -1)
if #edges == 0 then return {} end
local settled = {}
for _, position in ipairs(redis.call('SMEMBERS', key_settled(id))) do
  settled[tonumber(position) + 1] = true
end
local function optional(value)
  if not value then return '' end
  return '=' .. value
end
local found = {}
for position, dependency in ipairs(edges) do
  local row = {dependency, settled[position] and '1' or '0'}
  local f = redis.call('HMGET', key_task(dependency), 'name', 'state', 'result')
  if f[2] then
    row[3] = optional(f[1])
    row[4] = optional(f[2])
    row[5] = optional(f[3])
    row[6] = optional(redis.call('LINDEX', key_attempts(dependency), -1))
  end
  found[#found + 1] = row
end
return found
