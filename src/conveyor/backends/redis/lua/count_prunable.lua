-- count_prunable (reads only): what prune.lua would delete over all its
-- batches. ARGV as prune.lua's without the limit. Returns {tasks, workers}.
-- Cost: reads every task past its state's cutoff, and every worker.
local workers_before = tonumber(opt(ARGV[1]) or '')
local tasks = 0
for s = 2, #ARGV, 2 do
  tasks = tasks + #prunable(ARGV[s], tonumber(ARGV[s + 1]), nil)
end
local workers = workers_before and #old_workers(workers_before) or 0
return {tasks, workers}
