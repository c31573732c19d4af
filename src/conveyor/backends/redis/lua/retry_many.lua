-- retry_many: one batch of a bulk retry (failed or cancelled tasks), the
-- tasks chosen in this script (select_tasks in lib/controls.lua), each retried as
-- retry.lua does. ARGV: now, then the selection (selection_args). Returns
-- the ids retried.
local now = clock(ARGV[1])
local retried = {}
for _, task in ipairs(selection_args(ARGV, 2)) do
  local id, state, queue, name, priority = unpack(task)
  retry_task(id, state, queue, name, priority, now)
  retried[#retried + 1] = id
end
return retried
