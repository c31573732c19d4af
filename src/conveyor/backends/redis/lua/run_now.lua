-- run_now: a pending task becomes due now (never later), and its queue is
-- woken. ARGV: now, task id. Returns as cancel.lua does.
local now = clock(ARGV[1])
local id = ARGV[2]
local key = key_task(id)
local f = redis.call('HMGET', key, 'state', 'queue', 'name', 'priority', 'run_at')
local state = f[1]
if not state then return {'', ''} end
if state ~= 'pending' then return {'', state} end
local priority, run_at = number('priority', f[4]), number('run_at', f[5])
if not (f[2] and f[3] and priority and run_at) then
  return redis.error_reply(
    'task ' .. id .. ' is corrupt: its queue, name, priority or run_at does not read')
end
if run_at > now then
  unindex_pending(id, f[2], f[3], priority, run_at)
  redis.call('HSET', key, 'run_at', now)
  index_pending(id, f[2], f[3], priority, now, now, nil, nil, true)
end
woke(f[2])
return {'pending', ''}
