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
-- '<dddd'): the rate.State {A, B, T}, exact, and the expiry hint E of put.
-- Binary, because formatting and parsing decimal doubles would cost more
-- than the arithmetic itself.

-- The algorithm codes of the packed arguments (see lua.go); any other code
-- is gcra, like Limit.Apply's default.
local SLIDING, CALENDAR = 1, 2

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

  -- decode reads a stored state: the rate.State {A, B, T} and E, the time
  -- until which the key's TTL is known to keep it (see put). A missing or
  -- unreadable value is the zero State, a fresh bucket.
  local function decode(v)
    if v and #v == 32 then
      local a, b, t, e = struct.unpack('<dddd', v)
      return a, b, t, e
    end
    return 0, 0, 0, 0
  end

  -- spec reads one bucket's numbers from the packed argument s at offset i:
  -- its algorithm code, count, period, capacity, cost and, for calendars, the
  -- window bounds (nil otherwise). It returns the offset of the next bucket
  -- first.
  local function spec(s, i)
    local alg, count, period, cap, n
    alg, count, period, cap, n, i = struct.unpack('<Bdddd', s, i)
    if alg == CALENDAR then
      local w0, w1, w2, w3
      w0, w1, w2, w3, i = struct.unpack('<dddd', s, i)
      return i, alg, count, period, cap, n, w0, w1, w2, w3
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

  -- slidingReset is rate.slidingReset.
  local function slidingReset(b, a, p, e)
    if b > 0 then return ceilnn(2 * p - e) end
    if a > 0 then return ceilnn(p - e) end
    return 0
  end

  -- apply is Limit.Apply for one bucket. It returns the verdict (allowed,
  -- impossible as 0/1; remaining, before, retry, reset as whole numbers) and the
  -- state to store if the whole decision admits.
  local function apply(alg, count, period, cap, n, a, b, t, now, start, stop)
    if alg == SLIDING then
      local p, max = period, count
      a, b, t = slide(a, b, t, now, p)
      local e = now - t
      local est = a * (p - e) / p + b
      if n > count then
        return 0, 1, floornn(max - est), floornn(max - est), 0, slidingReset(b, a, p, e), a, b, t
      end
      if est + n <= max then
        return 1, 0, floornn(max - est - n), floornn(max - est), 0, slidingReset(b + n, a, p, e), a, b + n, t
      end
      local wait
      if b + n <= max then
        -- fits in this window once enough of the previous one has slid out
        wait = p - e - (max - b - n) * p / a
      else
        -- must wait for the next window, where this one becomes the previous
        wait = p - e + pos(p - (max - n) * p / b)
      end
      return 0, 0, floornn(max - est), floornn(max - est), ceilnn(wait) + 1, slidingReset(b, a, p, e), a, b, t
    elseif alg == CALENDAR then
      if t ~= start then a, b, t = 0, 0, start end
      local max = count
      local reset = stop - now
      if a == 0 then reset = 0 end
      if n > count then
        return 0, 1, floornn(max - a), floornn(max - a), 0, reset, a, b, t
      end
      if a + n <= max then
        return 1, 0, floornn(max - a - n), floornn(max - a), 0, stop - now, a + n, 0, start
      end
      return 0, 0, floornn(max - a), floornn(max - a), stop - now, reset, a, b, t
    end
    -- gcra (also any unknown name, like Limit.Apply's default)
    local perUnit = period / count
    local u = level(a, t, now, count, period)
    if n > cap then
      return 0, 1, floornn(cap - u), floornn(cap - u), 0, ceilnn(u * perUnit), a, b, t
    end
    local nxt = u + n
    if nxt <= cap then
      return 1, 0, floornn(cap - nxt), floornn(cap - u), 0, ceilnn(nxt * perUnit), nxt, 0, now
    end
    return 0, 0, floornn(cap - u), floornn(cap - u), ceilnn((nxt - cap) * perUnit) + 1, ceilnn(u * perUnit), a, b, t
  end

  -- adjust is Limit.Adjust: a refund (delta < 0) or a debt (delta > 0);
  -- charged is the start of the window the corrected cost was charged in
  -- (Limit.ChargeWindow), 0 when unknown.
  local function adjust(alg, count, period, delta, a, b, t, now, start, charged)
    local refund = delta < 0 and charged ~= 0
    if alg == SLIDING then
      a, b, t = slide(a, b, t, now, period)
      if not refund or charged == t then
        b = pos(b + delta)
      elseif charged + period == t then
        a = pos(a + delta)
      end
      return a, b, t
    elseif alg == CALENDAR then
      if t ~= start then a, b, t = 0, 0, start end
      if not refund or charged == start then a = pos(a + delta) end
      return a, b, t
    end
    return pos(level(a, t, now, count, period) + delta), b, now
  end

  -- ttl is Limit.TTL of a state about to be stored at now.
  local function ttl(alg, count, period, a, t, now, stop)
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
  local function put(key, a, b, t, e, now, ttl)
    if ttl <= 0 then
      redis.call('DEL', key)
    elseif now + ttl <= e then
      redis.call('SET', key, struct.pack('<dddd', a, b, t, e), 'KEEPTTL')
    else
      local margin = ttl / 8
      if margin < 1000000 then margin = 1000000 end
      local ms = math.ceil((ttl + margin) / 1000)
      redis.call('SET', key, struct.pack('<dddd', a, b, t, now + (ms - 1) * 1000), 'PX', ms)
    end
  end

  return apply, adjust, ttl, window, decode, spec, put
end
