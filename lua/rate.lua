-- rate.lua: the arithmetic of package rate (rate/rate.go), in Redis Lua.
--
-- This prelude is prepended to decide.lua and adjust.lua (see lua.go). Every
-- function mirrors its Go counterpart operation for operation, in the same
-- order, because Lua numbers are IEEE doubles like Go's float64: the same
-- operations on the same inputs round the same way, so the memory store and
-- the Redis store reach bit-identical decisions. Do not "simplify" an
-- expression here without making the same change in rate.go.
--
-- Times are µs since the Unix epoch (exact in a double until the year 2255).
-- A bucket's state is one string of four little-endian doubles (struct.pack
-- '<dddd'): the rate.State {A, B, T}, exact, and the expiry hint E of put;
-- an exact sliding window's is followed by its rate.Log, as
-- Log.AppendBinary writes it (the log string below: '' when the state has
-- none, else H as a double, then 10-byte entries '<I6I4': the gap in µs to
-- the next newer entry, and the cost). Binary, because formatting and
-- parsing decimal doubles would cost more than the arithmetic itself.

-- The algorithm codes of the packed arguments (see lua.go); any other code
-- is gcra, like Limit.Apply's default. SLIDING is the two-counter estimate
-- (rate.SlidingApprox), LOG the exact sliding window (rate.Sliding).
local SLIDING, CALENDAR, LOG = 1, 2, 3

-- clock is the decision's time: Redis TIME, unless the caller injected a
-- test clock (now, a non-zero µs timestamp; the Go store sends 0 in
-- production). TIME is read once per script, so every bucket of a decision
-- sees the same instant.
local function clock(now)
  if now == 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now
end

