-- sync_schedules: store an app's schedules (a new one's last slot is now, a
-- changed one keeps its own) and drop the stored schedules of the app's
-- tasks that it no longer defines. ARGV: now, the number of schedules, 4
-- fields per schedule (name, task, fingerprint, definition JSON), then the
-- app's task names.
local now = clock(ARGV[1])
local count = tonumber(ARGV[2])
local given = {}
for n = 0, count - 1 do
  local a = 3 + n * 4
  local name = ARGV[a]
  given[name] = true
  local key = key_schedule(name)
  if redis.call('EXISTS', key) == 0 then redis.call('HSET', key, 'last_slot', now) end
  redis.call('HSET', key, 'task', ARGV[a + 1], 'fingerprint', ARGV[a + 2],
    'definition', ARGV[a + 3], 'synced_at', now)
  redis.call('SADD', KEY_SCHEDULES, name)
end
local tasks = {}
for i = 3 + count * 4, #ARGV do tasks[ARGV[i]] = true end
for _, name in ipairs(redis.call('SMEMBERS', KEY_SCHEDULES)) do
  if not given[name] and tasks[redis.call('HGET', key_schedule(name), 'task') or ''] then
    redis.call('DEL', key_schedule(name))
    redis.call('SREM', KEY_SCHEDULES, name)
  end
end
return 1
