-- resume: undo a pause and wake the queues it held back: the paused queue
-- if it has pending tasks; for a task name, every queue where tasks of that
-- name are due (in its ready sets: a delayed one is woken when a claim
-- promotes it). ARGV: kind ("queue" or "task"), name. Returns 1, or 0 if it
-- was not paused.
--
-- Cost: a task name's resume reads two memberships per queue ever used.
local kind, name = ARGV[1], ARGV[2]
if redis.call('HDEL', KEY_PAUSES, pause_field(kind, name)) == 0 then return 0 end
if kind == 'queue' then
  if redis.call('EXISTS', key_pending(name)) == 1 then woke(name) end
else
  for _, queue in ipairs(redis.call('SMEMBERS', KEY_QUEUES)) do
    if redis.call('SISMEMBER', key_ready_names(queue), name) == 1
        or redis.call('HEXISTS', key_concurrency_due(queue), name) == 1 then
      woke(queue)
    end
  end
end
return 1
