-- call.lua: the first of the library files composed in front of every
-- operation (conveyor.backends.redis.scripts), after the table TEXTS (the
-- attempt log's texts, from conveyor.backends.stored) and the key names
-- (KEY_*, key_*, CHANNEL_*, set_base: written from keys.py's LAYOUT).
-- The files after it follow the sections of the backend: numbers.lua (the
-- bounds of a task's numbers), indexes.lua (the per-state, finished and
-- claim indexes), flow.lua (unique keys, pauses, concurrency keys and rate
-- limits), tasks.lua (state moves), attempts.lua (the attempt log, set
-- aside), messages.lua (inboxes, wakes), enqueue.lua (inserts),
-- controls.lua (ends, cancels, retries, bulk selections, deletes) and
-- maintenance.lua (retention). They make one chunk: a file may use what an
-- earlier one defines (a name used before its definition is declared
-- first, as index_keyed in indexes.lua).
--
-- KEYS[1] is the store's base, "{prefix}" (see begin). Every key starts with it,
-- so all of one store's keys share one hash tag and one cluster slot: a
-- script may then name keys it computes (Redis Cluster requires only that
-- they live in the slot of the keys it declares).
--
-- Times are integer milliseconds since the Unix epoch. Optional arguments
-- come as "" for none and "=" followed by the value otherwise (see opt).

-- The store's base and the names built from it (set_base), and the state one call
-- keeps (the queues it woke, the names it indexed, the ids it reserved, the
-- index writes it gathered): begin sets them all at the start of every call.
-- As a Redis function the chunk runs once, at load, and every call reuses
-- it, so nothing may carry over from one call to the next.
local WOKEN, QUEUE_KNOWN, READY_NAMED, gathered
local reserved_next, reserved_last
local function begin(base)
  set_base(base)
  WOKEN, QUEUE_KNOWN, READY_NAMED, gathered = {}, {}, {}, nil
  reserved_next, reserved_last = 1, 0
end

-- The caller's injected time (tests), else the server's clock: the only
-- authority on leases and due times.
local function clock(given)
  if given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function opt(text)
  if text == '' then return nil end
  return string.sub(text, 2)
end

local TERMINAL = {succeeded = true, failed = true, cancelled = true}
local STATES = {
  pending = true, in_progress = true, waiting = true,
  succeeded = true, failed = true, cancelled = true,
}

-- One command with many arguments after its key, in calls of CHUNK (an even
-- number: score and member pairs stay together), well below Lua's stack limit.
local CHUNK = 1000
local function call_chunked(command, key, values)
  for first = 1, #values, CHUNK do
    redis.call(command, key, unpack(values, first, math.min(first + CHUNK - 1, #values)))
  end
end
