-- register_worker: record a worker as started and seen now, not stopped (a
-- worker registered again under its id starts afresh). ARGV: now, worker id,
-- host, pid, queues (JSON), concurrency, task names (JSON), beat seconds (opt).
local now = clock(ARGV[1])
local id = ARGV[2]
local key = key_worker(id)
redis.call('DEL', key)
redis.call('HSET', key, 'host', ARGV[3], 'pid', ARGV[4], 'queues', ARGV[5],
  'concurrency', ARGV[6], 'tasks', ARGV[7], 'started_at', now, 'last_seen_at', now)
local beat = opt(ARGV[8])
if beat then redis.call('HSET', key, 'beat_seconds', beat) end
redis.call('ZADD', KEY_WORKERS, now, id)
return 1
