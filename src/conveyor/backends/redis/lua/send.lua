-- send: deliver every message, all or none. A delivery whose idempotency key
-- this recipient was sent under already delivers nothing and gives back the
-- first message's id (whatever the recipient's state now); every other
-- recipient must exist, have an inbox and not be finished. All are checked
-- before anything is written. A waiting recipient is pending again, a
-- sleeping one due now.
-- ARGV: now, then 5 fields per delivery: task id, body (JSON), sender id
-- (opt), idempotency key (opt), the sender's trace context (opt). Returns {1, message ids...}, or, for the
-- first recipient that cannot take a message, {0, task id, its state or "",
-- its inbox flag} (Python raises the error: conveyor.backends.stored).
local FIELDS = 5
local now = clock(ARGV[1])
local known = {}
for a = 2, #ARGV, FIELDS do
  local id, key = ARGV[a], opt(ARGV[a + 3])
  local found = key and redis.call('HGET', key_sent(id), key)
  if found then
    known[a] = tonumber(found)
  else
    local f = redis.call('HMGET', key_task(id), 'state', 'inbox')
    if not f[1] or f[2] ~= '1' or TERMINAL[f[1]] then
      return {0, id, f[1] or '', f[2] or ''}
    end
  end
end
local ids = {1}
for a = 2, #ARGV, FIELDS do
  local message_id = known[a]
  if not message_id then
    local id, key = ARGV[a], opt(ARGV[a + 3])
    message_id = deliver(id, opt(ARGV[a + 2]), 'message', ARGV[a + 1], now, opt(ARGV[a + 4]))
    if key then redis.call('HSET', key_sent(id), key, message_id) end
  end
  ids[#ids + 1] = message_id
end
return ids
