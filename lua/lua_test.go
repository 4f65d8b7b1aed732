package lua_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/lua"
	"github.com/caddy-cascade/cascade/rate"
)

// TestMain stops the Redis processes shared by this package's tests.
func TestMain(m *testing.M) { redistest.Main(m) }

func client(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr(), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestScriptsLoad checks that both scripts compile in Redis (SCRIPT LOAD
// compiles) and that go-redis's digest is Redis's, so EVALSHA finds what
// SCRIPT LOAD stored.
func TestScriptsLoad(t *testing.T) {
	c := client(t)
	for _, tt := range []struct {
		name   string
		script *redis.Script
	}{{"Decide", lua.Decide}, {"Adjust", lua.Adjust}, {"Lease", lua.Lease}} {
		want := tt.script.Hash()
		sha, err := tt.script.Load(context.Background(), c).Result()
		if err != nil {
			t.Fatalf("%s: SCRIPT LOAD: %v", tt.name, err)
		}
		if sha != want {
			t.Fatalf("%s: Redis digest %s, go-redis digest %s", tt.name, sha, want)
		}
	}
}

// args lays out ARGV as the package doc says: one string of little-endian
// float64s (the algorithm code a byte) holding the clock, then per bucket
// the algorithm code, count, period, capacity, cost and, for calendars,
// the previous, current and next windows around wall, for exact sliding
// windows the tick. It is written here
// independently of the store's encoder, so the two check each other
// against the doc.
func args(now, wall int64, buckets ...bucketArgs) []any {
	spec := f64(nil, now)
	for _, b := range buckets {
		l := b.limit
		code := byte(0)
		switch l.Algorithm {
		case rate.SlidingApprox:
			code = 1
		case rate.Calendar:
			code = 2
		case rate.Sliding:
			code = 3
		case rate.Idempotent:
			code = 5
		}
		spec = append(spec, code)
		third := l.Capacity()
		if b.adjust {
			third = l.ChargeWindow(b.charged)
		}
		nums := []int64{l.Count, l.Period.Microseconds(), third, b.cost}
		if l.Algorithm == rate.Sliding {
			nums = append(nums, l.Tick())
		}
		if l.Algorithm == rate.Calendar {
			s, e := l.Window(wall)
			p, _ := l.Window(s - 1)
			_, n := l.Window(e)
			nums = append(nums, p, s, e, n)
		}
		for _, n := range nums {
			spec = f64(spec, n)
		}
	}
	return []any{spec}
}

// decideArgs is ARGV of a lone decision for lua.Decide: no key map (bucket
// j uses KEYS[j]), then the decision's packed numbers.
func decideArgs(now, wall int64, buckets ...bucketArgs) []any {
	return append([]any{""}, args(now, wall, buckets...)...)
}

// bucketArgs is one key's limit and cost (or delta) for args; for
// lua.Adjust (adjust), charged is when the corrected cost was charged.
type bucketArgs struct {
	limit   rate.Limit
	cost    int64
	adjust  bool
	charged int64
}

func f64(dst []byte, n int64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(n)))
}

// decideReply reads a Decide reply of decisions of sizes[i] buckets each:
// six little-endian float64s per bucket, each a whole number, then the
// decision's time, which must be now (unless now is 0: Redis TIME). It
// returns the buckets' values, every decision's in order.
func decideReply(t *testing.T, reply string, now int64, sizes ...int) []int64 {
	t.Helper()
	var out []int64
	read := func() int64 {
		if len(reply) < 8 {
			t.Fatalf("decide reply too short for decisions of %v buckets", sizes)
		}
		f := math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply)))
		reply = reply[8:]
		if f != math.Trunc(f) {
			t.Fatalf("decide reply value %v is not a whole number", f)
		}
		return int64(f)
	}
	for _, n := range sizes {
		for i := 0; i < 6*n; i++ {
			out = append(out, read())
		}
		if at := read(); now != 0 && at != now {
			t.Fatalf("decision replied time %d, want %d", at, now)
		}
	}
	if len(reply) != 0 {
		t.Fatalf("decide reply has %d bytes more than decisions of %v buckets", len(reply), sizes)
	}
	return out
}

// logKey is the key of an exact sliding window's log, as the store names
// it for keys with a hash tag (all of this file's).
func logKey(key string) string { return key + "~log" }

// scriptKeys is KEYS for buckets of these keys and limits, in order: an
// exact sliding window's key followed by its log key.
func scriptKeys(keys []string, limits []rate.Limit) []string {
	var out []string
	for i, k := range keys {
		out = append(out, k)
		if limits[i].Algorithm == rate.Sliding {
			out = append(out, logKey(k))
		}
	}
	return out
}

