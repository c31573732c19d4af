-- cancel_many: one batch of a bulk cancel (pending, waiting or running
-- tasks), the tasks chosen in this script (select_tasks in lib/controls.lua), each
-- cancelled as cancel.lua does (a running one has its cancel requested and
-- its worker told; a cancelled one's live children are cancelled too).
-- ARGV: now, then the selection (selection_args). Returns the ids
-- cancelled (a task whose index fields do not read is passed over).
local now = clock(ARGV[1])
local cancelled = {}
for _, task in ipairs(selection_args(ARGV, 2)) do
  local id = task[1]
  -- A task that a cancel earlier in this batch moved is judged as it is now:
  -- one it cancelled (a child with its parent, a dependent by its policy)
  -- counts too; one it made pending (a dependent under `run` whose last
  -- dependency that was) is cancelled as well.
  if redis.call('HGET', key_task(id), 'state') == 'cancelled' or cancel_task(id, now) then
    cancelled[#cancelled + 1] = id
  end
end
return cancelled
