-- sync_schedules: record that a release of schedules synced now (its first
-- sync gives it the next generation), then, unless a newer release
-- supersedes it, store its schedules (a new one's last slot is now, a
-- changed one keeps its own) and drop the stored schedules of its tasks
-- that it no longer defines. A newer release supersedes it when one is live
-- (synced at most the lifetime ago), of a greater generation, and shares one
-- of its task names: then nothing else is written. A stored schedule that a
-- live release of a greater generation stored is neither overwritten nor
-- dropped, and one this release stored already is left as it is.
-- ARGV: now, the release, its lifetime (ms), the number of schedules, 4
-- fields per schedule (name, task, fingerprint, definition JSON), then the
-- app's task names. Returns 1, or 0 when superseded.
local now = clock(ARGV[1])
local release, lifetime, count = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local first_task = 5 + count * 4
local tasks, task_list = {}, {}
for i = first_task, #ARGV do
  tasks[ARGV[i]] = true
  task_list[#task_list + 1] = ARGV[i]
end
local release_key = key_schedule_release(release)
local generation = tonumber(redis.call('HGET', release_key, 'generation'))
if not generation then
  generation = redis.call('INCR', KEY_SCHEDULE_GENERATIONS)
  redis.call('HSET', release_key, 'generation', generation,
    'tasks', #task_list > 0 and cjson.encode(task_list) or '[]')
end
redis.call('HSET', release_key, 'seen_at', now)
redis.call('ZADD', KEY_SCHEDULE_RELEASES, now, release)
local live_since = now - lifetime

-- Whether release `name` is live and of a greater generation than this one.
local function outranks(name)
  if not name then return false end
  local f = redis.call('HMGET', key_schedule_release(name), 'generation', 'seen_at')
  local their_generation, seen = tonumber(f[1]), tonumber(f[2])
  return their_generation ~= nil and seen ~= nil and their_generation > generation
    and seen >= live_since
end

for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEY_SCHEDULE_RELEASES, live_since, '+inf')) do
  if outranks(name) then
    local ok, theirs = pcall(cjson.decode, redis.call('HGET', key_schedule_release(name), 'tasks') or '[]')
    if ok and type(theirs) == 'table' then
      for _, task in ipairs(theirs) do
        if tasks[task] then return 0 end
      end
    end
  end
end

local given = {}
for n = 0, count - 1 do
  local a = 5 + n * 4
  local name = ARGV[a]
  given[name] = true
  local key = key_schedule(name)
  local exists = redis.call('EXISTS', key) == 1
  local f = redis.call('HMGET', key, 'release', 'fingerprint')
  local same = f[1] == release and f[2] == ARGV[a + 2]
  if not exists or not (same or outranks(f[1] or false)) then
    if not exists then redis.call('HSET', key, 'last_slot', now) end
    redis.call('HSET', key, 'task', ARGV[a + 1], 'fingerprint', ARGV[a + 2],
      'definition', ARGV[a + 3], 'synced_at', now, 'release', release)
    redis.call('SADD', KEY_SCHEDULES, name)
  end
end
for _, name in ipairs(redis.call('SMEMBERS', KEY_SCHEDULES)) do
  local f = redis.call('HMGET', key_schedule(name), 'task', 'release')
  if not given[name] and tasks[f[1] or ''] and not outranks(f[2] or false) then
    redis.call('DEL', key_schedule(name))
    redis.call('SREM', KEY_SCHEDULES, name)
  end
end
return 1
