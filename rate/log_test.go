package rate

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"
)

// charge is one admitted charge of the brute-force model: its real time
// and cost.
type charge struct{ at, cost int64 }

// inWindow is the brute-force count: the cost of the charges in (now − p, now].
func inWindow(log []charge, now, p int64) int64 {
	sum := int64(0)
	for _, c := range log {
		if c.at > now-p && c.at <= now {
			sum += c.cost
		}
	}
	return sum
}

// bruteRetry is the brute-force earliest wait after which cost n fits,
// against the charges already logged: the first instant, scanning the
// times at which a charge leaves the window, when the window holds at most
// count − n.
func bruteRetry(log []charge, now, p, count, n int64) int64 {
	for _, c := range log {
		if at := c.at + p; at > now && inWindow(log, at, p)+n <= count {
			return at - now
		}
	}
	return -1
}

// entries lists a state's log as (tick time, cost), oldest first.
func entries(s State) []entry {
	if s.B == 0 {
		return nil
	}
	var es []entry
	if s.Log != nil {
		t := s.Log.H
		for off := 0; off < len(s.Log.buf); off += entrySize {
			gap, cost := entryAt(s.Log.buf, off)
			es = append(es, entry{t, cost})
			t += gap
		}
	}
	return append(es, entry{s.T, int64(s.B)})
}

// TestSlidingLogIsExact drives exact sliding windows with random traffic
// (bursts in one µs, costs above 1, gaps around the limit's rate) and
// checks every decision against a brute-force log of the admitted charges:
// the same verdict, remaining, reset and Retry-After; a retry at
// Retry-After admitted and one µs earlier refused; no trailing window ever
// above Count; and a log never longer than Count entries.
func TestSlidingLogIsExact(t *testing.T) {
	limits := []struct {
		count  int64
		period time.Duration
		cost   int64 // the largest cost drawn
	}{
		{1, time.Second, 1},
		{2, 5 * time.Second, 1},
		{5, time.Minute, 3},
		{100, 30 * time.Minute, 7},
		{MaxExact, time.Minute, 40},
	}
	for _, tl := range limits {
		l := Limit{Algorithm: Sliding, Count: tl.count, Period: tl.period}
		if l.Tick() != 1 {
			t.Fatalf("%d/%v: tick %d, want 1 µs", tl.count, tl.period, l.Tick())
		}
		p := tl.period.Microseconds()
		rng := rand.New(rand.NewPCG(uint64(tl.count), uint64(p)))
		var s State
		var log []charge
		now := int64(1_790_000_000)*sec + rng.Int64N(p)
		for i := 0; i < 4000; i++ {
			switch rng.IntN(10) {
			case 0: // same µs
			case 1:
				now += p // a whole window
			default:
				now += 1 + int64(rng.ExpFloat64()*float64(p)/float64(tl.count)*float64(tl.cost)/2)
			}
			n := int64(1)
			if tl.cost > 1 {
				n = rng.Int64N(tl.cost + 1)
			}
			used := inWindow(log, now, p)
			next, r := l.Apply(s, now, n)
			if want := used+n <= tl.count; r.Allowed != want {
				t.Fatalf("%d/%v #%d: cost %d with %d in the window: allowed %v, want %v", tl.count, tl.period, i, n, used, r.Allowed, want)
			}
			if r.Before != tl.count-used {
				t.Fatalf("%d/%v #%d: before %d, want %d", tl.count, tl.period, i, r.Before, tl.count-used)
			}
			if !r.Allowed {
				want := bruteRetry(log, now, p, tl.count, n)
				if r.RetryAfter != want || r.Remaining != tl.count-used {
					t.Fatalf("%d/%v #%d: retry %d remaining %d, want %d and %d", tl.count, tl.period, i, r.RetryAfter, r.Remaining, want, tl.count-used)
				}
				if _, r2 := l.Apply(s, now+r.RetryAfter, n); !r2.Allowed {
					t.Fatalf("%d/%v #%d: refused at Retry-After: %+v", tl.count, tl.period, i, r2)
				}
				if _, r2 := l.Apply(s, now+r.RetryAfter-1, n); r2.Allowed {
					t.Fatalf("%d/%v #%d: admitted 1 µs before Retry-After", tl.count, tl.period, i)
				}
				continue
			}
			if n > 0 {
				log = append(log, charge{now, n})
			}
			s = next
			if got := inWindow(log, now, p); got > tl.count {
				t.Fatalf("%d/%v #%d: %d in the window", tl.count, tl.period, i, got)
			}
			if r.Remaining != tl.count-used-n {
				t.Fatalf("%d/%v #%d: remaining %d, want %d", tl.count, tl.period, i, r.Remaining, tl.count-used-n)
			}
			newest := int64(0)
			for _, c := range log {
				if c.at > now-p {
					newest = c.at
				}
			}
			if wantReset := max(0, newest+p-now); newest != 0 && r.Reset != wantReset {
				t.Fatalf("%d/%v #%d: reset %d, want %d", tl.count, tl.period, i, r.Reset, wantReset)
			}
			if k := len(entries(s)); int64(k) > tl.count {
				t.Fatalf("%d/%v #%d: %d entries for a count of %d", tl.count, tl.period, i, k, tl.count)
			}
			if ttl := l.TTL(s, now); s.B > 0 && ttl != r.Reset {
				t.Fatalf("%d/%v #%d: TTL %d, reset %d", tl.count, tl.period, i, ttl, r.Reset)
			}
		}
	}
}

