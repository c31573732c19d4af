-- fire_schedule: enqueue the tasks of a schedule's slots, if this call takes
-- them: the schedule is stored with this fingerprint and its last slot is
-- before the first of these. Its last slot then moves to the last of them,
-- in this script: a slot fires once, whoever fires it. The tasks are stored
-- as enqueue.lua stores them (unique keys included).
-- ARGV: now, name, fingerprint, first slot (ms), last slot (ms), then the
-- tasks as enqueue.lua takes them. Returns {1, ids...}, {2} when the slots are not
-- this call's, or {0, index, holder id} as enqueue.lua does.
local now = clock(ARGV[1])
local key = key_schedule(ARGV[2])
local f = redis.call('HMGET', key, 'fingerprint', 'last_slot', 'last_task_id')
if f[1] ~= ARGV[3] then return {2} end
local last_slot = tonumber(f[2])
if last_slot and last_slot >= tonumber(ARGV[4]) then return {2} end
local ids = store_batch(ARGV[6], now)
if ids[1] ~= 1 then return ids end
redis.call('HSET', key, 'last_slot', ARGV[5])
if #ids > 1 then redis.call('HSET', key, 'last_task_id', ids[#ids]) end
return ids