-- algorithms returns the functions below: the mirror of rate.go, and put.
-- They are created by a call rather than at the top level because every
-- closure a script creates costs Redis time on every call: decide.lua
-- inlines GCRA (the common case) and put, and calls algorithms only for a
-- sliding or calendar bucket.
local function algorithms()
  -- pos is math.Max(0, x) (for the finite x that occur here; -0 becomes +0 as in Go).
  local function pos(x)
    if x > 0 then return x end
    return 0
  end

  -- floornn is floorNonNeg: a whole number of units, never negative.
  local function floornn(x)
    if x <= 0 then return 0 end
    return math.floor(x)
  end

  -- ceilnn is ceilMicros: a wait rounded up to whole µs, never negative.
  local function ceilnn(x)
    if x <= 0 then return 0 end
    return math.ceil(x)
  end

  local unpk, pack, sub = struct.unpack, struct.pack, string.sub

  -- decode reads a stored state: the rate.State {A, B, T}, E, the time
  -- until which the key's TTL is known to keep it (see put), and the log
  -- ('' for none). A missing or unreadable value is the zero State, a
  -- fresh bucket.
  local function decode(v)
    if v and #v >= 32 then
      local a, b, t, e = unpk('<dddd', v)
      return a, b, t, e, sub(v, 33)
    end
    return 0, 0, 0, 0, ''
  end

  -- spec reads one bucket's numbers from the packed argument s at offset i:
  -- its algorithm code, count, period, capacity, cost and its extras: for a
  -- calendar the window bounds, for an exact sliding window its tick
  -- (rate.Limit.Tick) as x1 (nil otherwise). It returns the offset of the
  -- next bucket first.
  local function spec(s, i)
    local alg, count, period, cap, n
    alg, count, period, cap, n, i = unpk('<Bdddd', s, i)
    if alg == CALENDAR then
      local w0, w1, w2, w3
      w0, w1, w2, w3, i = unpk('<dddd', s, i)
      return i, alg, count, period, cap, n, w0, w1, w2, w3
    elseif alg == LOG then
      local g
      g, i = unpk('<d', s, i)
      return i, alg, count, period, cap, n, g
    end
    return i, alg, count, period, cap, n
  end

  -- level is Limit.level: the GCRA level drained at count per period since t.
  local function level(a, t, now, count, period)
    local elapsed = now - t
    if elapsed < 0 then elapsed = 0 end
    return pos(a - elapsed * count / period)
  end

  -- slide is Limit.slide: moves a sliding-window state to the window holding now.
  -- fmod is exact for doubles, so start is the same integer Go's mod gives.
  local function slide(a, b, t, now, p)
    local m = math.fmod(now, p)
    if m < 0 then m = m + p end
    local start = now - m
    if t == start then return a, b, t end
    if t + p == start then return b, 0, start end
    return 0, 0, start
  end

  -- window picks, among the previous, current and next calendar windows that
  -- Go computed from its own clock (bounds w0 < w1 < w2 < w3), the one holding
  -- now. Go's and Redis's clocks may straddle a boundary; they cannot be a
  -- whole window apart unless a clock is badly wrong, and then the nearest
  -- window is used.
  local function window(now, w0, w1, w2, w3)
    if now < w1 then return w0, w1 end
    if now < w2 then return w1, w2 end
    return w2, w3
  end

  -- The exact sliding window (rate/log.go). A log entry is ENTRY bytes and
  -- holds at most MAXC.
  local ENTRY, MAXC = 10, 4294967295

  -- tickOf is Limit.tickOf: the end of the tick of g µs holding t.
  local function tickOf(t, g)
    local m = math.fmod(t, g)
    if m < 0 then m = m + g end
    if m > 0 then t = t + g - m end
    return t
  end

  -- scan is Limit.scan: whether anything is in the window (t − p, t], the
  -- cost in it, and the offset in log (from 1, counting H) and time of the
  -- oldest entry in it (t's own when the log holds none).
  local function scan(a, b, t, log, now, p)
    local cut = now - p
    if b == 0 or t <= cut then return false, 0, 9, t end
    local used, off, h, len = a, 9, t, #log
    if len > 0 then
      h = unpk('<d', log)
      while off <= len and h <= cut do
        local gap, cost = unpk('<I6I4', log, off)
        used = used - cost
        h = h + gap
        off = off + ENTRY
      end
    end
    return true, used, off, h
  end

  -- compact is Limit.compact: the state without what scan found gone.
  local function compact(live, used, off, h, b, t, log)
    if not live then return 0, 0, 0, '' end
    local len = #log
    if len == 0 or off == 9 then return used, b, t, log end
    if off > len then return used, b, t, '' end
    return used, b, t, pack('<d', h) .. sub(log, off)
  end

  -- record is Limit.record: a charge of n at now, in a compacted state.
  local function record(a, b, t, log, now, n, g)
    if n == 0 then return a, b, t, log end
    local at = tickOf(now, g)
    if b == 0 then return n, n, at, '' end
    if at < t then at = t end
    if at == t and b + n <= MAXC then return a + n, b + n, t, log end
    if log == '' then log = pack('<d', t) end
    return a + n, n, at, log .. pack('<I6I4', at - t, b)
  end

  -- retry is Limit.retry: the wait until need units of the oldest charges
  -- in the window (from offset off, at time h) have left it.
  local function retry(t, log, off, h, now, p, need)
    local sum, len = 0, #log
    while off <= len do
      local gap, cost = unpk('<I6I4', log, off)
      sum = sum + cost
      if sum >= need then return h + p - now end
      h = h + gap
      off = off + ENTRY
    end
    return t + p - now
  end

  -- adjustLog is Limit.adjustLog: a debt logged now (at most count), or a
  -- refund off the entry of the tick charged, through an unpacked list.
  local function adjustLog(count, p, g, delta, a, b, t, log, now, charged)
    local live, used, off, h = scan(a, b, t, log, now, p)
    local ts, cs, k = {}, {}, 0
    if live then
      local len = #log
      while off <= len do
        local gap, cost = unpk('<I6I4', log, off)
        k = k + 1
        ts[k], cs[k] = h, cost
        h = h + gap
        off = off + ENTRY
      end
      k = k + 1
      ts[k], cs[k] = t, b
    end
    if delta > 0 then
      local d = delta
      if count < d then d = count end
      local at = tickOf(now, g)
      if k > 0 and at <= ts[k] and cs[k] + d <= MAXC then
        cs[k] = cs[k] + d
      else
        if k > 0 and at < ts[k] then at = ts[k] end
        k = k + 1
        ts[k], cs[k] = at, d
      end
      used = used + d
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
    if k == 0 then return 0, 0, 0, '' end
    local parts = {}
    if k > 1 then
      parts[1] = pack('<d', ts[1])
      for i = 1, k - 1 do parts[i + 1] = pack('<I6I4', ts[i + 1] - ts[i], cs[i]) end
    end
    return used, cs[k], ts[k], table.concat(parts)
  end

  -- slidingReset is rate.slidingReset.
  local function slidingReset(b, a, p, e)
    if b > 0 then return ceilnn(2 * p - e) end
    if a > 0 then return ceilnn(p - e) end
    return 0
  end

  -- apply is Limit.Apply for one bucket. It returns the verdict (allowed,
  -- impossible as 0/1; remaining, before, retry, reset as whole numbers) and the
  -- state to store (with its log) if the whole decision admits. start and
  -- stop are a calendar's window, g an exact sliding window's tick.
  local function apply(alg, count, period, cap, n, a, b, t, log, now, start, stop, g)
    if alg == LOG then
      local p, max = period, count
      local live, used, off, h = scan(a, b, t, log, now, p)
      local before = floornn(max - used)
      local rs = 0
      if live then rs = t + p - now end
      if n > count then
        return 0, 1, before, before, 0, rs, a, b, t, log
      end
      if used + n <= max then
        local a2, b2, t2, log2 = compact(live, used, off, h, b, t, log)
        a2, b2, t2, log2 = record(a2, b2, t2, log2, now, n, g)
        local reset = 0
        if b2 > 0 then reset = t2 + p - now end
        return 1, 0, floornn(max - used - n), before, 0, reset, a2, b2, t2, log2
      end
      return 0, 0, before, before, retry(t, log, off, h, now, p, used + n - max), rs, a, b, t, log
    elseif alg == SLIDING then
      local p, max = period, count
      a, b, t = slide(a, b, t, now, p)
      local e = now - t
      local est = a * (p - e) / p + b
      if n > count then
        return 0, 1, floornn(max - est), floornn(max - est), 0, slidingReset(b, a, p, e), a, b, t, log
      end
      if est + n <= max then
        return 1, 0, floornn(max - est - n), floornn(max - est), 0, slidingReset(b + n, a, p, e), a, b + n, t, log
      end
      local wait
      if b + n <= max then
        -- fits in this window once enough of the previous one has slid out
        wait = p - e - (max - b - n) * p / a
      else
        -- must wait for the next window, where this one becomes the previous
        wait = p - e + pos(p - (max - n) * p / b)
      end
      return 0, 0, floornn(max - est), floornn(max - est), ceilnn(wait) + 1, slidingReset(b, a, p, e), a, b, t, log
    elseif alg == CALENDAR then
      if t ~= start then a, b, t = 0, 0, start end
      local max = count
      local reset = stop - now
      if a == 0 then reset = 0 end
      if n > count then
        return 0, 1, floornn(max - a), floornn(max - a), 0, reset, a, b, t, log
      end
      if a + n <= max then
        return 1, 0, floornn(max - a - n), floornn(max - a), 0, stop - now, a + n, 0, start, log
      end
      return 0, 0, floornn(max - a), floornn(max - a), stop - now, reset, a, b, t, log
    end
    -- gcra (also any unknown name, like Limit.Apply's default)
    local perUnit = period / count
    local u = level(a, t, now, count, period)
    if n > cap then
      return 0, 1, floornn(cap - u), floornn(cap - u), 0, ceilnn(u * perUnit), a, b, t, log
    end
    local nxt = u + n
    if nxt <= cap then
      return 1, 0, floornn(cap - nxt), floornn(cap - u), 0, ceilnn(nxt * perUnit), nxt, 0, now, log
    end
    return 0, 0, floornn(cap - u), floornn(cap - u), ceilnn((nxt - cap) * perUnit) + 1, ceilnn(u * perUnit), a, b, t, log
  end

  -- adjust is Limit.Adjust: a refund (delta < 0) or a debt (delta > 0);
  -- charged is the start of the window the corrected cost was charged in
  -- (Limit.ChargeWindow: for an exact sliding window, the tick of its
  -- entry), 0 when unknown. It returns the new state and log.
  local function adjust(alg, count, period, delta, a, b, t, log, now, start, charged, g)
    if alg == LOG then
      return adjustLog(count, period, g, delta, a, b, t, log, now, charged)
    end
    local refund = delta < 0 and charged ~= 0
    if alg == SLIDING then
      a, b, t = slide(a, b, t, now, period)
      if not refund or charged == t then
        b = pos(b + delta)
      elseif charged + period == t then
        a = pos(a + delta)
      end
      return a, b, t, log
    elseif alg == CALENDAR then
      if t ~= start then a, b, t = 0, 0, start end
      if not refund or charged == start then a = pos(a + delta) end
      return a, b, t, log
    end
    return pos(level(a, t, now, count, period) + delta), b, now, log
  end

  -- ttl is Limit.TTL of a state about to be stored at now.
  local function ttl(alg, count, period, a, b, t, now, stop)
    if alg == LOG then
      if b == 0 then return 0 end
      return t + period - now
    end
    if alg == SLIDING then return t + 2 * period - now end
    if alg == CALENDAR then return stop - now end
    return ceilnn(level(a, t, now, count, period) * period / count)
  end

  -- put stores a state, keeping it at least Limit.TTL (ttl, in µs): after
  -- that it is equivalent to a fresh bucket. A state with no TTL is a full
  -- bucket, which needs no key at all.
  --
  -- Setting an expiry is a good part of a write's cost, so put sets one with
  -- room to spare (an eighth more than needed, and at least a second more, in
  -- whole ms: a busy bucket then takes the cheap path for its next requests)
  -- and remembers in
  -- the value, as E, until when that expiry is sure to keep the key (a
  -- millisecond early, as Redis counts expiry from its own millisecond
  -- clock). A later write whose TTL ends before E keeps the expiry as it is
  -- (KEEPTTL). Keeping state a little longer is harmless — it decays to a
  -- fresh bucket by itself — while dropping it early would over-admit.
  local function put(key, a, b, t, log, e, now, ttl)
    if ttl <= 0 then
      redis.call('DEL', key)
    elseif now + ttl <= e then
      redis.call('SET', key, pack('<dddd', a, b, t, e) .. log, 'KEEPTTL')
    else
      local margin = ttl / 8
      if margin < 1000000 then margin = 1000000 end
      local ms = math.ceil((ttl + margin) / 1000)
      redis.call('SET', key, pack('<dddd', a, b, t, now + (ms - 1) * 1000) .. log, 'PX', ms)
    end
  end

  return apply, adjust, ttl, window, decode, spec, put
end
