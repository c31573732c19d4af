-- count_unfinished (reads only): due pending plus in-progress tasks of these
-- names and queues; a pending task that a pause holds back is not counted (a
-- burst worker does not wait for it), a running one is.
-- ARGV: now, the number of queues, the queues, the names.
-- Cost: the ready sets of the names are counted (ZCARD), and the due keyed
-- tasks of the queue by name (one HGETALL: see lib/flow.lua); the due delayed
-- tasks not promoted yet and the running tasks of each queue are read one
-- by one for their names.
local now = clock(ARGV[1])
local queue_count = tonumber(ARGV[2])
local queues, names = {}, {}
for i = 1, queue_count do queues[i] = ARGV[2 + i] end
for i = 3 + queue_count, #ARGV do names[ARGV[i]] = true end
local count = 0
for _, queue in ipairs(queues) do
  for _, id in ipairs(redis.call('ZRANGE', key_leases(queue), 0, -1)) do
    if names[redis.call('HGET', key_task(id), 'name')] then count = count + 1 end
  end
end
local open_queues, open_names = served(queues, names)
for _, queue in ipairs(open_queues) do
  for _, name in ipairs(redis.call('SMEMBERS', key_ready_names(queue))) do
    if open_names[name] then count = count + redis.call('ZCARD', key_ready(queue, name)) end
  end
  local keyed = redis.call('HGETALL', key_concurrency_due(queue))
  for i = 1, #keyed, 2 do
    if open_names[keyed[i]] then count = count + tonumber(keyed[i + 1]) end
  end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', key_delayed(queue), '-inf', now)) do
    if open_names[redis.call('HGET', key_task(id), 'name')] then count = count + 1 end
  end
end
return count