// encodeState is the value of a bucket's key holding s with an expiry
// hint E of e: four float64s, and for an exact sliding window (l) its
// log's H and number of entries.
func encodeState(l rate.Limit, s rate.State, e float64) string {
	f := []float64{s.A, s.B, float64(s.T), e}
	if l.Algorithm == rate.Sliding {
		var h float64
		if s.Log != nil {
			h = float64(s.Log.H)
		}
		f = append(f, h, float64(s.Log.Len()))
	}
	var b []byte
	for _, x := range f {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return string(b)
}

// logEntries is the list that holds the entries of s's log, oldest first.
func logEntries(s rate.State) []any {
	b, _ := s.Log.AppendBinary(nil)
	var out []any
	for off := 8; off < len(b); off += 10 {
		out = append(out, string(b[off:off+10]))
	}
	return out
}

// setState stores s at key as a previous write left it: its expiry hint
// e, an expiry of px ms (none when 0), and an exact sliding window's log.
func setState(ctx context.Context, c *redis.Client, key string, l rate.Limit, s rate.State, e float64, px int64) {
	c.Set(ctx, key, encodeState(l, s, e), time.Duration(px)*time.Millisecond)
	if l.Algorithm == rate.Sliding {
		c.Del(ctx, logKey(key))
		if es := logEntries(s); len(es) > 0 {
			c.RPush(ctx, logKey(key), es...)
			if px > 0 {
				c.PExpire(ctx, logKey(key), time.Duration(px+1)*time.Millisecond)
			}
		}
	}
}

// getState reads the state stored at key (redis.Nil when there is no key)
// and its expiry hint. An exact sliding window's log must have as many
// entries as its key says, and an expiry no shorter than the key's.
func getState(t *testing.T, ctx context.Context, c *redis.Client, key string, l rate.Limit) (rate.State, float64, error) {
	t.Helper()
	v, err := c.Get(ctx, key).Result()
	if err != nil {
		if l.Algorithm == rate.Sliding {
			if n := c.Exists(ctx, logKey(key)).Val(); n != 0 && errors.Is(err, redis.Nil) {
				t.Fatalf("%s: no key, but its log is left", key)
			}
		}
		return rate.State{}, 0, err
	}
	size := 32
	if l.Algorithm == rate.Sliding {
		size = 48
	}
	if len(v) != size {
		t.Fatalf("stored state %q is not %d bytes", v, size)
	}
	f := make([]float64, size/8)
	for i := range f {
		f[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[8*i:])))
	}
	if f[2] != math.Trunc(f[2]) {
		t.Fatalf("stored T %v is not a whole µs", f[2])
	}
	s := rate.State{A: f[0], B: f[1], T: int64(f[2])}
	if size == 48 {
		entries, err := c.LRange(ctx, logKey(key), 0, -1).Result()
		if err != nil {
			t.Fatalf("%s: log: %v", key, err)
		}
		if len(entries) != int(f[5]) {
			t.Fatalf("%s: the key says %v entries, its log has %d", key, f[5], len(entries))
		}
		if len(entries) == 0 && f[4] != 0 {
			t.Fatalf("%s: no entries, H %v", key, f[4])
		}
		if len(entries) > 0 {
			b := binary.LittleEndian.AppendUint64(nil, math.Float64bits(f[4]))
			for _, e := range entries {
				b = append(b, e...)
			}
			if s.Log, err = rate.ParseLog(b); err != nil {
				t.Fatalf("%s: log: %v", key, err)
			}
			// Absolute expiry times: two PTTLs read one after the other
			// would differ by the time between the reads.
			if kt, lt := c.PExpireTime(ctx, key).Val(), c.PExpireTime(ctx, logKey(key)).Val(); kt > 0 && lt < kt {
				t.Fatalf("%s: the log expires at %v, before its key (%v)", key, lt, kt)
			}
		}
	}
	return s, f[3], nil
}

// sameState compares states bit for bit (+0 and -0 are the same state),
// logs included.
func sameState(a, b rate.State) bool {
	la, _ := a.Log.AppendBinary(nil)
	lb, _ := b.Log.AppendBinary(nil)
	return a.T == b.T && a.A == b.A && a.B == b.B && string(la) == string(lb)
}

// logTimes lists the times of a sliding log's entries, oldest first, the
// newest (s.T) included: the ticks a refund may name.
func logTimes(s rate.State) []int64 {
	if s.B == 0 {
		return nil
	}
	var out []int64
	if b, _ := s.Log.AppendBinary(nil); len(b) > 0 {
		t := int64(math.Float64frombits(binary.LittleEndian.Uint64(b)))
		for off := 8; off < len(b); off += 10 {
			out = append(out, t)
			var gap uint64
			for i := 5; i >= 0; i-- {
				gap = gap<<8 | uint64(b[off+i])
			}
			t += int64(gap)
		}
	}
	return append(out, s.T)
}

// shiftState moves a state by d µs: every time in it, the log's too.
func shiftState(s rate.State, d int64) rate.State {
	s.T += d
	if s.Log != nil {
		g := *s.Log
		g.H += d
		s.Log = &g
	}
	return s
}

// randomRun gives a randomized test its source of random numbers, from a
// seed it logs (a failure can be replayed by fixing the seed here), and
// its number of cases: full, or short under -short.
func randomRun(t *testing.T, stream uint64, full, short int) (r *rand.Rand, seed uint64, n int) {
	t.Helper()
	seed = uint64(time.Now().UnixNano())
	if v := os.Getenv("CASCADE_SEED"); v != "" { // to replay a failure
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CASCADE_SEED: %v", err)
		}
	}
	t.Logf("seed %d", seed)
	n = full
	if testing.Short() {
		n = short
	}
	return rand.New(rand.NewPCG(seed, stream)), seed, n
}

// testCase is one random bucket: a limit, a stored state, a time and a cost.
type testCase struct {
	limit rate.Limit
	state rate.State
	fresh bool  // no key at all (the zero state)
	now   int64 // Redis's time (injected)
	wall  int64 // the Go clock the calendar windows come from
	cost  int64
}

func (c testCase) String() string {
	return fmt.Sprintf("limit=%+v state=%+v fresh=%v now=%d wall=%d cost=%d", c.limit, c.state, c.fresh, c.now, c.wall, c.cost)
}

