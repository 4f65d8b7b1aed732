-- decide.lua: all-or-nothing decisions, one or a batch of them, in order.
--
-- KEYS are the distinct bucket keys of the call, each exact sliding
-- window's followed by its log key. ARGV[2], ARGV[3], ... are the
-- decisions, one packed string each (see lua.go): the test clock (µs) or 0
-- for Redis TIME, then per bucket its algorithm code, count, period (µs),
-- capacity, cost and, for a calendar limit, the bounds w0 < w1 < w2 < w3
-- of the previous, current and next windows, for an exact sliding window
-- its tick. ARGV[1] says which key each bucket of each decision uses: one
-- little-endian uint16 (an index into KEYS, from 1) per bucket, in order;
-- empty means the buckets of the call (all decisions counted together)
-- take the keys in order, two for an exact sliding window.
--
-- Each decision checks every one of its buckets before charging any: it is
-- charged to all of them or to none. The decisions of one call are applied
-- one after the other, each seeing the state the previous ones left, as if
-- each were its own call; together they are one atomic step. A key shared
-- by several decisions (a team's or an organisation's bucket) is read and
-- written once per call, which is what makes batching cheap for Redis.
--
-- The reply is one string: for each decision in order, six little-endian
-- doubles per bucket (allowed, impossible, remaining, before, retry (µs),
-- reset (µs)), then one double, the decision's time (µs): what a refund
-- of its charges gives as charged.
--
-- GCRA, the common algorithm, is rate.lua's apply and ttl written out in the
-- loop (the same operations in the same order): a call with a dozen
-- arguments and results costs more than its arithmetic.
local floor, ceil, pack, unpk = math.floor, math.ceil, struct.pack, struct.unpack
local values = redis.call('MGET', unpack(KEYS))
-- values[k] is key k's state as the decisions so far left it (a packed
-- string, or false for no key), and act[k] what to do with it at the end:
-- a number of ms sets the value with that expiry (SET … PX), 0 keeps the
-- key's expiry (SET … KEEPTTL), false deletes the key, nil leaves it.
-- Tables are created at the size of a 7-tier path (the nils count): growing
-- a Lua table one entry at a time costs more than a bucket's arithmetic.
-- Longer calls still work; they grow.
local act = {nil, nil, nil, nil, nil, nil, nil, nil}
-- reply holds one packed result per bucket, and each decision's time.
local reply = {'', '', '', '', '', '', '', ''}
local nr = 0
-- pend holds the current decision's writes, three entries per bucket: the
-- key's index, its new state and the expiry action.
local pend = {0, '', 0, 0, '', 0, 0, '', 0, 0, '', 0, 0, '', 0, 0, '', 0, 0, '', 0}
local map = ARGV[1]
local m0 = 1
local kn = 0 -- without a map: the last key taken (an exact sliding window takes two)
local timeNow
local apply, ttl, window, _ -- from algorithms, for the first sliding or calendar bucket
local lapply, lsync, reader, lcheck -- from algorithms('log'), for the first exact sliding window
-- lpend holds the current decision's log writes, six entries per exact
-- sliding window: its key's index, what apply said to drop and push, its
-- entries, and the key's expiry action and E.
local lpend, nl = nil, 0 -- made for the first exact sliding window
-- logged[k] is true when key k's log was written: its expiry is set again
-- after the key's own SET … PX below. Redis 7.0 takes each command's expiry
-- from the clock as the command runs, so a log expired mid-script by ms + 1
-- would end before a key given ms at the end of a script that ran longer
-- than a millisecond (a batch of decisions on a busy machine).
local logged
local nowPacked -- Redis TIME, packed once for every decision's reply
local used, spend -- concurrency limits' (SLOTS): made for the first
local keep -- idempotency records' writes on a refusal (IDEM): made for the first
-- SLOTRETRY is rate.ConcurrentRetry: a refused slot's retry (µs).
local SLOTRETRY = 1000000
for d = 2, #ARGV do
  local argv = ARGV[d]
  local now, i0 = unpk('<d', argv)
  if now == 0 then
    if not timeNow then timeNow = clock(0) end
    now = timeNow
  end
  local admit = true
  local np = 0
  local len = #argv
  while i0 <= len do
    local alg, count, period, cap, n, k
    alg, count, period, cap, n, i0 = unpk('<Bdddd', argv, i0)
    if map == '' then
      kn = kn + 1
      k = kn
    else
      k, m0 = unpk('<H', map, m0)
    end
    local a, b, t, e = 0, 0, 0, 0
    local v = values[k]
    if v and #v >= 32 then a, b, t, e = unpk('<dddd', v) end
    local ok, tl, res
    local extra, drop, push, h, m -- an exact sliding window's (extra: H and M, packed)
    if alg == 0 or alg > IDEM then
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
        res = pack('<dddddd', 0, 1, before, before, 0, reset)
      else
        local nxt = u + n
        if nxt <= cap then
          ok = 1
          local remaining = cap - nxt
          if remaining <= 0 then remaining = 0 else remaining = floor(remaining) end
          reset = nxt * perUnit
          if reset <= 0 then reset = 0 else reset = ceil(reset) end
          res = pack('<dddddd', 1, 0, remaining, before, 0, reset)
          -- ttl: the level of the new state at now is nxt itself (pos(nxt - 0))
          tl = nxt * period / count
          if tl <= 0 then tl = 0 else tl = ceil(tl) end
          if b > 0 then -- the lease top, kept (rate's Leases)
            b = b - elapsed * count / period
            if not (b > 0) then b = 0 end
          end
          a, b, t = nxt, b, now
        else
          ok = 0
          local retry = (nxt - cap) * perUnit
          if retry <= 0 then retry = 0 else retry = ceil(retry) end
          res = pack('<dddddd', 0, 0, before, before, retry + 1, reset)
        end
      end
    elseif alg == LOG then
      -- the exact sliding window: see algorithms('log') in rate.lua
      local g
      g, i0 = unpk('<d', argv, i0)
      if not lapply then
        lapply, lsync, reader, _, _, lcheck = algorithms('log')
        lpend = {}
      end
      if map == '' then kn = kn + 1 end -- its log key
      h, m = 0, 0
      if v and #v >= 48 then h, m = unpk('<dd', v, 33) end
      b, h, m = lcheck(KEYS[k + 1], a, b, h, m)
      local impossible, remaining, before, retry, reset
      ok, impossible, remaining, before, retry, reset, a, b, t, h, m, drop, push =
        lapply(count, period, g, n, a, b, t, h, m, now, reader(KEYS[k + 1]))
      res = pack('<dddddd', ok, impossible, remaining, before, retry, reset)
      if ok == 1 then
        tl = 0
        if b > 0 then tl = t + period - now end
        extra = pack('<dd', h, m)
      end
    elseif alg == SLOTS then
      -- A concurrency limit: the key is a sorted set of the slots taken,
      -- one member per request in flight (its holder, packed), scored
      -- with the time its holder must renew it by (period is that TTL).
      -- A slot not renewed in time belonged to an instance that is gone:
      -- it is dropped here. used[k] is the key's count as this call's
      -- decisions so far left it.
      local holder
      holder, i0 = unpk('<d', argv, i0)
      if not used then used = {} end
      local u = used[k]
      if not u then
        redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now)
        u = redis.call('ZCARD', KEYS[k])
        used[k] = u
      end
      local before = count - u
      if before < 0 then before = 0 end
      if n > count then
        ok = 0
        res = pack('<dddddd', 0, 1, before, before, 0, 0)
      elseif u + n <= count then
        ok = 1
        res = pack('<dddddd', 1, 0, before - n, before, 0, 0)
        if n > 0 then
          if not spend then spend = {} end
          spend[#spend + 1] = k
          spend[#spend + 1] = holder
          spend[#spend + 1] = period
        end
      else
        ok = 0
        res = pack('<dddddd', 0, 0, before, before, SLOTRETRY, 0)
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
      res = pack('<dddddd', ok, impossible, remaining, before, retry, reset)
      if ok == 1 then
        tl = ttl(alg, count, period, a, t, now, stop)
      elseif alg == IDEM and remaining == 1 and n > 0 then
        -- A retry let through, counted: written whatever the decision
        -- (rate.Result.Keep), with the record's own expiry (put's).
        local ktl, ms = ttl(alg, count, period, a, t, now, stop), 0
        if ktl <= 0 then
          ms = false
        elseif not (now + ktl <= e) then
          local margin = ktl / 8
          if margin < 1000000 then margin = 1000000 end
          ms = ceil((ktl + margin) / 1000)
          e = now + (ms - 1) * 1000
        end
        if not keep then keep = {} end
        keep[#keep + 1] = k
        keep[#keep + 1] = ms and pack('<dddd', a, b, t, e)
        keep[#keep + 1] = ms
      end
    end
    nr = nr + 1
    reply[nr] = res
    if ok == 0 then
      admit = false
    elseif admit and tl then -- (a concurrency limit's writes are spend's)
      -- rate.lua's put, decided now and done at the end if the decision
      -- admits: the expiry action, and E, the time until which the key's
      -- expiry is then known to keep it.
      local ms = 0
      if tl <= 0 then
        ms = false
      elseif not (now + tl <= e) then
        local margin = tl / 8
        if margin < 1000000 then margin = 1000000 end
        ms = ceil((tl + margin) / 1000)
        e = now + (ms - 1) * 1000
      end
      if not extra then
        pend[np + 1], pend[np + 2], pend[np + 3] = k, ms and pack('<dddd', a, b, t, e), ms
      else
        pend[np + 1], pend[np + 2], pend[np + 3] = k, ms and pack('<dddd', a, b, t, e) .. extra, ms
        lpend[nl + 1], lpend[nl + 2], lpend[nl + 3], lpend[nl + 4], lpend[nl + 5], lpend[nl + 6] = k, drop, push, m, ms, e
        nl = nl + 6
      end
      np = np + 3
    end
  end
  nr = nr + 1
  if now == timeNow then
    if not nowPacked then nowPacked = pack('<d', now) end
    reply[nr] = nowPacked
  else
    reply[nr] = pack('<d', now)
  end
  if admit and nl == 6 then
    -- The lists change now, so that the decisions after this one read
    -- them as this one left them.
    lsync(KEYS[lpend[1] + 1], lpend[2], lpend[3], lpend[4], lpend[5], lpend[6], now)
    if not logged then logged = {} end
    logged[lpend[1]] = true
  elseif admit and nl > 0 then
    -- Several logs. A key named twice in one decision (by two indexes in
    -- a lone call, by one in a batch) takes its last mention's state, as
    -- its value below does: so only its last mention's writes, and the
    -- longest new expiry of its mentions, as its key gets.
    local last, exp = {}, {}
    for j = 1, nl, 6 do
      local lk = KEYS[lpend[j] + 1]
      last[lk] = j
      local ms = lpend[j + 4]
      if ms and ms ~= 0 and not (exp[lk] and exp[lk] >= ms) then exp[lk] = ms end
    end
    for lk, j in pairs(last) do
      local ms = lpend[j + 4]
      if ms == 0 and exp[lk] then ms = exp[lk] end
      lsync(lk, lpend[j + 1], lpend[j + 2], lpend[j + 3], ms, lpend[j + 5], now)
      if not logged then logged = {} end
      logged[lpend[j]] = true
    end
  end
  nl = 0
  if keep then
    if not admit then
      for j = 1, #keep, 3 do
        local k, ms = keep[j], keep[j + 2]
        values[k] = keep[j + 1]
        if ms ~= 0 or not act[k] then act[k] = ms end
      end
    end
    keep = nil
  end
  if spend then
    -- The slots of this decision, taken if it admits.
    for j = 1, #spend, 3 do
      if admit then
        local k, ms = spend[j], math.ceil(spend[j + 2] / 1000) + 1000
        redis.call('ZADD', KEYS[k], now + spend[j + 2], pack('<d', spend[j + 1]))
        used[k] = used[k] + 1
        -- The set outlives every slot in it, by a second: a key kept
        -- longer by another instance's slot is not shortened.
        if redis.call('PTTL', KEYS[k]) < ms then redis.call('PEXPIRE', KEYS[k], ms) end
      end
      spend[j] = nil
    end
    spend = nil
  end
  if admit then
    for j = 1, np, 3 do
      local k, ms = pend[j], pend[j + 2]
      -- A full bucket has no key: a later decision sees a fresh one.
      values[k] = pend[j + 1]
      -- A new expiry that an earlier decision of this call set must still
      -- be set: a later one keeps it (its TTL fits before that E), not the
      -- key's current expiry.
      if ms ~= 0 or not act[k] then act[k] = ms end
    end
  end
end
for k = 1, #KEYS do
  local ms = act[k]
  if ms == 0 then
    redis.call('SET', KEYS[k], values[k], 'KEEPTTL')
  elseif ms then
    redis.call('SET', KEYS[k], values[k], 'PX', ms)
    if logged and logged[k] then redis.call('PEXPIRE', KEYS[k + 1], ms + 1) end
  elseif ms == false then
    redis.call('DEL', KEYS[k])
  end
end
return table.concat(reply, '', 1, nr)
