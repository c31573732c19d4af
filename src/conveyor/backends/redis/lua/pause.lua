-- pause: hold back a queue or a task name from every claim (and reclaim)
-- until it is resumed; running attempts go on. ARGV: now, kind ("queue" or
-- "task"), name (Python checked both). Returns 1, or 0 if it was paused
-- already (its first time kept).
local now = clock(ARGV[1])
return redis.call('HSETNX', KEY_PAUSES, pause_field(ARGV[2], ARGV[3]), now)
