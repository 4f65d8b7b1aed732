-- Live instances of one Redis store (store.Presence). KEYS[1] is a hash:
-- instance id -> the Redis time (µs) of its last heartbeat.
--
-- ARGV[1] instance id (or "" to only count), ARGV[2] max age in µs,
-- ARGV[3] the test clock (µs) or 0 for Redis TIME. Stamps the instance,
-- drops instances not heard from within max age (stopped or cut off) and
-- returns how many are left.
local now = tonumber(ARGV[3])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local maxAge = tonumber(ARGV[2])
if ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], ARGV[1], now)
end
local all = redis.call('HGETALL', KEYS[1])
local n = 0
for i = 1, #all, 2 do
  local at = tonumber(all[i + 1])
  if at == nil or now - at > maxAge then
    redis.call('HDEL', KEYS[1], all[i])
  else
    n = n + 1
  end
end
redis.call('PEXPIRE', KEYS[1], math.ceil(maxAge / 1000) * 2)
return n
