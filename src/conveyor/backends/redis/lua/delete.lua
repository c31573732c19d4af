-- delete: take a task and everything stored for it (forget_task in
-- lib/controls.lua), never a running one, nor an unfinished child of a live
-- parent (that parent waits for its end), nor a task an unfinished dependent
-- waits for (awaited: it reads its outcome). ARGV: task id. Returns {1},
-- {0, its state or "" (missing), its parent's state or ""}, or {2} (awaited).
local id = ARGV[1]
local f = redis.call('HMGET', key_task(id), 'state', 'queue', 'name', 'priority', 'run_at')
local state = f[1]
if not state then return {0, '', ''} end
local parent = parent_state(id)
if state == 'in_progress' or (not TERMINAL[state] and parent and ALIVE[parent]) then
  return {0, state, parent or ''}
end
if awaited(id) then return {2} end
if state == 'pending'
    and not (f[2] and f[3] and number('priority', f[4]) and number('run_at', f[5])) then
  return redis.error_reply(
    'task ' .. id .. ' is corrupt: its queue, name, priority or run_at does not read')
end
forget_task(id)
return {1}
