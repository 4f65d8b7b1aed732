-- decide.lua: one all-or-nothing decision over every bucket in KEYS.
--
-- ARGV[1] is the test clock (µs) or 0 for Redis TIME. Then two entries per
-- key, in order: the algorithm, and its numbers packed as little-endian
-- doubles: count, period (µs), capacity, cost and, for a calendar limit,
-- the bounds w0 < w1 < w2 < w3 of the previous, current and next windows.
--
-- Every bucket is checked before any is written: a request is charged to
-- all buckets or to none. The reply holds six integers per bucket: allowed,
-- impossible, remaining, before, retry (µs), reset (µs).
local now = clock()
local values = redis.call('MGET', unpack(KEYS))
-- The reply and the pending writes (five values per bucket) are created at
-- the size of a 7-tier path: growing a Lua table one entry at a time costs
-- more than a bucket's arithmetic. Longer paths still work; they grow.
local reply = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
               0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local pending = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local admit = true
local keys = #KEYS
for i = 1, keys do
  local alg = ARGV[2 * i]
  local count, period, cap, n, w0, w1, w2, w3 = spec(alg, ARGV[2 * i + 1])
  local start, stop
  if alg == 'calendar' then start, stop = window(now, w0, w1, w2, w3) end
  local a, b, t, e = decode(values[i])
  local ok, impossible, remaining, before, retry, reset
  ok, impossible, remaining, before, retry, reset, a, b, t =
    apply(alg, count, period, cap, n, a, b, t, now, start, stop)
  local k = 6 * i
  reply[k - 5], reply[k - 4], reply[k - 3], reply[k - 2], reply[k - 1], reply[k] =
    ok, impossible, remaining, before, retry, reset
  if ok == 0 then
    admit = false
  elseif admit then
    k = 5 * i
    pending[k - 4], pending[k - 3], pending[k - 2], pending[k - 1], pending[k] =
      a, b, t, e, ttl(alg, count, period, a, t, now, stop)
  end
end
-- Redis reads a reply table up to its first nil: end it after the last bucket.
reply[6 * keys + 1] = nil
if admit then
  for i = 1, keys do
    local k = 5 * i
    put(KEYS[i], pending[k - 4], pending[k - 3], pending[k - 2], pending[k - 1], now, pending[k])
  end
end
return reply