// TestSlidingLogCoarse checks a window above MaxExact: its tick is
// Period/MaxExact, it never admits more than Count in any window of real
// time, it admits no more than an exact log would, its log stays within
// MaxExact + 1 entries, and a retry at Retry-After is admitted.
func TestSlidingLogCoarse(t *testing.T) {
	l := Limit{Algorithm: Sliding, Count: 50 * MaxExact, Period: time.Minute}
	p := l.Period.Microseconds()
	if g := l.Tick(); g != p/MaxExact {
		t.Fatalf("tick %d, want %d", g, p/MaxExact)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var s State
	var log []charge
	now := int64(1_790_000_000)*sec + 17
	admitted, exactWouldAdmit := 0, 0
	used := int64(0) // the cost of log, the admitted charges in the window
	for i := 0; i < 200_000; i++ {
		now += int64(rng.ExpFloat64() * float64(p) / float64(l.Count) / 1.2)
		n := 1 + rng.Int64N(3)
		for len(log) > 0 && log[0].at <= now-p {
			used -= log[0].cost
			log = log[1:]
		}
		if used+n <= l.Count {
			exactWouldAdmit++
		}
		next, r := l.Apply(s, now, n)
		if !r.Allowed {
			if _, r2 := l.Apply(s, now+r.RetryAfter, n); !r2.Allowed {
				t.Fatalf("#%d: refused at Retry-After", i)
			}
			continue
		}
		if used+n > l.Count {
			t.Fatalf("#%d: admitted %d with %d in the window of %d", i, n, used, l.Count)
		}
		admitted++
		s = next
		log = append(log, charge{now, n})
		used += n
		if k := s.Log.Len() + 1; k > MaxExact+1 {
			t.Fatalf("#%d: %d entries, above MaxExact + 1", i, k)
		}
	}
	t.Logf("admitted %d where an exact log would have admitted %d of the same requests", admitted, exactWouldAdmit)
	if float64(admitted) < 0.97*float64(exactWouldAdmit) {
		t.Errorf("coarse window admitted %d, under 97%% of the exact %d", admitted, exactWouldAdmit)
	}
}

// TestSlidingLogRetryAfter: the worked example of the docs.
func TestSlidingLogRetryAfter(t *testing.T) {
	l := Limit{Algorithm: Sliding, Count: 3, Period: 2 * time.Second}
	t0 := int64(1_790_000_000) * sec
	var s State
	for _, at := range []int64{0, 500_000, 1_000_000} {
		var r Result
		if s, r = l.Apply(s, t0+at, 1); !r.Allowed {
			t.Fatalf("charge at +%dµs refused", at)
		}
	}
	_, r := l.Apply(s, t0+1_200_000, 1)
	if r.Allowed || r.RetryAfter != 800_000 || r.Remaining != 0 || r.Reset != 1_800_000 {
		t.Fatalf("4th request: %+v, want a denial with retry 0.8 s (the first charge leaves at +2 s), reset 1.8 s", r)
	}
	_, r = l.Apply(s, t0+1_200_000, 2)
	if r.Allowed || r.RetryAfter != 1_300_000 {
		t.Fatalf("cost 2: %+v, want retry 1.3 s (the second charge leaves at +2.5 s)", r)
	}
	_, r = l.Apply(s, t0+1_200_000, 4)
	if !r.Impossible || r.Allowed || r.RetryAfter != 0 {
		t.Fatalf("cost 4 of 3: %+v, want impossible", r)
	}
	// A retry never waits longer than the window for a cost that fits.
	_, r = l.Apply(s, t0+1_000_000, 3)
	if r.RetryAfter != 2_000_000 {
		t.Fatalf("cost 3 right after the third charge: retry %d, want the whole window", r.RetryAfter)
	}
}

// ringModel is mholt/caddy-ratelimit's ring buffer (v0.1.0), as a model:
// the times of the last maxEvents admitted events; an event is admitted
// when the oldest of them is more than window old.
type ringModel struct {
	ring   []int64
	cursor int
	window int64
}

func (m *ringModel) allow(now int64) bool {
	if now-m.ring[m.cursor] > m.window {
		m.ring[m.cursor] = now
		m.cursor = (m.cursor + 1) % len(m.ring)
		return true
	}
	return false
}

// TestSlidingLogMatchesMholt feeds the same random traffic (bursts,
// steady rates above and below the limit, pauses of a window) to an exact
// sliding window and to a model of mholt's ring buffer, and requires the
// same verdict for every request. Times are multiples of 7 µs and windows
// are not, so that no event is ever exactly one window old: at that
// instant mholt still counts it, and Cascade's (t − W, t] no longer does.
func TestSlidingLogMatchesMholt(t *testing.T) {
	for _, z := range []struct {
		events int64
		window time.Duration
	}{{2, 5 * time.Second}, {3, 2 * time.Second}, {1, time.Second}, {10, time.Minute}, {100, 10 * time.Second}} {
		l := Limit{Algorithm: Sliding, Count: z.events, Period: z.window + 3*time.Microsecond}
		m := &ringModel{ring: make([]int64, z.events), window: l.Period.Microseconds()}
		for i := range m.ring {
			m.ring[i] = -1 << 60
		}
		rng := rand.New(rand.NewPCG(uint64(z.events), 9))
		var s State
		now := int64(1_790_000_000) * sec
		p := float64(l.Period.Microseconds())
		for i := 0; i < 20_000; i++ {
			var gap float64
			switch phase := (i / 500) % 4; phase {
			case 0: // bursts
				if rng.IntN(8) == 0 {
					gap = rng.Float64() * p * 1.5
				}
			case 1: // just above the limit's rate
				gap = p / float64(z.events) * 0.9 * rng.Float64() * 2
			case 2: // just below it
				gap = p / float64(z.events) * 1.1
			case 3: // a window's pause now and then
				gap = p * float64(rng.IntN(2)) * (1 + rng.Float64()/10)
			}
			now += 7 * (1 + int64(gap/7))
			next, r := l.Apply(s, now, 1)
			if want := m.allow(now); r.Allowed != want {
				t.Fatalf("events %d window %v, request %d: Cascade allowed=%v, mholt %v", z.events, z.window, i, r.Allowed, want)
			}
			if r.Allowed {
				s = next
			}
		}
	}
}

// TestSlidingLogIssueScenarios replays the traffic of the bug report: a
// burst of 8 on `events 2 window 5s`, another 5.2 s later, then one request
// every 1.1 s; and 3 requests at the end of a 2 s window, then one every
// 0.1 s, which must admit no more than 3 in any 2 s.
func TestSlidingLogIssueScenarios(t *testing.T) {
	l := Limit{Algorithm: Sliding, Count: 2, Period: 5 * time.Second}
	t0 := int64(1_790_000_004_900_000) // 0.1 s before a 5 s boundary: the old estimate's worst case
	var s State
	burst := func(at int64) int {
		admitted := 0
		for i := 0; i < 8; i++ {
			next, r := l.Apply(s, at, 1)
			if r.Allowed {
				s, admitted = next, admitted+1
			}
		}
		return admitted
	}
	if got := burst(t0); got != 2 {
		t.Fatalf("first burst admitted %d, want 2", got)
	}
	if got := burst(t0 + 5_200_000); got != 2 {
		t.Fatalf("burst 5.2 s later admitted %d, want 2 (the window has passed)", got)
	}
	var pattern []bool
	for i := 1; i <= 8; i++ {
		next, r := l.Apply(s, t0+5_200_000+int64(i)*1_100_000, 1)
		if r.Allowed {
			s = next
		}
		pattern = append(pattern, r.Allowed)
	}
	// 6.3 … 9.6 s: the second burst's two are within 5 s; 10.9 s: one left.
	want := []bool{false, false, false, false, true, true, false, false}
	for i := range want {
		if pattern[i] != want[i] {
			t.Fatalf("one per 1.1 s after the second burst: %v, want %v", pattern, want)
		}
	}

	l = Limit{Algorithm: Sliding, Count: 3, Period: 2 * time.Second}
	s = State{}
	t0 = int64(1_790_000_001_900_000)
	var log []charge
	for i := 0; i < 22; i++ { // up to 1.9 s after the first
		at := t0 + int64(max(0, i-2))*100_000
		next, r := l.Apply(s, at, 1)
		if r.Allowed {
			s = next
			log = append(log, charge{at, 1})
		}
		if c := inWindow(log, at, l.Period.Microseconds()); c > 3 {
			t.Fatalf("request %d: %d admitted in the last 2 s, above 3", i, c)
		}
	}
	if len(log) != 3 {
		t.Fatalf("admitted %d in 2 s, want 3", len(log))
	}
	if _, r := l.Apply(s, t0+2_000_000, 1); !r.Allowed {
		t.Fatalf("2 s after the first three: %+v, want admitted", r)
	}
}

// TestSlidingLogAdjust: a refund comes off its own charge while that is in
// the window, a charge refunded to nothing leaves the log, a refund of a
// charge that has left the window or that the log never held changes
// nothing, and a debt is logged now, at most Count of it.
func TestSlidingLogAdjust(t *testing.T) {
	l := Limit{Algorithm: Sliding, Count: 10, Period: time.Minute}
	t1 := int64(1_790_000_000) * sec
	t2 := t1 + 20*sec
	s, _ := l.Apply(State{}, t1, 6)
	s, _ = l.Apply(s, t2, 3)
	now := t2 + sec

	s2 := l.Adjust(s, now, -5, l.ChargeWindow(t1))
	if _, r := l.Apply(s2, now, 6); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("after refunding 5 of the first charge: %+v, want 6 to fit exactly", r)
	}
	// The refunded capacity is the first charge's: it comes back for
	// good when that charge leaves, 40 s before the second does.
	if _, r := l.Apply(s2, t1+60*sec, 7); !r.Allowed {
		t.Fatalf("after the first charge left: %+v", r)
	}

	s3 := l.Adjust(s, now, -6, l.ChargeWindow(t1))
	if got := entries(s3); len(got) != 1 || got[0] != (entry{t2, 3}) || s3.A != 3 {
		t.Fatalf("refunded to nothing: entries %v (total %v), want only the second charge", got, s3.A)
	}
	if s4 := l.Adjust(s, now, -100, l.ChargeWindow(t2)); s4.A != 6 || len(entries(s4)) != 1 {
		t.Fatalf("over-refunding the newest charge: %+v %v, want the first charge alone", s4, entries(s4))
	}
	if s5 := l.Adjust(s, now, -5, l.ChargeWindow(t1+1)); s5.A != 9 {
		t.Fatalf("refund of a charge the log never held changed the total to %v", s5.A)
	}
	if s6 := l.Adjust(s, t1+60*sec, -5, l.ChargeWindow(t1)); s6.A != 3 {
		t.Fatalf("refund of a charge that left the window: total %v, want the second charge's 3", s6.A)
	}
	if s7 := l.Adjust(s, now, 0, 0); s7.A != 9 || len(entries(s7)) != 2 {
		t.Fatalf("a zero correction changed the log: %v", entries(s7))
	}

	debt := l.Adjust(s, now, 1000, 0)
	if got := entries(debt); len(got) != 3 || got[2] != (entry{now, 10}) {
		t.Fatalf("debt logged as %v, want Count (10) at now", got)
	}
	if _, r := l.Apply(debt, now+59*sec, 1); r.Allowed || r.RetryAfter != sec {
		t.Fatalf("while the debt is in the window: %+v, want retry 1 s", r)
	}
	if _, r := l.Apply(debt, now+60*sec, 10); !r.Allowed {
		t.Fatalf("once the debt left: %+v", r)
	}
	// A debt in the tick of the newest charge joins its entry.
	if got := entries(l.Adjust(s, t2, 2, 0)); len(got) != 2 || got[1] != (entry{t2, 5}) {
		t.Fatalf("debt in the newest tick: %v", got)
	}
	// An unknown charge time refunds from the tick of now.
	if got := entries(l.Adjust(s, t2, -2, 0)); len(got) != 2 || got[1] != (entry{t2, 1}) {
		t.Fatalf("refund of unknown time at the newest tick: %v", got)
	}
}

