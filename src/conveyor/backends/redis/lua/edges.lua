-- edges (reads only): every edge whose dependent or dependency is among the
-- task ids of ARGV, each once, read at one moment. Returns one array per
-- edge: {DEPENDENT, POSITION (from 0), DEPENDENCY, "1" when settled else
-- "0"}, in no order (the caller sorts). A task's own edges are its
-- {p}:after:ID list with its {p}:settled:ID set; the edges to it are the
-- members "DEPENDENT:POSITION" of {p}:dependents:ID, which a delete of the
-- task removes: the edges of a dependency no longer stored are found from
-- their dependents' side only. Ids stay text (a Lua number holds 53 bits).
local seen = {}
local found = {}
local function add(dependent, position, dependency, settled)
  local edge = dependent .. ':' .. position
  if seen[edge] then return end
  seen[edge] = true
  found[#found + 1] = {dependent, position, dependency, settled and '1' or '0'}
end
for _, id in ipairs(ARGV) do
  local after = redis.call('LRANGE', key_after(id), 0, -1)
  if #after > 0 then
    local settled = {}
    for _, position in ipairs(redis.call('SMEMBERS', key_settled(id))) do
      settled[position] = true
    end
    for index, dependency in ipairs(after) do
      local position = tostring(index - 1)
      add(id, position, dependency, settled[position])
    end
  end
  for _, edge in ipairs(redis.call('ZRANGE', key_dependents(id), 0, -1)) do
    local dependent, position = string.match(edge, '^(%d+):(%d+)$')
    if dependent and not seen[edge] then
      add(dependent, position, id,
          redis.call('SISMEMBER', key_settled(dependent), position) == 1)
    end
  end
end
return found
