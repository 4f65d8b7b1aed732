-- lease.lua: gives back what earlier leases left unspent, then decides one
-- request and leases further capacity on its path, in one atomic step
-- (store.Memory.Lease is the same in Go; rate/lease.go explains leases).
-- A call may hold several grants (renewals sent together): each is applied
-- in turn, as if it were a call of its own.
--
-- KEYS are, for each grant, its bucket keys in order (none for a release
-- only), then its releases' keys in order. Only GCRA and calendar limits
-- are leased, so no key has a log.
--
-- ARGV holds two arguments per grant. The first is the grant: the test clock (µs) or 0 for Redis TIME, the
-- requests wanted (this one included), the share of what remains a lease
-- may take, the fraction of the capacity below which none is taken, how
-- long (µs) the leased units must last (the padding) and 1 for a renewal
-- (0 otherwise: a renewal has no request of its own, its decision charges
-- nothing and all the requests wanted are leased), then per bucket
-- decide.lua's numbers (algorithm code, count, period, capacity, cost, a
-- calendar's four window bounds). The second holds its releases, each adjust.lua's numbers (with the window of the charge in the
-- capacity's place; the cost is not used) followed by three doubles: when
-- the lease was charged, the level under its unspent units, and the units.
--
-- The reply, for each grant in turn: per bucket eight doubles (decide.lua's
-- six, then its GCRA level under the leased units: after the request's
-- charge and the padding, then the padding), then the extra requests
-- leased and the time of the decision; for a release only, just the time.
local apply, adjust, ttl, window, decode, spec, put, level = algorithms()
local unpk, pack, floor = struct.unpack, struct.pack, math.floor
local timeNow -- Redis TIME, read once for every grant of the call

-- one decides and leases one grant (ARGV's grant and releases) whose keys
-- are KEYS[k0 + 1 ...], and returns its reply and the last key it used.
local function one(grant, rel, k0)
  local now, want, share, minrem, hold, renew, i0 = unpk('<dddddd', grant)
  if now == 0 then
    if not timeNow then timeNow = clock(0) end
    now = timeNow
  end
  local written = {} -- by key name: the state a release left (false: none)
  -- A release's state is stored once, at the end: a key of the grant that
  -- admits is stored with the grant's charge on it (most releases are the
  -- previous lease of the same path), any other with what the release left.
  -- Until then written holds it with the key's expiry hint unchanged, which
  -- is still the key's.
  local later, order = {}, {}
  local function store(skip)
    for _, key in ipairs(order) do
      if not skip[key] then
        local s = later[key]
        put(key, s[1], s[2], s[3], s[4], now, s[5], '')
      end
    end
  end

  -- the grant's buckets, read before the releases' keys
  local nb = 0
  local specs = {}
  while i0 <= #grant do
    local alg, count, period, cap, n, w0, w1, w2, w3
    i0, alg, count, period, cap, n, w0, w1, w2, w3 = spec(grant, i0)
    nb = nb + 1
    specs[nb] = {alg, count, period, cap, n, w0, w1, w2, w3}
  end

  -- the keys: the grant's, then the releases'
  local nrel, j = 0, 1
  while j <= #rel do
    j = spec(rel, j) + 24 -- then '<ddd'
    nrel = nrel + 1
  end
  if nb + nrel == 0 then return pack('<d', now), k0 end
  local values = redis.call('MGET', unpack(KEYS, k0 + 1, k0 + nb + nrel))

  -- releases: rate.Limit.LeaseGiveBack
  local k = k0 + nb
  j = 1
  while j <= #rel do
    local alg, count, period, charged, _, w0, w1, w2, w3
    j, alg, count, period, charged, _, w0, w1, w2, w3 = spec(rel, j)
    local t0, off, units
    t0, off, units, j = unpk('<ddd', rel, j)
    k = k + 1
    local key = KEYS[k]
    local refund
    if alg == CALENDAR then
      refund = units
    else
      local elapsed = now - t0
      if elapsed < 0 then elapsed = 0 end
      local drained = elapsed * count / period - off
      if not (drained > 0) then drained = 0 end
      if drained > units then drained = units end
      refund = units - drained
    end
    if refund <= 0 then refund = 0 else refund = floor(refund) end
    if refund > 0 or alg ~= CALENDAR then
      local v = values[k - k0]
      if written[key] ~= nil then v = written[key] end
      local a, b, t, e = decode(v)
      local start, stop
      if alg == CALENDAR then
        start, stop = window(now, w0, w1, w2, w3)
        a, b, t = adjust(alg, count, period, -refund, a, b, t, now, start, charged)
      else
        -- the lease top: lowered only by the topmost lease
        local u = level(a, t, now, count, period)
        local top = level(b, t, now, count, period)
        if not (top < u) then top = u end
        local band = level(off + units, t0, now, count, period) -- this lease's top
        local slack = band -- rate.topSlack * math.Max(1, band)
        if not (slack > 1) then slack = 1 end
        slack = 1e-9 * slack
        if top + slack < band then
          refund = 0 -- reset since: the bucket does not hold these units
        elseif top <= band + slack then -- the topmost
          local under = level(off, t0, now, count, period)
          if not (top < under) then top = under end
        end
        a = u - refund
        if not (a > top) then a = top end
        b, t = top, now
      end
      local life = ttl(alg, count, period, a, t, now, stop)
      if later[key] == nil then order[#order + 1] = key end
      later[key] = {a, b, t, e, life}
      if life > 0 then written[key] = pack('<dddd', a, b, t, e) else written[key] = false end
    end
  end
  if nb == 0 then
    store({})
    return pack('<d', now), k
  end

  -- the decision: every bucket's verdict on the request's own cost (a renewal
  -- has none: it charges nothing)
  local st, res = {}, {}
  local admit = true
  for i = 1, nb do
    local s = specs[i]
    local v = values[i]
    if written[KEYS[k0 + i]] ~= nil then v = written[KEYS[k0 + i]] end
    local a, b, t, e = decode(v)
    local start, stop
    if s[1] == CALENDAR then start, stop = window(now, s[6], s[7], s[8], s[9]) end
    local ok, imp, remaining, before, retry, reset
    local n = s[5]
    if renew == 1 then n = 0 end
    ok, imp, remaining, before, retry, reset, a, b, t = apply(s[1], s[2], s[3], s[4], n, a, b, t, now, start, stop)
    st[i] = {a, b, t, e, start, stop}
    res[i] = {ok, imp, remaining, before, retry, reset}
    if ok == 0 then admit = false end
  end

  local extra = 0
  local levels, pads = {}, {}
  if admit then
    -- rate.Limit.LeasePad and LeaseExtra on every bucket
    extra = want - 1
    if renew == 1 then extra = want end
    for i = 1, nb do
      local s, n, remaining = specs[i], specs[i][5], res[i][3]
      local pad = 0
      if n > 0 and s[1] ~= CALENDAR then
        pad = s[2] * hold / s[3] - st[i][1]
        if pad <= 0 then pad = 0 else pad = math.ceil(pad) end
      end
      pads[i] = pad
      if n > 0 then
        if remaining < minrem * s[4] then
          extra = 0
        else
          local e = floor((share * remaining - pad) / n)
          if e < extra then extra = e end
        end
      end
    end
    if extra < 0 then extra = 0 end
    if extra > 0 then
      local leased, after = {}, {}
      for i = 1, nb do
        local s, c = specs[i], st[i]
        levels[i] = c[1] + pads[i]
        local ok, _, remaining, _, _, reset, a, b, t = apply(s[1], s[2], s[3], s[4], pads[i] + extra * s[5], c[1], c[2], c[3], now, c[5], c[6])
        if ok == 0 then extra = 0 break end
        if s[1] ~= CALENDAR and s[5] > 0 then b = a end -- rate.Limit.LeaseGranted
        leased[i] = {a, b, t}
        after[i] = {remaining, reset}
      end
      if extra > 0 then
        for i = 1, nb do
          st[i][1], st[i][2], st[i][3] = leased[i][1], leased[i][2], leased[i][3]
          res[i][3], res[i][6] = after[i][1], after[i][2]
        end
      else
        levels = {}
      end
    end
    local granted = {}
    for i = 1, nb do
      local s, c = specs[i], st[i]
      put(KEYS[k0 + i], c[1], c[2], c[3], c[4], now, ttl(s[1], s[2], s[3], c[1], c[3], now, c[6]), '')
      granted[KEYS[k0 + i]] = true
    end
    store(granted)
  else
    store({})
  end

  local reply = {}
  for i = 1, nb do
    local r = res[i]
    local remaining = r[3]
    if not admit then remaining = r[4] end -- store.Combine: nothing was charged
    local retry = r[5]
    local pad = 0
    if levels[i] then pad = pads[i] end
    reply[i] = pack('<dddddddd', r[1], r[2], remaining, r[4], retry, r[6], levels[i] or 0, pad)
  end
  reply[nb + 1] = pack('<dd', extra, now)
  return table.concat(reply), k
end

-- The grants of the call, one after the other, each seeing what the ones
-- before it left; their replies in order.
local out, k = {}, 0
for a = 1, #ARGV, 2 do
  local r
  r, k = one(ARGV[a], ARGV[a + 1], k)
  out[#out + 1] = r
end
return table.concat(out)
