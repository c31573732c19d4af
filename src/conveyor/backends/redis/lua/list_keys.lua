-- list_keys (reads only): the concurrency keys that hold tasks back, those
-- with pending tasks or a rate bucket still refilling, as the memory store
-- lists them. ARGV: now. Returns {now, then per key: key, max_running,
-- running, pending, rate_limit or "", rate_period or "", tokens now or ""}
-- (tokens as text: a number reply would be truncated), in no order (Python
-- sorts them by key and cuts the list).
--
-- Cost: reads every key row, and counts each key's pending set and leases.
local now = clock(ARGV[1])
local found = {now}
for _, key in ipairs(redis.call('ZRANGE', KEY_CONCURRENCY_KEYS, 0, -1)) do
  local f = redis.call('HMGET', key_concurrency(key), unpack(ROW_FIELDS))
  local tokens, rate = tokens_at(f, now), tonumber(f[2])
  local pending = redis.call('SCARD', key_concurrency_pending(key))
  if pending > 0 or (tokens and tokens < rate) then
    found[#found + 1] = {
      key, f[1] or '1', redis.call('ZCARD', key_concurrency_leases(key)), pending,
      f[2] or '', f[3] or '', tokens and float_text(tokens) or '',
    }
  end
end
return found
