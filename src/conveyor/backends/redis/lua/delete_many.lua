-- delete_many: one batch of a bulk delete (finished tasks only: no parent
-- waits for them), the tasks chosen in this script (select_tasks in
-- lib/controls.lua), each taken with everything stored for it as delete.lua
-- does; a task an unfinished dependent waits for is passed by (awaited in
-- lib/controls.lua). ARGV: the selection (selection_args). Returns the ids
-- deleted.
local deleted = {}
for _, task in ipairs(selection_args(ARGV, 1)) do
  local id, state = task[1], task[2]
  if TERMINAL[state] and not awaited(id) then
    forget_task(id)
    deleted[#deleted + 1] = id
  end
end
return deleted
