-- decide.lua: one all-or-nothing decision over every bucket in KEYS.
--
-- ARGV[1] is every number of the decision packed in one string (see lua.go):
-- the test clock (µs) or 0 for Redis TIME, then per key its algorithm code,
-- count, period (µs), capacity, cost and, for a calendar limit, the bounds
-- w0 < w1 < w2 < w3 of the previous, current and next windows.
--
-- Every bucket is checked before any is written: a request is charged to
-- all buckets or to none. The reply is one string of six little-endian
-- doubles per bucket: allowed, impossible, remaining, before, retry (µs),
-- reset (µs).
--
-- GCRA, the common algorithm, is rate.lua's apply and ttl written out in the
-- loop (the same operations in the same order): a call with a dozen
-- arguments and results costs more than its arithmetic.
local floor, ceil, pack, unpk = math.floor, math.ceil, struct.pack, struct.unpack
local argv = ARGV[1]
local now, i0 = unpk('<d', argv)
now = clock(now)
local values = redis.call('MGET', unpack(KEYS))
-- reply holds, for bucket i of n, its reply at i and its pending write at
-- n + i (the value) and 2n + i (the expiry, see below). It is created at the
-- size of a 7-tier path: growing a Lua table one entry at a time costs more
-- than a bucket's arithmetic. Longer paths still work; it grows.
local reply = {'', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', '', ''}
local admit = true
local keys = #KEYS
local apply, ttl, window, _ -- from algorithms, for the first sliding or calendar bucket
for i = 1, keys do
  local alg, count, period, cap, n
  alg, count, period, cap, n, i0 = unpk('<Bdddd', argv, i0)
  local a, b, t, e = 0, 0, 0, 0
  local v = values[i]
  if v and #v == 32 then a, b, t, e = unpk('<dddd', v) end
  local ok, tl
  if alg ~= SLIDING and alg ~= CALENDAR then
    -- gcra: level, then Limit.gcra
    local perUnit = period / count
    local elapsed = now - t
    if elapsed < 0 then elapsed = 0 end
    local u = a - elapsed * count / period
    if not (u > 0) then u = 0 end
    local before = cap - u
    if before <= 0 then before = 0 else before = floor(before) end
    local reset = u * perUnit
    if reset <= 0 then reset = 0 else reset = ceil(reset) end
    if n > cap then
      ok = 0
      reply[i] = pack('<dddddd', 0, 1, before, before, 0, reset)
    else
      local nxt = u + n
      if nxt <= cap then
        ok = 1
        local remaining = cap - nxt
        if remaining <= 0 then remaining = 0 else remaining = floor(remaining) end
        reset = nxt * perUnit
        if reset <= 0 then reset = 0 else reset = ceil(reset) end
        reply[i] = pack('<dddddd', 1, 0, remaining, before, 0, reset)
        -- ttl: the level of the new state at now is nxt itself (pos(nxt - 0))
        tl = nxt * period / count
        if tl <= 0 then tl = 0 else tl = ceil(tl) end
        a, b, t = nxt, 0, now
      else
        ok = 0
        local retry = (nxt - cap) * perUnit
        if retry <= 0 then retry = 0 else retry = ceil(retry) end
        reply[i] = pack('<dddddd', 0, 0, before, before, retry + 1, reset)
      end
    end
  else
    if not apply then apply, _, ttl, window = algorithms() end
    local start, stop
    if alg == CALENDAR then
      local w0, w1, w2, w3
      w0, w1, w2, w3, i0 = unpk('<dddd', argv, i0)
      start, stop = window(now, w0, w1, w2, w3)
    end
    local impossible, remaining, before, retry, reset
    ok, impossible, remaining, before, retry, reset, a, b, t =
      apply(alg, count, period, cap, n, a, b, t, now, start, stop)
    reply[i] = pack('<dddddd', ok, impossible, remaining, before, retry, reset)
    if ok == 1 then tl = ttl(alg, count, period, a, t, now, stop) end
  end
  if ok == 0 then
    admit = false
  elseif admit then
    -- rate.lua's put, decided now and done after the loop if every bucket
    -- admits: the value to store, and its expiry: 0 keeps the key's own
    -- (SET KEEPTTL), a number of ms sets one (SET PX), false deletes the key.
    local ms = 0
    if tl <= 0 then
      ms = false
    elseif not (now + tl <= e) then
      local margin = tl / 8
      if margin < 1000000 then margin = 1000000 end
      ms = ceil((tl + margin) / 1000)
      e = now + (ms - 1) * 1000
    end
    reply[keys + i], reply[2 * keys + i] = pack('<dddd', a, b, t, e), ms
  end
end
if admit then
  for i = 1, keys do
    local ms = reply[2 * keys + i]
    if ms == 0 then
      redis.call('SET', KEYS[i], reply[keys + i], 'KEEPTTL')
    elseif ms then
      redis.call('SET', KEYS[i], reply[keys + i], 'PX', ms)
    else
      redis.call('DEL', KEYS[i])
    end
  end
end
return table.concat(reply, '', 1, keys)