// TestSlidingLogApplyKeepsItsInput: computing several states from one s,
// as a store does when a decision is refused elsewhere, never changes what
// s holds.
func TestSlidingLogApplyKeepsItsInput(t *testing.T) {
	l := Limit{Algorithm: Sliding, Count: 100, Period: time.Minute}
	now := int64(1_790_000_000) * sec
	var s State
	for i := 0; i < 50; i++ {
		s, _ = l.Apply(s, now+int64(i)*sec/10, 1)
	}
	before, _ := s.Log.AppendBinary(nil)
	want := s
	for i := 0; i < 5; i++ {
		l.Apply(s, now+int64(60+i)*sec, 3) // drops entries, pushes the newest
		l.Apply(s, now+5*sec+int64(i), 2)
	}
	after, _ := s.Log.AppendBinary(nil)
	if !bytes.Equal(before, after) || s.A != want.A || s.B != want.B || s.T != want.T || s.Log != want.Log {
		t.Fatal("Apply changed the state it was given")
	}
}

// TestApplyTo: ApplyTo decides as Apply does, state for state, and keeps a
// new state's log in the Log it is given instead of a new one.
func TestApplyTo(t *testing.T) {
	l := Limit{Algorithm: Sliding, Count: 40, Period: time.Second}
	now := int64(1_790_000_000) * sec
	r := rand.New(rand.NewPCG(7, 7))
	var a, b State
	var dst Log
	for i := 0; i < 2000; i++ {
		now += r.Int64N(60_000)
		cost := r.Int64N(4)
		var ra, rb Result
		in := b.Log
		a, ra = l.Apply(a, now, cost)
		b, rb = l.ApplyTo(b, now, cost, &dst)
		ea, _ := a.Log.AppendBinary(nil)
		eb, _ := b.Log.AppendBinary(nil)
		if ra != rb || a.A != b.A || a.B != b.B || a.T != b.T || !bytes.Equal(ea, eb) {
			t.Fatalf("step %d: Apply %+v %+v, ApplyTo %+v %+v", i, a, ra, b, rb)
		}
		if b.Log != nil && b.Log != &dst && b.Log != in {
			t.Fatalf("step %d: a log neither the one given nor the input's", i)
		}
		// As a store does: the state's log copied into memory of its own.
		if b.Log != nil {
			c := append([]byte(nil), b.Log.Entries()...)
			view := LogView(b.Log.H, c)
			b.Log = &view
		}
	}
	s, _ := l.Apply(State{}, now, 1)
	s, _ = l.Apply(s, now+sec/2, 1) // a log of one entry
	// As the memory store gives it: in memory of its own, with room for
	// the next entry.
	view := LogView(s.Log.H, append(make([]byte, 0, len(s.Log.Entries())+entrySize), s.Log.Entries()...))
	s.Log = &view
	if n := testing.AllocsPerRun(100, func() { l.ApplyTo(s, now+sec/2+sec/4, 1, &dst) }); n != 0 {
		t.Errorf("ApplyTo of a charge in a new tick: %v allocations, want none", n)
	}
	if n := testing.AllocsPerRun(100, func() { l.Apply(s, now+sec/2+sec/4, 1) }); n != 1 {
		t.Errorf("Apply of a charge in a new tick: %v allocations, want the new log's", n)
	}
}

