-- numbers.lua: what a task's stored fields may hold, read through `number`.

-- A task's hash may hold any text when it was written around conveyor, and
-- Lua's tonumber takes 'nan', 'inf', '1e400' and '0x1f': arithmetic on one
-- of those, a ZADD of it or a string.format of it fails a script halfway
-- (Redis does not roll back what it already wrote), and an infinite lease
-- never expires. So every numeric field of a task is read through `number`:
-- nil unless finite and within the field's bounds, the bounds the SQL
-- stores hold by CHECK constraints and triggers (docs/guarantees.md, item
-- 16): counters 0 to 2,147,483,646, max_attempts 1 to 10^9 (as the API),
-- 32-bit priorities, times in years 1 to 9999 (ms), a lease of 0.5 s to
-- 100 years, a timeout up to 100 years.
-- {lowest, highest, integer, lowest excluded}
local MAX_SECONDS = 3155760000
local EARLIEST_MS, LATEST_MS = -62135510400000, 253402128000000
local MAX_COUNTER = 2147483646
local TIME_BOUNDS = {EARLIEST_MS, LATEST_MS, true}
local BOUNDS = {
  attempt = {0, MAX_COUNTER, true},
  spent = {0, MAX_COUNTER, true},
  max_attempts = {1, 1000000000, true},  -- conveyor.model.MAX_ATTEMPTS
  priority = {-2147483648, 2147483647, true},
  run_at = TIME_BOUNDS,
  created_at = TIME_BOUNDS,
  finished_at = TIME_BOUNDS,
  started_at = TIME_BOUNDS,
  lease_expires_at = TIME_BOUNDS,
  unique_until = TIME_BOUNDS,
  expires_at = TIME_BOUNDS,
  lease = {0.5, MAX_SECONDS, false},
  timeout = {0, MAX_SECONDS, false, true},
  parent_id = {1, 999999999999999, true},
  concurrency_limit = {1, 2147483647, true},
  rate_limit = {1, 2147483647, true},
  rate_period = {0, MAX_SECONDS, false, true},
  waiting_for = {0, MAX_COUNTER, true},
}
local function number(field, text)
  local v = tonumber(text)
  local b = BOUNDS[field]
  if not v or v ~= v or v < b[1] or v > b[2] or (b[3] and v ~= math.floor(v))
      or (b[4] and v <= b[1]) then
    return nil
  end
  return v
end

-- Fields without which a task cannot run, nor be indexed.
local REQUIRED = {
  name = true, queue = true, payload = true, state = true, priority = true, run_at = true,
  attempt = true, spent = true, max_attempts = true, retry = true,
}
-- The first of `fields` whose value (in `values`, an HMGET's reply) does not
-- read, and that value (nil: missing): a required one missing, a name,
-- queue or state empty, a state unknown, a number out of its bounds. nil
-- when every one reads.
local function unreadable(fields, values)
  for i, field in ipairs(fields) do
    local text = values[i]
    if not text then
      if REQUIRED[field] then return field, nil end
    elseif BOUNDS[field] then
      if not number(field, text) then return field, text end
    elseif field == 'state' then
      if not STATES[text] then return field, text end
    elseif text == '' and (field == 'name' or field == 'queue') then
      return field, text
    end
  end
  return nil
end

-- Why a field does not read, for the attempt log (TEXTS from
-- conveyor.backends.stored, composed in front of this file): the stored
-- value cut short, its bytes beyond printable ASCII shown as '?'.
local function fill(template, holes)
  return (string.gsub(template, '{([%w_]+)}', function(hole) return holes[hole] end))
end
local function unread_message(field, value)
  local shown = 'missing'
  if value then
    shown = "'" .. string.sub((string.gsub(value, '[^%w%p ]', '?')), 1, 40) .. "'"
  end
  return fill(TEXTS.corrupt_field, {field = field, value = shown})
end
