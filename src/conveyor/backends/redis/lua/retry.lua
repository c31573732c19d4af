-- retry: a failed or cancelled task is pending again, due now, with a fresh
-- budget (attempt numbers go on), no result and no cancel request.
-- ARGV: now, task id. Returns as cancel.lua does.
local now = clock(ARGV[1])
local id = ARGV[2]
local f = redis.call('HMGET', key_task(id), 'state', 'queue', 'name', 'priority')
local state = f[1]
if not state then return {'', ''} end
if state ~= 'failed' and state ~= 'cancelled' then return {'', state} end
if not (f[2] and f[3] and number('priority', f[4])) then
  return redis.error_reply('task ' .. id .. ' is corrupt: its queue, name or priority does not read')
end
retry_task(id, state, f[2], f[3], number('priority', f[4]), now)
return {'pending', ''}
