-- rate.lua: the arithmetic of package rate (rate/rate.go, rate/log.go), in
-- Redis Lua.
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
-- than the arithmetic itself. An exact sliding window's adds two doubles,
-- its log's H and number of entries M, and keeps the entries themselves
-- in a list of its own (see logs).

-- The algorithm codes of the packed arguments (see lua.go); any other code
-- is gcra, like Limit.Apply's default. SLIDING is the two-counter estimate
-- (rate.SlidingApprox), LOG the exact sliding window (rate.Sliding), SLOTS
-- a concurrency limit (rate.Concurrent, see slots in decide.lua), IDEM an
-- idempotency record (rate.Idempotent).
local SLIDING, CALENDAR, LOG, SLOTS, IDEM = 1, 2, 3, 4, 5

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
--
-- algorithms('log') returns instead the functions of the exact sliding
-- window (inside). One factory for both: a script creates every closure of
-- its top level on every call, whether it uses it or not.
local function algorithms(log)
  if log then
    -- The exact sliding window (rate/log.go), for a call that has one.
    -- decide.lua uses apply, sync and reader; adjust.lua reader, scan and
    -- tickOf (with its logAdjust); both check.
    --
    -- Its state is split in two keys. The bucket's own key holds rate.State
    -- {A, B, T} and E, like every bucket's, then H and M: the time of the
    -- log's oldest entry and the number of entries (rate.Log's). The entries
    -- are a list at the bucket's log key (the next key in KEYS), oldest first,
    -- each the 10-byte string '<I6I4' of rate.Log: the gap in µs to the next
    -- newer entry, and the cost. A decision reads only the entries that have
    -- left the window (LINDEX, then LRANGE), pops them and pushes one,
    -- so its cost does not grow with the log: a whole log made into a Lua
    -- string would cost Redis about a µs per 1,000 bytes, each time.
    local unpk, pack = struct.unpack, struct.pack
    local MAXC = 4294967295 -- the most one entry holds (a uint32)

    local function floornn(x)
      if x <= 0 then return 0 end
      return math.floor(x)
    end

    -- check returns the state (b, h, m) with the log at lk as the bucket's key
    -- says it is (m entries); else — the list was evicted or deleted from
    -- under its key, or cut short — with the whole log counted as its newest
    -- charge (b = a, no entries), which leaves the window last: nothing
    -- lost can leave the window early, so nothing is over-admitted. (The
    -- stale list is replaced when the log next grows.)
    local function check(lk, a, b, h, m)
      if m > 0 and redis.call('LLEN', lk) ~= m then
        b = a
        if b > MAXC then b = MAXC end
        return b, 0, 0
      end
      return b, h, m
    end

    -- tickOf is Limit.tickOf: the end of the tick of g µs holding t.
    local function tickOf(t, g)
      local m = math.fmod(t, g)
      if m < 0 then m = m + g end
      if m > 0 then t = t + g - m end
      return t
    end

    -- reader returns entry(i): the gap and cost of entry i (from 0) of the
    -- list at lk. The first entry asked for is read alone (LINDEX: a
    -- decision usually needs one), then sixteen at a time (LRANGE). An
    -- entry the list does not have (evicted from under the bucket) reads as
    -- a cost of 0 at the previous entry's time: its charge is still counted
    -- in A until the newest leaves.
    local function reader(lk)
      local buf, base, n = nil, 0, 0
      return function(i)
        if i < base or i >= base + n then
          base = i
          if not buf then
            buf, n = {redis.call('LINDEX', lk, i)}, 1
          else
            buf, n = redis.call('LRANGE', lk, i, i + 15), 16
          end
        end
        local v = buf[i - base + 1]
        if not v or #v ~= 10 then return 0, 0 end
        return unpk('<I6I4', v)
      end
    end

    -- scan is Limit.scan: whether anything is in the window (now − p, now],
    -- the cost in it, how many entries have left it (d), and the time of the
    -- oldest entry still in it (t's own when none is).
    local function scan(a, b, t, h, m, now, p, entry)
      local cut = now - p
      if b == 0 or t <= cut then return false, 0, m, t end
      local used, d = a, 0
      if m == 0 then h = t end
      while d < m and h <= cut do
        local gap, cost = entry(d)
        used = used - cost
        h = h + gap
        d = d + 1
      end
      return true, used, d, h
    end

    -- apply is Limit.slidingLog: the verdict (as algorithms' apply), the
    -- state to store if the decision admits (a, b, t, h, m), and what that
    -- does to the list: drop entries from its front (-1: delete it, the
    -- window being empty), then push an entry (false: none; a push onto an
    -- empty log starts the list anew).
    local function apply(count, p, g, n, a, b, t, h, m, now, entry)
      local live, used, d
      live, used, d, h = scan(a, b, t, h, m, now, p, entry)
      local before = floornn(count - used)
      local rs = 0
      if live then rs = t + p - now end
      if n > count then
        return 0, 1, before, before, 0, rs, a, b, t, h, m, 0, false
      end
      if not (used + n <= count) then
        -- Limit.retry: until need units of the oldest charges have left
        local need, sum, i, at = used + n - count, 0, d, h
        while i < m do
          local gap, cost = entry(i)
          sum = sum + cost
          if sum >= need then break end
          at = at + gap
          i = i + 1
        end
        if i == m then at = t end
        return 0, 0, before, before, at + p - now, rs, a, b, t, h, m, 0, false
      end
      -- Limit.compact, then Limit.record
      local drop, push = d, false
      if not live then
        if m > 0 then drop = -1 end
        a, b, t, h, m = 0, 0, 0, 0, 0
      else
        a, m = used, m - d
        if m == 0 then h = 0 end
      end
      if n > 0 then
        local at = tickOf(now, g)
        if b == 0 then
          a, b, t = n, n, at
        else
          if at < t then at = t end
          if at == t and b + n <= MAXC then
            a, b = a + n, b + n
          else
            if m == 0 then h = t end
            push = pack('<I6I4', at - t, b)
            a, b, t, m = a + n, n, at, m + 1
          end
        end
      end
      local reset = 0
      if b > 0 then reset = t + p - now end
      return 1, 0, floornn(count - used - n), before, 0, reset, a, b, t, h, m, drop, push
    end

    -- sync does to the list at lk what an admitted decision's apply asked
    -- (drop, push), leaving it m entries, and keeps it at least as long as
    -- the bucket's key: with the key's new expiry (ms, as put returns it),
    -- or, for a list started anew under a kept expiry, until E (e).
    local function sync(lk, drop, push, m, ms, e, now)
      if drop < 0 then
        redis.call('DEL', lk)
      elseif drop > 0 then
        redis.call('LPOP', lk, drop)
      end
      if push then
        if m == 1 then redis.call('DEL', lk) end -- a new log: nothing stale under it
        redis.call('RPUSH', lk, push)
      end
      if m > 0 then
        if ms and ms ~= 0 then
          redis.call('PEXPIRE', lk, ms + 1)
        elseif push and m == 1 then
          redis.call('PEXPIRE', lk, math.ceil((e - now) / 1000) + 2)
        end
      end
    end

    return apply, sync, reader, scan, tickOf, check
  end
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
  -- until which the key's TTL is known to keep it (see put); an exact
  -- sliding window's H and M follow. A missing or unreadable value is the
  -- zero State, a fresh bucket.
  local function decode(v)
    if v and #v >= 32 then
      local a, b, t, e = struct.unpack('<dddd', v)
      return a, b, t, e
    end
    return 0, 0, 0, 0
  end

  -- spec reads one bucket's numbers from the packed argument s at offset i:
  -- its algorithm code, count, period, capacity, cost and its extras: for a
  -- calendar the window bounds, for an exact sliding window its tick
  -- (rate.Limit.Tick) as w0 (nil otherwise). It returns the offset of the
  -- next bucket first.
  local function spec(s, i)
    local alg, count, period, cap, n
    alg, count, period, cap, n, i = struct.unpack('<Bdddd', s, i)
    if alg == CALENDAR then
      local w0, w1, w2, w3
      w0, w1, w2, w3, i = struct.unpack('<dddd', s, i)
      return i, alg, count, period, cap, n, w0, w1, w2, w3
    elseif alg == LOG or alg == SLOTS then
      local g -- a sliding window's tick, a slot's holder
      g, i = struct.unpack('<d', s, i)
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
    if alg == IDEM then
      -- Limit.idempotent: a is when the record's request counts as ended.
      if a == 0 or now >= t + period then
        if n <= 0 then return 1, 0, 0, 0, 0, 0, a, b, t end
        return 1, 0, 0, 0, 0, 0, now + count, 0, now
      end
      if now < a then return 0, 0, 2, 2, ceilnn(a - now), 0, a, b, t end
      if b < cap then
        if n <= 0 then return 0, 0, 1, 1, 1, 0, a, b, t end
        return 0, 0, 1, 1, 1, 0, a, b + 1, t -- kept (decide.lua)
      end
      if n <= 0 then return 1, 0, 0, 0, 0, 0, a, b, t end
      return 1, 0, 0, 0, 0, 0, now + count, 0, now
    end
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
      local top = 0 -- the lease top, kept
      if b > 0 then top = level(b, t, now, count, period) end
      return 1, 0, floornn(cap - nxt), floornn(cap - u), 0, ceilnn(nxt * perUnit), nxt, top, now
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
    elseif alg == IDEM then
      if a == 0 or (charged ~= 0 and t ~= charged) then return a, b, t end
      if delta == -2 then return a, pos(b - 1), t end -- rate.UncountRetry
      if delta < 0 then return 0, 0, 0 end
      if delta > 0 and now < a then a = now end
      return a, b, t
    end
    -- never beneath the lease top (rate's Leases)
    local u = level(a, t, now, count, period)
    local top = level(b, t, now, count, period)
    if not (top < u) then top = u end
    a = u + delta
    if not (a > top) then a = top end
    return a, top, now
  end

  -- ttl is Limit.TTL of a state about to be stored at now.
  local function ttl(alg, count, period, a, t, now, stop)
    if alg == SLIDING then return t + 2 * period - now end
    if alg == CALENDAR then return stop - now end
    if alg == IDEM then
      if a == 0 then return 0 end
      return t + period - now
    end
    return ceilnn(level(a, t, now, count, period) * period / count)
  end

  -- put stores a state, keeping it at least Limit.TTL (ttl, in µs): after
  -- that it is equivalent to a fresh bucket. A state with no TTL is a full
  -- bucket, which needs no key at all. extra is what follows the four
  -- doubles ('' but for an exact sliding window). It returns what it did
  -- to the expiry (as decide.lua's act: a new one of ms, 0 kept, false
  -- deleted), E and the value stored (false: none).
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
  local function put(key, a, b, t, e, now, ttl, extra)
    if ttl <= 0 then
      redis.call('DEL', key)
      return false, e, false
    end
    local ms = 0
    if not (now + ttl <= e) then
      local margin = ttl / 8
      if margin < 1000000 then margin = 1000000 end
      ms = math.ceil((ttl + margin) / 1000)
      e = now + (ms - 1) * 1000
    end
    local v = struct.pack('<dddd', a, b, t, e) .. extra
    if ms == 0 then
      redis.call('SET', key, v, 'KEEPTTL')
    else
      redis.call('SET', key, v, 'PX', ms)
    end
    return ms, e, v
  end

  return apply, adjust, ttl, window, decode, spec, put, level
end

