-- heartbeat: extend exactly the leases this worker still holds (this
-- attempt, this worker, this claim's nonce, not expired) by the task's lease
-- length, else the heartbeat's. ARGV: now, worker id, lease (seconds), then
-- a task id, an attempt number and a nonce per lease. Returns per lease 0
-- (lost), 1 (renewed) or 2 (renewed, and its task's cancel was requested),
-- then 1 if the worker is registered (marked seen now), else 0 (the store
-- forgot it: the worker registers again). A held task whose own lease
-- does not read is set aside (0: its worker stops it).
local now = clock(ARGV[1])
local worker = ARGV[2]
local registered = redis.call('EXISTS', key_worker(worker))
if registered == 1 then
  redis.call('HSET', key_worker(worker), 'last_seen_at', now)
end
local default_lease = tonumber(ARGV[3])
local found = {}
for i = 4, #ARGV, 3 do
  local id, attempt = ARGV[i], tonumber(ARGV[i + 1])
  local key = key_task(id)
  local f = redis.call('HMGET', key,
    'state', 'attempt', 'worker_id', 'lease_expires_at', 'lease', 'queue', 'cancel_requested',
    'concurrency_key', 'nonce')
  local expires = number('lease_expires_at', f[4])
  local flag = 0
  if f[1] == 'in_progress' and number('attempt', f[2]) == attempt and f[3] == worker
      and f[9] == ARGV[i + 2] and expires and expires > now and f[6] then
    -- A lease of its own that does not read (written around conveyor since
    -- the claim) sets the task aside: no lease can be computed from it.
    if f[5] and not number('lease', f[5]) then
      set_aside(id, f[6], worker, unread_message('lease', f[5]), now)
    else
      local lease = number('lease', f[5]) or default_lease
      expires = now + math.floor(lease * 1000 + 0.5)
      redis.call('HSET', key, 'lease_expires_at', expires)
      redis.call('ZADD', key_leases(f[6]), expires, id)
      if f[8] then lease_keyed(id, f[8], expires) end
      flag = f[7] == '1' and 2 or 1
    end
  end
  found[#found + 1] = flag
end
found[#found + 1] = registered
return found