// TestSlidingLogClockBack: a clock that goes back logs at the newest
// entry's time, so entries stay in order and nothing leaves the window early.
func TestSlidingLogClockBack(t *testing.T) {
	l := Limit{Algorithm: Sliding, Count: 3, Period: time.Second}
	now := int64(1_790_000_000) * sec
	s, _ := l.Apply(State{}, now, 1)
	s, _ = l.Apply(s, now-500_000, 1)
	if got := entries(s); len(got) != 1 || got[0] != (entry{now, 2}) {
		t.Fatalf("entries %v, want both at the newest time", got)
	}
	s, _ = l.Apply(s, now+100, 1)
	if _, r := l.Apply(s, now+999_999, 1); r.Allowed || r.RetryAfter != 1 {
		t.Fatalf("%+v, want refused until the first two leave at +1 s", r)
	}
}

func TestSlidingLogTick(t *testing.T) {
	day := 24 * time.Hour
	for _, tt := range []struct {
		count  int64
		period time.Duration
		tick   int64
	}{
		{1, time.Second, 1},
		{MaxExact, 35 * time.Minute, 1},
		{MaxExact, time.Hour, 2},
		{100, day, 41},
		{MaxExact + 1, time.Minute, 60_000},
		{1_000_000, time.Hour, 3_600_000},
		{1_000_000, time.Millisecond, 1},
	} {
		l := Limit{Algorithm: Sliding, Count: tt.count, Period: tt.period}
		if g := l.Tick(); g != tt.tick {
			t.Errorf("%d per %v: tick %d µs, want %d", tt.count, tt.period, g, tt.tick)
		}
		if err := l.Validate(); err != nil {
			t.Errorf("%d per %v: %v", tt.count, tt.period, err)
		}
	}
	if err := (Limit{Algorithm: Sliding, Count: 1 << 32, Period: time.Hour}).Validate(); err == nil {
		t.Error("a sliding window of 2^32 per hour validated")
	}
}

