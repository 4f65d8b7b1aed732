-- adjust.lua: corrects every bucket in KEYS by its delta, in one atomic step.
--
-- ARGV[1] has decide.lua's layout, with the signed delta in the cost's
-- place (negative refunds, positive adds debt) and, in the capacity's
-- place (which a correction does not need), the start of the window in
-- which the corrected cost was charged (Limit.ChargeWindow; 0 when
-- unknown). KEYS are the buckets' keys in order, an exact sliding
-- window's followed by its log key. A key named twice is corrected twice,
-- the second time from what the first left. The reply is the number of
-- buckets adjusted.
local _, adjust, ttl, window, decode, spec, put = algorithms()
local ladjust, lwrite, lcheck -- from logs, for the first exact sliding window
local argv = ARGV[1]
local now, i0 = struct.unpack('<d', argv)
now = clock(now)
local values = redis.call('MGET', unpack(KEYS))
local written = {} -- by key name: the value a correction of this call left (false: none)
local k, adjusted = 1, 0
while i0 <= #argv do
  local alg, count, period, charged, delta, w0, w1, w2, w3
  i0, alg, count, period, charged, delta, w0, w1, w2, w3 = spec(argv, i0)
  local v = values[k]
  if written[KEYS[k]] ~= nil then v = written[KEYS[k]] end
  local a, b, t, e = decode(v)
  if alg == LOG then
    if not ladjust then
      local _, reader, scan, tickOf
      _, _, reader, scan, tickOf, lcheck = logs()
      ladjust, lwrite = logAdjust(reader, scan, tickOf)
    end
    local h, m, entries = 0, 0
    if v and #v >= 48 then h, m = struct.unpack('<dd', v, 33) end
    b, h, m = lcheck(KEYS[k + 1], a, b, h, m)
    -- w0 is the window's tick (see spec)
    a, b, t, h, m, entries = ladjust(count, period, w0, delta, a, b, t, h, m, now, charged, KEYS[k + 1])
    local tl = 0
    if b > 0 then tl = t + period - now end
    local ms
    ms, e, written[KEYS[k]] = put(KEYS[k], a, b, t, e, now, tl, struct.pack('<dd', h, m))
    lwrite(KEYS[k + 1], entries, ms, e, now)
    k = k + 2
  else
    local start, stop
    if alg == CALENDAR then start, stop = window(now, w0, w1, w2, w3) end
    a, b, t = adjust(alg, count, period, delta, a, b, t, now, start, charged)
    local _
    _, _, written[KEYS[k]] = put(KEYS[k], a, b, t, e, now, ttl(alg, count, period, a, t, now, stop), '')
    k = k + 1
  end
  adjusted = adjusted + 1
end
return adjusted