var zones = func() []*time.Location {
	out := []*time.Location{nil, time.UTC, time.FixedZone("UTC-5", -5*3600)}
	for _, name := range []string{"Europe/Paris", "America/New_York", "Asia/Kolkata"} {
		if loc, err := time.LoadLocation(name); err == nil {
			out = append(out, loc)
		}
	}
	return out
}()

func randomCase(r *rand.Rand) testCase {
	periods := []time.Duration{time.Microsecond, 7 * time.Microsecond, time.Second, 15 * time.Second,
		time.Minute, 30 * time.Minute, time.Hour, 24 * time.Hour,
		time.Duration(1+r.Int64N(1e13)) * time.Nanosecond}
	base := time.Date(2026, 3, 18, 10, 30, 0, 0, time.UTC).UnixMicro()
	c := testCase{now: base + r.Int64N(400*24*3600*1e6)}
	c.wall = c.now
	switch r.IntN(6) {
	case 5: // an idempotency record: none, in flight, ended, expired
		l := rate.Limit{Algorithm: rate.Idempotent, Count: 1 + r.Int64N(120e6), Period: periods[2+r.IntN(len(periods)-2)], Burst: r.Int64N(4)}
		c.state.T = c.now - r.Int64N(2*l.Period.Microseconds()+1)
		c.state.A = float64(c.state.T + r.Int64N(l.Count+1))
		c.state.B = float64(r.Int64N(5)) // retries let through so far
		if r.IntN(10) == 0 {
			c.state.T = c.now + r.Int64N(1000) // from the future (clock skew)
		}
		c.limit, c.cost = l, r.Int64N(2)
	case 0, 1: // gcra (and the empty algorithm name, which means gcra)
		alg := rate.GCRA
		if r.IntN(10) == 0 {
			alg = ""
		}
		l := rate.Limit{Algorithm: alg, Count: 1 + r.Int64N(1000), Period: periods[r.IntN(len(periods))]}
		if r.IntN(2) == 0 {
			l.Burst = 1 + r.Int64N(2*l.Count)
		}
		capacity := float64(l.Capacity())
		switch r.IntN(3) {
		case 0:
			c.state.A = float64(r.Int64N(int64(capacity) + 3))
		case 1:
			c.state.A = r.Float64() * capacity * 1.5
		default:
			c.state.A = capacity + float64(r.Int64N(3*int64(capacity)+1)) // debt
		}
		c.state.T = c.now - r.Int64N(2*l.Period.Microseconds()+1)
		if r.IntN(10) == 0 {
			c.state.T = c.now + r.Int64N(1000) // a state from the future (clock skew)
		}
		c.limit, c.cost = l, r.Int64N(l.Capacity()+3)
	case 4: // exact sliding window: a log built by random charges (and refunds)
		l := rate.Limit{Algorithm: rate.Sliding, Count: 1 + r.Int64N(200), Period: periods[r.IntN(len(periods))]}
		if r.IntN(4) == 0 {
			l.Count = rate.MaxExact + r.Int64N(3*rate.MaxExact) // a coarse tick
		}
		p := l.Period.Microseconds()
		at := c.now - r.Int64N(2*p+1)
		for k := r.IntN(60); k > 0; k-- {
			switch r.IntN(4) {
			case 0: // the same µs
			case 1:
				at += r.Int64N(p + 1)
			default:
				at += r.Int64N(p/int64(1+r.IntN(50)) + 1)
			}
			next, res := l.Apply(c.state, at, 1+r.Int64N(1+l.Count/10))
			if res.Allowed {
				c.state = next
			}
			if r.IntN(8) == 0 { // a refund, maybe to nothing
				c.state = l.Adjust(c.state, at, -1-r.Int64N(3), l.ChargeWindow(at))
			}
		}
		if r.IntN(10) == 0 {
			c.now = at - r.Int64N(1000) // a log from the future (clock skew)
			c.wall = c.now
		}
		c.limit, c.cost = l, r.Int64N(l.Count+3)
	case 2: // the two-counter sliding window
		l := rate.Limit{Algorithm: rate.SlidingApprox, Count: 1 + r.Int64N(200), Period: periods[r.IntN(len(periods))]}
		p := l.Period.Microseconds()
		start := c.now - c.now%p
		c.state = rate.State{A: float64(r.Int64N(l.Count + 5)), B: float64(r.Int64N(l.Count + 5))}
		switch r.IntN(4) {
		case 0:
			c.state.T = start
		case 1:
			c.state.T = start - p
		case 2:
			c.state.T = start - p*(2+r.Int64N(5))
		default:
			c.now = start + r.Int64N(3) // at a window's very start
			c.wall, c.state.T = c.now, start-p
		}
		if r.IntN(5) == 0 {
			c.state.B += 0.5 // fractional counts appear after adjustments in tests
		}
		c.limit, c.cost = l, r.Int64N(l.Count+3)
	default: // calendar, or a fixed window aligned to the epoch
		units := []rate.Unit{rate.Hour, rate.Day, rate.Week, rate.Month, rate.Fixed}
		l := rate.Limit{Algorithm: rate.Calendar, Count: 1 + r.Int64N(100000), Unit: units[r.IntN(len(units))], Location: zones[r.IntN(len(zones))]}
		skew := int64(5_000_000)
		if l.Unit == rate.Fixed {
			periods := []time.Duration{time.Second, time.Minute, 10 * time.Minute, time.Hour, 30 * 24 * time.Hour, 1234567 * time.Microsecond}
			l.Period = periods[r.IntN(len(periods))]
			skew = min(skew, l.Period.Microseconds()/2) // clocks less than half a window apart
		}
		start, end := l.Window(c.now)
		if r.IntN(3) == 0 {
			// Near a boundary, with Go's clock up to 5 s away from Redis's:
			// the script must still use the window holding its own time.
			c.now = end - skew + r.Int64N(2*skew)
			c.wall = c.now - skew + r.Int64N(2*skew+1)
			start, _ = l.Window(c.now)
		}
		c.state.A = float64(r.Int64N(l.Count + 5))
		switch r.IntN(3) {
		case 0:
			c.state.T = start
		case 1:
			c.state.T, _ = l.Window(start - 1)
		default:
			c.state.T = start - 12345
		}
		c.limit, c.cost = l, r.Int64N(l.Count+3)
	}
	if r.IntN(8) == 0 {
		c.state, c.fresh = rate.State{}, true
	}
	return c
}

