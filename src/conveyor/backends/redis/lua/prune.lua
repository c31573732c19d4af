-- prune: delete one batch of finished tasks, each with everything stored
-- for it (forget_task in lib/controls.lua), and old workers. ARGV: limit (0 or
-- more, over all states), workers' cutoff (opt, ms), then a state and its
-- cutoff (ms) per state, in the order given. Tasks finished before their
-- state's cutoff go, state by state, oldest finish first (see prunable);
-- never a child of a live parent, nor a task an unfinished dependent waits
-- for. Returns {tasks deleted, workers deleted}.
--
-- Cost: reads the finished index of each state from its oldest member, so a
-- batch reads its `limit` tasks plus the children of live parents it passes;
-- the workers' cutoff reads every registered worker.
local limit = tonumber(ARGV[1])
local workers_before = tonumber(opt(ARGV[2]) or '')
local doomed = {}
for s = 3, #ARGV, 2 do
  if #doomed >= limit then break end
  for _, id in ipairs(prunable(ARGV[s], tonumber(ARGV[s + 1]), limit - #doomed)) do
    doomed[#doomed + 1] = id
  end
end
for _, id in ipairs(doomed) do forget_task(id) end
local workers = workers_before and old_workers(workers_before) or {}
for _, id in ipairs(workers) do
  redis.call('ZREM', KEY_WORKERS, id)
  redis.call('DEL', key_worker(id))
end
return {#doomed, #workers}
