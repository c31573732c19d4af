-- cancel: a pending (or waiting) task ends cancelled at once; a running one
-- stays in_progress with its cancel requested (its worker hears of it at its
-- next heartbeat; a claim that finds its lease expired ends it cancelled).
-- A task that ends cancelled sends its end message to its live parent, and
-- its live children are cancelled in turn (see ended in lib/controls.lua).
-- ARGV: now, task id. Returns {state after, ""} when it changed something,
-- else {"", current state} ("" too when there is no such task).
local now = clock(ARGV[1])
local id = ARGV[2]
local f = redis.call('HMGET', key_task(id), 'state', 'queue', 'name', 'priority', 'run_at')
local state = f[1]
if not state then return {'', ''} end
if (state == 'pending' or state == 'waiting')
    and not (f[2] and f[3] and number('priority', f[4]) and number('run_at', f[5])) then
  return redis.error_reply(
    'task ' .. id .. ' is corrupt: its queue, name, priority or run_at does not read')
end
local after = cancel_task(id, now)
if after then return {after, ''} end
return {'', state}
