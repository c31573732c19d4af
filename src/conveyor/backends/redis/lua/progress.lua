-- progress: store each progress report on its task where the report's lease
-- is live (the heartbeat's fence: this attempt, this worker, this claim's
-- nonce, not expired), with the script's clock as its time; nothing else of
-- the task changes. ARGV: now, worker id, then a task id, an attempt
-- number, a nonce and the report (JSON text) per report. Returns per report
-- 1 (stored) or 0 (its lease is lost).
local now = clock(ARGV[1])
local worker = ARGV[2]
local stored = {}
for i = 3, #ARGV, 4 do
  local key = key_task(ARGV[i])
  local f = redis.call('HMGET', key, 'state', 'attempt', 'worker_id', 'lease_expires_at', 'nonce')
  local expires = number('lease_expires_at', f[4])
  local flag = 0
  if f[1] == 'in_progress' and number('attempt', f[2]) == tonumber(ARGV[i + 1])
      and f[3] == worker and f[5] == ARGV[i + 2] and expires and expires > now then
    redis.call('HSET', key, 'progress', ARGV[i + 3], 'progress_at', now)
    flag = 1
  end
  stored[#stored + 1] = flag
end
return stored