func TestLogBinary(t *testing.T) {
	l := Limit{Algorithm: Sliding, Count: 100, Period: time.Minute}
	now := int64(1_790_000_000) * sec
	var s State
	for i := int64(0); i < 5; i++ {
		s, _ = l.Apply(s, now+i*1000, i+1)
	}
	b, _ := s.Log.AppendBinary(nil)
	if len(b) != 8+4*entrySize {
		t.Fatalf("%d bytes, want 8 + 4 entries", len(b))
	}
	g, err := ParseLog(b)
	if err != nil || g.H != s.Log.H || !bytes.Equal(g.buf, s.Log.buf) {
		t.Fatalf("round trip: %+v, %v", g, err)
	}
	for _, bad := range [][]byte{b[:8], b[:len(b)-1], b[:12]} {
		if _, err := ParseLog(bad); err == nil {
			t.Errorf("ParseLog accepted %d bytes", len(bad))
		}
	}
	if g, err := ParseLog(nil); g != nil || err != nil {
		t.Errorf("ParseLog(nil) = %v, %v", g, err)
	}
}

// TestSlidingLogScaledCount: the adaptive controller scales a limit's
// Count, on the same key and log. A lower Count refuses until the window
// holds less; the log carries over when the scale crosses MaxExact (a
// coarse tick before, a fine one after, or back), entries in time order
// and no window ever above the Count in force.
func TestSlidingLogScaledCount(t *testing.T) {
	full := Limit{Algorithm: Sliding, Count: 100, Period: time.Minute}
	scaled := full
	scaled.Count = 40
	now := int64(1_790_000_000) * sec
	var s State
	for i := int64(0); i < 60; i++ {
		s, _ = full.Apply(s, now+i*sec/10, 1)
	}
	if _, r := scaled.Apply(s, now+6*sec, 1); r.Allowed || r.Remaining != 0 {
		t.Fatalf("60 in the window, scaled to 40: %+v", r)
	}
	if _, r := full.Apply(s, now+6*sec, 40); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("back at 100: %+v", r)
	}

	coarse := Limit{Algorithm: Sliding, Count: 5 * MaxExact, Period: time.Minute}
	fine := coarse
	fine.Count = MaxExact / 2
	rng := rand.New(rand.NewPCG(5, 6))
	var log []charge
	s = State{}
	at := now
	for i := 0; i < 20_000; i++ {
		l := coarse
		if (i/2000)%2 == 1 {
			l = fine
		}
		at += 1 + rng.Int64N(2*l.Period.Microseconds()/l.Count)
		next, r := l.Apply(s, at, 1)
		if !r.Allowed {
			continue
		}
		s = next
		log = append(log, charge{at, 1})
		if got := inWindow(log, at, l.Period.Microseconds()); got > l.Count {
			t.Fatalf("#%d: %d in the window under a count of %d", i, got, l.Count)
		}
		es := entries(s)
		for k := 1; k < len(es); k++ {
			if es[k].t < es[k-1].t {
				t.Fatalf("#%d: entries out of order: %v", i, es[k-1:k+1])
			}
		}
	}
}

