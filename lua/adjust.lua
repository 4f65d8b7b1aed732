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
-- logAdjust returns the corrections of an exact sliding window, on
-- algorithms('log')'s reader, scan and tickOf. It is here rather than in
-- rate.lua so that decide.lua does not create it on every call.
local function logAdjust(reader, scan, tickOf)
  local unpk, pack = struct.unpack, struct.pack
  local MAXC = 4294967295

  -- adjust is Limit.adjustLog: the whole log unpacked (LRANGE), corrected
  -- and returned as a state and a table of entries for write.
  local function adjust(count, p, g, delta, a, b, t, h, m, now, charged, lk)
    local entry = reader(lk)
    local live, used, d
    live, used, d, h = scan(a, b, t, h, m, now, p, entry)
    local ts, cs, k = {}, {}, 0
    if live then
      local all = redis.call('LRANGE', lk, d, m - 1)
      for i = 1, m - d do
        local gap, cost = 0, 0
        if all[i] and #all[i] == 10 then gap, cost = unpk('<I6I4', all[i]) end
        k = k + 1
        ts[k], cs[k] = h, cost
        h = h + gap
      end
      k = k + 1
      ts[k], cs[k] = t, b
    end
    if delta > 0 then
      local dd = delta
      if count < dd then dd = count end
      local at = tickOf(now, g)
      if k > 0 and at <= ts[k] and cs[k] + dd <= MAXC then
        cs[k] = cs[k] + dd
      else
        if k > 0 and at < ts[k] then at = ts[k] end
        k = k + 1
        ts[k], cs[k] = at, dd
      end
      used = used + dd
    elseif delta < 0 then
      if charged == 0 then charged = tickOf(now, g) end
      for i = 1, k do
        if ts[i] == charged then
          local take = cs[i]
          if -delta < take then take = -delta end
          cs[i] = cs[i] - take
          used = used - take
          if cs[i] == 0 then
            table.remove(ts, i)
            table.remove(cs, i)
            k = k - 1
          end
          break
        end
      end
    end
    -- packLog
    local out = {}
    if k == 0 then return 0, 0, 0, 0, 0, out end
    for i = 1, k - 1 do out[i] = pack('<I6I4', ts[i + 1] - ts[i], cs[i]) end
    local first = 0
    if k > 1 then first = ts[1] end
    return used, cs[k], ts[k], first, k - 1, out
  end

  -- write replaces the list at lk with entries, expiring with the
  -- bucket's key (ms and e as put returns them).
  local function write(lk, entries, ms, e, now)
    redis.call('DEL', lk)
    if #entries == 0 or ms == false then return end
    for i = 1, #entries, 1000 do
      redis.call('RPUSH', lk, unpack(entries, i, math.min(i + 999, #entries)))
    end
    if ms ~= 0 then
      redis.call('PEXPIRE', lk, ms + 1)
    else
      redis.call('PEXPIRE', lk, math.ceil((e - now) / 1000) + 2)
    end
  end

  return adjust, write
end

local _, adjust, ttl, window, decode, spec, put = algorithms()
local ladjust, lwrite, lcheck -- for the first exact sliding window
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
  if alg == SLOTS then
    -- A concurrency slot given back: its holder's member goes (w0 is the
    -- holder; see decide.lua). A debt means nothing to slots.
    if delta < 0 then redis.call('ZREM', KEYS[k], struct.pack('<d', w0)) end
    k = k + 1
  elseif alg == LOG then
    if not ladjust then
      local _, reader, scan, tickOf
      _, _, reader, scan, tickOf, lcheck = algorithms('log')
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
