-- Shared adaptive factor (package adaptive's Publisher, implemented in the
-- root package). KEYS[1] is a hash: instance id -> "factor time_us".
--
-- ARGV[1] instance id, ARGV[2] this instance's local factor (or "" to only
-- read), ARGV[3] max age in µs. Publishes the local factor stamped with
-- Redis TIME, drops entries older than max age (instances that died), and
-- returns the minimum fresh factor as a string ("" when none is fresh).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local maxAge = tonumber(ARGV[3])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. now)
end
local all = redis.call('HGETALL', KEYS[1])
local min = nil
for i = 1, #all, 2 do
  local f, at = string.match(all[i + 1], '^(%S+) (%S+)$')
  f, at = tonumber(f), tonumber(at)
  if f == nil or at == nil or now - at > maxAge then
    redis.call('HDEL', KEYS[1], all[i])
  elseif min == nil or f < min then
    min = f
  end
end
redis.call('PEXPIRE', KEYS[1], math.ceil(maxAge / 1000) * 2)
if min == nil then
  return ''
end
return tostring(min)