// TestScriptsMirrorRate runs random buckets through lua.Decide and
// lua.Adjust on a real Redis and through rate.Limit.Apply and Adjust in Go,
// and requires identical results, bit-identical stored state, and a PTTL
// that is Limit.TTL rounded up to whole milliseconds.
func TestScriptsMirrorRate(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	r, seed, n := randomRun(t, 7, 4000, 500)
	key := fmt.Sprintf("{lua-test-%d}:k", seed)
	outcomes := map[string]int{}
	for i := 0; i < n; i++ {
		tc := randomCase(r)
		adjust := i%3 == 2
		if adjust {
			tc.cost -= tc.limit.Capacity() / 2 // refunds as well as debts
		}
		// The key as a previous write left it: its expiry hint E and a
		// matching TTL, or (half the time) no hint, so that a write must
		// set an expiry.
		var e0 float64
		var px0 int64 // ms
		// Expiries count down in real time from here: sinceSet (ms,
		// rounded up) bounds how far by the time it is called.
		setAt := time.Now()
		sinceSet := func() int64 { return time.Since(setAt).Milliseconds() + 1 }
		switch {
		case tc.fresh:
			c.Del(ctx, key, logKey(key))
		case r.IntN(2) == 0:
			setState(ctx, c, key, tc.limit, tc.state, 0, 0)
		default:
			px0 = 1 + r.Int64N(10_000_000)
			e0 = float64(tc.now + (px0-1)*1000)
			setState(ctx, c, key, tc.limit, tc.state, e0, px0)
		}
		keys := scriptKeys([]string{key}, []rate.Limit{tc.limit})

		var want rate.State
		store, kept := true, false
		if adjust {
			// The corrected cost was charged now, a window or two ago, at
			// an unknown time, or at any time in the last two periods.
			p := tc.limit.Period.Microseconds()
			if tc.limit.Algorithm == rate.Calendar {
				p = 31 * 24 * 3600 * 1_000_000
			}
			charged := []int64{0, tc.now, tc.now - p, tc.now - 2*p, tc.now - r.Int64N(2*p+1)}[r.IntN(5)]
			if tc.limit.Algorithm == rate.Idempotent && r.IntN(2) == 0 {
				charged = tc.state.T // the record's own charge: ended (+1) or forgotten (−1)
			}
			if ts := logTimes(tc.state); tc.limit.Algorithm == rate.Sliding && len(ts) > 0 && r.IntN(3) > 0 {
				charged = ts[r.IntN(len(ts))] // a charge the log holds
			}
			b := bucketArgs{limit: tc.limit, cost: tc.cost, adjust: true, charged: charged}
			if err := lua.Adjust.Run(ctx, c, keys, args(tc.now, tc.wall, b)...).Err(); err != nil {
				t.Fatalf("case %d (%v): Adjust: %v", i, tc, err)
			}
			want = tc.limit.Adjust(tc.state, tc.now, tc.cost, tc.limit.ChargeWindow(charged))
		} else {
			raw, err := lua.Decide.Run(ctx, c, keys, decideArgs(tc.now, tc.wall, bucketArgs{limit: tc.limit, cost: tc.cost})...).Text()
			if err != nil {
				t.Fatalf("case %d (%v): Decide: %v", i, tc, err)
			}
			got := decideReply(t, raw, tc.now, 1)
			next, res := tc.limit.Apply(tc.state, tc.now, tc.cost)
			wantReply := []int64{b2i(res.Allowed), b2i(res.Impossible), res.Remaining, res.Before, res.RetryAfter, res.Reset}
			if fmt.Sprint(got) != fmt.Sprint(wantReply) {
				t.Fatalf("case %d (%v):\nscript replied %v\nrate.Apply     %v", i, tc, got, wantReply)
			}
			want, store, kept = next, res.Allowed, res.Keep
		}
		outcomes[fmt.Sprintf("%s adjust=%v stored=%v", algName(tc.limit), adjust, store)]++

		got, e, err := getState(t, ctx, c, key, tc.limit)
		ttl := tc.limit.TTL(want, tc.now)
		switch {
		case kept: // a denial that keeps the record's new state, with its expiry
			if err != nil || !sameState(got, want) {
				t.Fatalf("case %d (%v): a kept denial stored %+v (%v), want %+v", i, tc, got, err, want)
			}
			continue
		case !store: // a denial writes nothing
			if tc.fresh && !errors.Is(err, redis.Nil) || !tc.fresh && (err != nil || !sameState(got, tc.state) || e != e0) {
				t.Fatalf("case %d (%v): a denied decision changed the state to %+v (%v)", i, tc, got, err)
			}
			continue
		case ttl <= 0: // a full bucket needs no key
			if !errors.Is(err, redis.Nil) {
				t.Fatalf("case %d (%v): want no key for a full bucket, have %+v (%v)", i, tc, got, err)
			}
			continue
		}
		// The expiry: kept when the one set before lasts long enough,
		// else set an eighth (and at least a second) longer than needed.
		wantE, wantPX := e0, px0
		if float64(tc.now+ttl) > e0 {
			wantPX = int64(math.Ceil((float64(ttl) + math.Max(float64(ttl)/8, 1e6)) / 1000))
			wantE = float64(tc.now + (wantPX-1)*1000)
		}
		if errors.Is(err, redis.Nil) && wantPX <= sinceSet() {
			continue // a TTL of a few ms may run out in real time before GET
		}
		if err != nil {
			t.Fatalf("case %d (%v): GET: %v", i, tc, err)
		}
		if !sameState(got, want) {
			t.Fatalf("case %d (%v):\nscript stored %+v\nrate wants    %+v", i, tc, got, want)
		}
		if e != wantE {
			t.Fatalf("case %d (%v): expiry hint %v, want %v", i, tc, e, wantE)
		}
		pttl, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatalf("case %d (%v): PTTL: %v", i, tc, err)
		}
		// PTTL counts down in real time: allow what ran of it since the
		// expiry was set (a second at least), and a TTL that short to have
		// run out. It must cover Limit.TTL.
		ms, ran := pttl.Milliseconds(), sinceSet()
		slack := max(ran, 1000)
		if ms > wantPX || ms < wantPX-slack || ms <= 0 && wantPX > ran || ms*1000 < ttl-slack*1000 {
			t.Fatalf("case %d (%v): PTTL %d ms %d ms after the expiry was set, want %d ms, covering a TTL of %d µs", i, tc, ms, ran, wantPX, ttl)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

// TestDecidePathMirrorsRate runs random paths of one to six buckets of
// mixed algorithms through one lua.Decide, so that every bucket's numbers
// are read at the right offset of the packed argument, and requires each
// bucket's reply to be rate.Limit.Apply's and the stored states to be all
// written (every bucket admits) or all untouched.
func TestDecidePathMirrorsRate(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	r, seed, n := randomRun(t, 11, 600, 100)
	admitted := 0
	for i := 0; i < n; i++ {
		path := make([]testCase, 1+r.IntN(6))
		keys := make([]string, len(path))
		limits := make([]rate.Limit, len(path))
		buckets := make([]bucketArgs, len(path))
		for j := range path {
			path[j] = randomCase(r)
			keys[j] = fmt.Sprintf("{lua-path-%d}:%d", seed, j)
			limits[j] = path[j].limit
			buckets[j] = bucketArgs{limit: path[j].limit, cost: path[j].cost}
			if path[j].fresh {
				c.Del(ctx, keys[j], logKey(keys[j]))
			} else {
				setState(ctx, c, keys[j], path[j].limit, path[j].state, 0, 0)
			}
		}
		now := path[0].now // one instant for the whole decision
		raw, err := lua.Decide.Run(ctx, c, scriptKeys(keys, limits), decideArgs(now, now, buckets...)...).Text()
		if err != nil {
			t.Fatalf("path %d: Decide: %v", i, err)
		}
		got := decideReply(t, raw, now, len(path))
		if len(got) != 6*len(path) {
			t.Fatalf("path %d: %d reply values for %d buckets", i, len(got), len(path))
		}
		all := true
		next := make([]rate.State, len(path))
		kept := make([]bool, len(path))
		for j, tc := range path {
			var res rate.Result
			next[j], res = tc.limit.Apply(tc.state, now, tc.cost)
			kept[j] = res.Keep
			want := []int64{b2i(res.Allowed), b2i(res.Impossible), res.Remaining, res.Before, res.RetryAfter, res.Reset}
			if fmt.Sprint(got[6*j:6*j+6]) != fmt.Sprint(want) {
				t.Fatalf("path %d bucket %d (%v at %d):\nscript replied %v\nrate.Apply     %v", i, j, tc, now, got[6*j:6*j+6], want)
			}
			all = all && res.Allowed
		}
		if all {
			admitted++
		}
		for j, tc := range path {
			st, _, err := getState(t, ctx, c, keys[j], tc.limit)
			switch {
			case !all && kept[j]:
				if err != nil || !sameState(st, next[j]) {
					t.Fatalf("path %d bucket %d: a kept record stored %+v (%v), want %+v", i, j, st, err, next[j])
				}
			case !all && tc.fresh:
				if !errors.Is(err, redis.Nil) {
					t.Fatalf("path %d bucket %d: a denied path wrote %+v", i, j, st)
				}
			case !all:
				if err != nil || !sameState(st, tc.state) {
					t.Fatalf("path %d bucket %d: a denied path changed the state to %+v (%v)", i, j, st, err)
				}
			case tc.limit.TTL(next[j], now) <= 0:
				if !errors.Is(err, redis.Nil) {
					t.Fatalf("path %d bucket %d: want no key for a full bucket, have %+v (%v)", i, j, st, err)
				}
			case errors.Is(err, redis.Nil) && tc.limit.TTL(next[j], now) < 2_000_000:
				// a very short TTL may run out in real time before GET
			default:
				if err != nil {
					t.Fatalf("path %d bucket %d: GET: %v", i, j, err)
				}
				if !sameState(st, next[j]) {
					t.Fatalf("path %d bucket %d (%v):\nscript stored %+v\nrate wants    %+v", i, j, tc, st, next[j])
				}
			}
		}
	}
	t.Logf("%d of %d paths admitted", admitted, n)
}

func algName(l rate.Limit) string {
	if l.Algorithm == "" {
		return "(gcra)"
	}
	return string(l.Algorithm)
}

// TestDecideAllOrNothing checks, at the script level, that one denying key
// leaves every other key untouched, and that the clock argument replaces
// TIME only when non-zero.
func TestDecideAllOrNothing(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	now := time.Date(2026, 3, 18, 10, 30, 0, 0, time.UTC).UnixMicro()
	keys := []string{"{lua-aon}:org", "{lua-aon}:user"}
	c.Del(ctx, keys...)
	org := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Minute}
	user := rate.Limit{Algorithm: rate.GCRA, Count: 1, Period: time.Hour}
	argv := decideArgs(now, now, bucketArgs{limit: org, cost: 1}, bucketArgs{limit: user, cost: 1})

	tests := []struct {
		name     string
		want     []int64
		orgLevel float64
	}{
		{"both admit", []int64{1, 0, 9, 10, 0, 6000000, 1, 0, 0, 1, 0, 3600000000}, 1},
		{"user denies, org untouched", []int64{1, 0, 8, 9, 0, 12000000, 0, 0, 0, 0, 3600000001, 3600000000}, 1},
	}
	for _, tt := range tests {
		raw, err := lua.Decide.Run(ctx, c, keys, argv...).Text()
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got := decideReply(t, raw, now, 2)
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Fatalf("%s: reply %v, want %v", tt.name, got, tt.want)
		}
		if st, _, _ := getState(t, ctx, c, keys[0], org); st.A != tt.orgLevel || st.T != now {
			t.Fatalf("%s: org state %+v, want level %v at %d", tt.name, st, tt.orgLevel, now)
		}
	}

	// With 0 for the clock, the script reads TIME: the stored T is Redis's now.
	c.Del(ctx, keys...)
	argv = decideArgs(0, now, bucketArgs{limit: org, cost: 1}, bucketArgs{limit: user, cost: 1})
	if err := lua.Decide.Run(ctx, c, keys, argv...).Err(); err != nil {
		t.Fatal(err)
	}
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	st, _, _ := getState(t, ctx, c, keys[0], org)
	if d := tm.UnixMicro() - st.T; d < 0 || d > int64(5*time.Second/time.Microsecond) {
		t.Fatalf("state written at %d, Redis TIME is %d: the script did not use TIME", st.T, tm.UnixMicro())
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// TestDecideBatchLogOutlivesKey writes an exact sliding window's log in the
// first decision of a batch long enough to run for milliseconds, and
// requires the log to expire no earlier than its key: Redis 7.0 takes each
// command's expiry from the clock as the command runs, and the keys are
// set at the end of the script (the random batches above caught a log
// ending a millisecond before its key once).
func TestDecideBatchLogOutlivesKey(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	keys := []string{"{lua-logexp}:log", "{lua-logexp}:busy"}
	limits := []rate.Limit{
		{Algorithm: rate.Sliding, Count: 100, Period: time.Hour},
		{Algorithm: rate.GCRA, Count: 1e12, Period: time.Hour},
	}
	c.Del(ctx, keys[0], logKey(keys[0]), keys[1])
	now := time.Now().UnixMicro()
	skeys := scriptKeys(keys, limits) // the log, its log, the busy key
	// A charge ten minutes ago: the batch's first decision moves it to the log.
	if err := lua.Decide.Run(ctx, c, skeys[:2], decideArgs(now-600e6, now-600e6, bucketArgs{limit: limits[0], cost: 1})...).Err(); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	index := binary.LittleEndian.AppendUint16(nil, 1)
	argv := []any{nil}
	argv = append(argv, args(now, now, bucketArgs{limit: limits[0], cost: 1})...)
	sizes := []int{1}
	for range 3000 {
		index = binary.LittleEndian.AppendUint16(index, 3)
		argv = append(argv, args(now, now, bucketArgs{limit: limits[1], cost: 1})...)
		sizes = append(sizes, 1)
	}
	argv[0] = index
	start := time.Now()
	raw, err := lua.Decide.Run(ctx, c, skeys, argv...).Text()
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	t.Logf("a batch of %d decisions ran in %v", len(sizes), time.Since(start))
	got := decideReply(t, raw, now, sizes...)
	if got[0] != 1 {
		t.Fatalf("the log's decision was refused: %v", got[:6])
	}
	if n := c.LLen(ctx, logKey(keys[0])).Val(); n != 1 {
		t.Fatalf("the log has %d entries, want 1", n)
	}
	kt, lt := c.PExpireTime(ctx, keys[0]).Val(), c.PExpireTime(ctx, logKey(keys[0])).Val()
	if kt <= 0 || lt < kt {
		t.Fatalf("the log expires at %v, its key at %v: the log must outlive the key", lt, kt)
	}
}

// TestDecideBatchIsSequential sends random batches of decisions over a few
// shared keys as ONE lua.Decide call (KEYS each distinct key once, ARGV[1]
// the key index of every bucket) and requires the outcome of the decisions
// applied one after the other in Go at the same instant: every reply, each
// key's final state bit for bit (no key for a full bucket), and an expiry
// on every written key that covers its Limit.TTL.
func TestDecideBatchIsSequential(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	r, seed, n := randomRun(t, 13, 300, 50)
	const nkeys = 6
	shared, admitted, decisions := 0, 0, 0
	for i := 0; i < n; i++ {
		now := randomCase(r).now
		keys := make([]string, nkeys)
		limits := make([]rate.Limit, nkeys)
		state := make([]rate.State, nkeys) // the Go model of each key
		for k := range keys {
			tc := randomCase(r)
			keys[k] = fmt.Sprintf("{lua-batch-%d}:%d", seed, k)
			limits[k] = tc.limit
			// The random state, moved to this batch's instant.
			st := tc.state
			switch tc.limit.Algorithm {
			case rate.Sliding:
				st = shiftState(st, now-tc.now)
			case rate.SlidingApprox:
				p := tc.limit.Period.Microseconds()
				st.T = now - now%p - p*r.Int64N(2)
			case rate.Calendar:
				st.T, _ = tc.limit.Window(now)
			default:
				st.T += now - tc.now
			}
			switch {
			case tc.fresh:
				c.Del(ctx, keys[k], logKey(keys[k]))
				st = rate.State{}
			case r.IntN(2) == 0:
				setState(ctx, c, keys[k], tc.limit, st, 0, 0)
			default: // an expiry hint that a later write may keep
				px := 1000 + r.Int64N(100_000_000)
				setState(ctx, c, keys[k], tc.limit, st, float64(now+(px-1)*1000), px)
			}
			state[k] = st
		}

		// KEYS: each key once, an exact sliding window's log after it.
		skeys := scriptKeys(keys, limits)
		pos := make([]int, nkeys) // the index in skeys (from 1) of keys[k]
		for k, j := 0, 0; k < nkeys; k++ {
			for skeys[j] != keys[k] {
				j++
			}
			pos[k] = j + 1
		}

		// The batch: 1 to 12 decisions, each a path of 1 to 4 of the keys.
		var index []byte
		argv := []any{nil}
		type bucket struct {
			k    int
			cost int64
		}
		var batch [][]bucket
		var sizes []int
		for d := 1 + r.IntN(12); d > 0; d-- {
			var path []bucket
			var ba []bucketArgs
			for _, k := range r.Perm(nkeys)[:1+r.IntN(4)] {
				cost := r.Int64N(limits[k].Capacity()/3 + 2)
				path = append(path, bucket{k, cost})
				ba = append(ba, bucketArgs{limit: limits[k], cost: cost})
				index = binary.LittleEndian.AppendUint16(index, uint16(pos[k]))
			}
			batch = append(batch, path)
			sizes = append(sizes, len(path))
			argv = append(argv, args(now, now, ba...)...)
		}
		argv[0] = index
		raw, err := lua.Decide.Run(ctx, c, skeys, argv...).Text()
		if err != nil {
			t.Fatalf("batch %d: Decide: %v", i, err)
		}
		got := decideReply(t, raw, now, sizes...)

		// The same decisions, one after the other, in Go.
		var want []int64
		written := map[int]bool{}
		for _, path := range batch {
			decisions++
			next := make([]rate.State, len(path))
			kept := make([]bool, len(path))
			all := true
			for j, b := range path {
				var res rate.Result
				next[j], res = limits[b.k].Apply(state[b.k], now, b.cost)
				want = append(want, b2i(res.Allowed), b2i(res.Impossible), res.Remaining, res.Before, res.RetryAfter, res.Reset)
				all = all && res.Allowed
				kept[j] = res.Keep
			}
			if !all {
				for j, b := range path {
					if kept[j] { // an idempotency record's retry, counted all the same
						written[b.k] = true
						state[b.k] = next[j]
					}
				}
				continue
			}
			admitted++
			for j, b := range path {
				if written[b.k] {
					shared++
				}
				written[b.k] = true
				state[b.k] = next[j]
				if limits[b.k].TTL(next[j], now) <= 0 {
					state[b.k] = rate.State{} // a full bucket: the key is deleted
				}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("batch %d at %d of %v over %v:\nscript replied %v\nin order, Go   %v", i, now, batch, limits, got, want)
		}
		for k := range keys {
			if !written[k] {
				continue
			}
			ttl := limits[k].TTL(state[k], now)
			st, _, err := getState(t, ctx, c, keys[k], limits[k])
			if ttl <= 0 {
				if !errors.Is(err, redis.Nil) && !sameState(state[k], rate.State{}) {
					t.Fatalf("batch %d key %d: want no key for a full bucket, have %+v (%v)", i, k, st, err)
				}
				continue
			}
			if errors.Is(err, redis.Nil) && ttl < 2_000_000 {
				continue // a very short TTL may run out in real time before GET
			}
			if err != nil {
				t.Fatalf("batch %d key %d: GET: %v", i, k, err)
			}
			if !sameState(st, state[k]) {
				t.Fatalf("batch %d key %d (%+v):\nscript stored %+v\nin order, Go  %+v", i, k, limits[k], st, state[k])
			}
			pttl := c.PTTL(ctx, keys[k]).Val()
			if pttl <= 0 || pttl.Microseconds() < ttl-1_000_000 {
				t.Fatalf("batch %d key %d: PTTL %v does not cover a TTL of %d µs", i, k, pttl, ttl)
			}
		}
	}
	t.Logf("%d decisions, %d admitted, %d writes to a key an earlier decision of the batch wrote", decisions, admitted, shared)
	if shared == 0 {
		t.Fatal("no batch wrote one key twice: the test does not exercise shared keys")
	}
}

// TestLogStartsAfresh: an exact sliding window's log key left behind by an
// earlier life of its bucket (a key that expired a moment before its log,
// or that was deleted alone) is never read as the new log's entries: the
// new log starts anew, and the state stored is rate's.
func TestLogStartsAfresh(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	key := "{lua-afresh}:k"
	l := rate.Limit{Algorithm: rate.Sliding, Count: 10, Period: time.Minute}
	c.Del(ctx, key)
	c.RPush(ctx, logKey(key), "stale-0001", "stale-0002", "stale-0003")
	now := time.Date(2026, 3, 18, 10, 30, 0, 0, time.UTC).UnixMicro()
	var want rate.State
	for i, at := range []int64{now, now + 1000, now + 2000} {
		raw, err := lua.Decide.Run(ctx, c, scriptKeys([]string{key}, []rate.Limit{l}), decideArgs(at, at, bucketArgs{limit: l, cost: 2})...).Text()
		if err != nil {
			t.Fatal(err)
		}
		next, res := l.Apply(want, at, 2)
		got := decideReply(t, raw, at, 1)
		if fmt.Sprint(got) != fmt.Sprint([]int64{b2i(res.Allowed), b2i(res.Impossible), res.Remaining, res.Before, res.RetryAfter, res.Reset}) {
			t.Fatalf("decision %d: script replied %v, rate %+v", i, got, res)
		}
		want = next
	}
	st, _, err := getState(t, ctx, c, key, l)
	if err != nil || !sameState(st, want) {
		t.Fatalf("stored %+v (%v), want %+v", st, err, want)
	}
	if n := c.LLen(ctx, logKey(key)).Val(); n != 2 {
		t.Fatalf("log of %d entries, want the 2 older charges", n)
	}
}

// TestLogLostUnderItsKey: a log list evicted or deleted from under its
// bucket's key (the key says M entries, the list has fewer) is never read
// as if whole: the log is counted as its newest charge, which leaves the
// window last, so nothing is admitted early. 20 per 10 s: 1 at 0 s and 9
// at 1 s, the list lost, 1 at 2 s. At 10.5 s, with 10 in the window, a
// cost of 18 is refused (the list read as if whole would have let it in:
// its new entry taken for the oldest); once the lost charges' newest has
// left, at 11.5 s, 19 fit.
func TestLogLostUnderItsKey(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	key := "{lua-lost}:k"
	l := rate.Limit{Algorithm: rate.Sliding, Count: 20, Period: 10 * time.Second}
	c.Del(ctx, key, logKey(key))
	t0 := time.Date(2026, 3, 18, 10, 30, 0, 0, time.UTC).UnixMicro()
	decide := func(at, cost int64) []int64 {
		t.Helper()
		raw, err := lua.Decide.Run(ctx, c, scriptKeys([]string{key}, []rate.Limit{l}), decideArgs(at, at, bucketArgs{limit: l, cost: cost})...).Text()
		if err != nil {
			t.Fatal(err)
		}
		return decideReply(t, raw, at, 1)
	}
	decide(t0, 1)
	decide(t0+1_000_000, 9) // the log holds an entry, the key the newest
	c.Del(ctx, logKey(key))
	if got := decide(t0+2_000_000, 1); got[0] != 1 {
		t.Fatalf("after the list was lost: %v", got)
	}
	if got := decide(t0+10_500_000, 18); got[0] != 0 {
		t.Fatalf("at 10.5 s a cost of 18 was admitted: %v", got)
	}
	if got := decide(t0+11_500_000, 19); got[0] != 1 {
		t.Fatalf("at 11.5 s, only 2 s's 1 in the window, a cost of 19 was refused: %v", got)
	}
	st, _, err := getState(t, ctx, c, key, l)
	if err != nil || st.A != 20 || st.B != 19 || st.Log.Len() != 1 {
		t.Fatalf("at 11.5 s: %+v (%v), want 2 s's 1 and the 19", st, err)
	}
}

// TestDecideBatchWithoutMap: a batch that shares no key is sent without a
// key map (ARGV[1] empty): its buckets take KEYS in order, an exact sliding
// window two (its key, then its log key), across every decision of the
// call. Random mixed paths, each decision against rate.Limit.Apply.
func TestDecideBatchWithoutMap(t *testing.T) {
	c := client(t)
	ctx := context.Background()
	r, seed, n := randomRun(t, 17, 200, 40)
	for i := 0; i < n; i++ {
		now := randomCase(r).now
		var keys []string
		var limits []rate.Limit
		argv := []any{""}
		var want []int64
		var sizes []int
		for d := 1 + r.IntN(5); d > 0; d-- {
			var ba []bucketArgs
			for j := 1 + r.IntN(4); j > 0; j-- {
				tc := randomCase(r)
				key := fmt.Sprintf("{lua-nomap-%d}:%d:%d", seed, i, len(keys))
				c.Del(ctx, key, logKey(key))
				st := rate.State{}
				if !tc.fresh && tc.limit.Algorithm == rate.GCRA {
					st = tc.state
					setState(ctx, c, key, tc.limit, st, 0, 0)
				}
				keys, limits = append(keys, key), append(limits, tc.limit)
				ba = append(ba, bucketArgs{limit: tc.limit, cost: tc.cost})
				_, res := tc.limit.Apply(st, now, tc.cost)
				want = append(want, b2i(res.Allowed), b2i(res.Impossible), res.Remaining, res.Before, res.RetryAfter, res.Reset)
			}
			sizes = append(sizes, len(ba))
			argv = append(argv, args(now, now, ba...)...)
		}
		raw, err := lua.Decide.Run(ctx, c, scriptKeys(keys, limits), argv...).Text()
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		if got := decideReply(t, raw, now, sizes...); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("batch %d over %v:\nscript replied %v\nrate.Apply     %v", i, limits, got, want)
		}
	}
}