// TestApplyToMatchesApply: ApplyTo decides as Apply for every algorithm,
// coarse ticks, a clock going back and impossible costs, whether its Log
// is reused without copying (as the memory store reuses it) or nil.
func TestApplyToMatchesApply(t *testing.T) {
	limits := []Limit{
		{Algorithm: Sliding, Count: 40, Period: time.Second},
		{Algorithm: Sliding, Count: 3, Period: 50 * time.Microsecond},
		{Algorithm: Sliding, Count: 5000, Period: 3 * time.Millisecond},
		{Algorithm: Sliding, Count: 1000, Period: time.Hour},
		{Algorithm: SlidingApprox, Count: 10, Period: time.Millisecond},
		{Algorithm: GCRA, Count: 10, Period: time.Millisecond},
		{Algorithm: Calendar, Count: 100, Unit: Hour, Location: time.UTC},
		{Algorithm: Idempotent, Count: 100, Period: time.Millisecond, Burst: 2},
		{Algorithm: Concurrent, Count: 3},
	}
	for li, l := range limits {
		for _, reuse := range []bool{true, false} {
			r := rand.New(rand.NewPCG(uint64(li), 1))
			now := int64(1_790_000_000) * 1_000_000
			var a, b State
			var dst Log
			for i := 0; i < 5000; i++ {
				now += r.Int64N(200) - 20 // the clock sometimes goes back
				cost := r.Int64N(5)
				if r.IntN(30) == 0 {
					cost = l.Count + 1
				}
				var d *Log
				if reuse {
					d = &dst
				}
				a2, ra := l.Apply(a, now, cost)
				b2, rb := l.ApplyTo(b, now, cost, d)
				ea, _ := a2.Log.AppendBinary(nil)
				eb, _ := b2.Log.AppendBinary(nil)
				if ra != rb || a2.A != b2.A || a2.B != b2.B || a2.T != b2.T || (a2.Log == nil) != (b2.Log == nil) || !bytes.Equal(ea, eb) {
					t.Fatalf("limit %d reuse %v step %d: Apply %+v %+v, ApplyTo %+v %+v", li, reuse, i, a2, ra, b2, rb)
				}
				a, b = a2, b2
				if reuse && b.Log == &dst { // as the store: the log copied out before dst is written again
					c := LogView(b.Log.H, bytes.Clone(b.Log.Entries()))
					b.Log = &c
				}
			}
		}
	}
}
