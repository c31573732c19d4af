-- cancel_many: one batch of a bulk cancel (pending, waiting or running
-- tasks), the tasks chosen in this script (select_tasks in lib/controls.lua), each
-- cancelled as cancel.lua does (a running one has its cancel requested and
-- its worker told; a cancelled one's live children are cancelled too).
-- ARGV: now, then the selection (selection_args). Returns the ids
-- cancelled (a task whose index fields do not read is passed over).
local now = clock(ARGV[1])
local cancelled = {}
for _, task in ipairs(selection_args(ARGV, 2)) do
  local id, state = task[1], task[2]
  -- A child cancelled with its parent earlier in this batch counts too.
  if redis.call('HGET', key_task(id), 'state') ~= state or cancel_task(id, now) then
    cancelled[#cancelled + 1] = id
  end
end
return cancelled
