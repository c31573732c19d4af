-- stop_worker: a registered worker is stopped, and seen, now; an unknown id
-- changes nothing. ARGV: now, worker id. Returns 1 if it was registered.
local now = clock(ARGV[1])
local key = key_worker(ARGV[2])
if redis.call('EXISTS', key) == 0 then return 0 end
redis.call('HSET', key, 'stopped_at', now, 'last_seen_at', now)
return 1
