-- adjust.lua: corrects every bucket in KEYS by its delta, in one atomic step.
--
-- ARGV[1] has decide.lua's layout, with the signed delta in the cost's
-- place (negative refunds, positive adds debt) and, in the capacity's
-- place (which a correction does not need), the start of the window in
-- which the corrected cost was charged (Limit.ChargeWindow; 0 when
-- unknown). The reply is the number of buckets adjusted.
local _, adjust, ttl, window, decode, spec, put = algorithms()
local argv = ARGV[1]
local now, i0 = struct.unpack('<d', argv)
now = clock(now)
local values = redis.call('MGET', unpack(KEYS))
for i = 1, #KEYS do
  local alg, count, period, charged, delta, w0, w1, w2, w3
  i0, alg, count, period, charged, delta, w0, w1, w2, w3 = spec(argv, i0)
  local start, stop
  if alg == CALENDAR then start, stop = window(now, w0, w1, w2, w3) end
  local a, b, t, e, log = decode(values[i])
  -- w0 is an exact sliding window's tick (see spec)
  a, b, t, log = adjust(alg, count, period, delta, a, b, t, log, now, start, charged, w0)
  put(KEYS[i], a, b, t, log, e, now, ttl(alg, count, period, a, b, t, now, stop))
end
return #KEYS
