-- renew.lua: keeps an instance's concurrency slots (see decide.lua) from
-- expiring while their requests are in flight: each slot named is given a
-- new time, now + ttl, if it is still taken — a slot given back, or past
-- its time (dropped first: another decision may already have counted it
-- gone), stays gone (ZADD XX).
--
-- KEYS are slot keys (one Cluster slot). ARGV[1] is the test clock (µs) or
-- 0 for Redis TIME, ARGV[2] the TTL (µs), and ARGV[2 + k] the holders of
-- KEYS[k]: 8 bytes each, a packed float64 as decide.lua stores them. The
-- reply is the number of slots renewed.
local now = clock(tonumber(ARGV[1]))
local ttl = tonumber(ARGV[2])
local ms = math.ceil(ttl / 1000) + 1000
local score = now + ttl
local renewed = 0
for k = 1, #KEYS do
  local holders = ARGV[k + 2]
  redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now)
  local args, n = {'XX', 'CH'}, 2
  for i = 1, #holders, 8 do
    args[n + 1], args[n + 2] = score, string.sub(holders, i, i + 7)
    n = n + 2
    if n >= 2002 or i + 8 > #holders then
      renewed = renewed + redis.call('ZADD', KEYS[k], unpack(args, 1, n))
      n = 2
    end
  end
  if redis.call('PTTL', KEYS[k]) < ms then redis.call('PEXPIRE', KEYS[k], ms) end
end
return renewed
