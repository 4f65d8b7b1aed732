package rate

import (
	"math/rand/v2"
	"testing"
	"time"
)

const sec = int64(time.Second / time.Microsecond)

func TestGCRA(t *testing.T) {
	l := Limit{Algorithm: GCRA, Count: 10, Period: time.Minute, Burst: 5}
	var s State
	now := int64(1_700_000_000) * sec
	for i := 0; i < 5; i++ {
		var r Result
		s, r = l.Apply(s, now, 1)
		if !r.Allowed || r.Remaining != int64(4-i) {
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	_, r := l.Apply(s, now, 1)
	if r.Allowed || r.RetryAfter != 6*sec+1 || r.Remaining != 0 {
		t.Fatalf("6th request: %+v, want a denial with retry 6s", r)
	}
	if r.Reset != 30*sec {
		t.Errorf("reset = %d, want 30 s (5 units at 6 s each)", r.Reset)
	}
	// after the retry time, one fits
	s2, r := l.Apply(s, now+6*sec+1, 1)
	if !r.Allowed {
		t.Fatalf("retry refused: %+v", r)
	}
	if ttl := l.TTL(s2, now+6*sec+1); ttl < 30*sec-1 || ttl > 30*sec {
		t.Errorf("TTL = %d, want 30 s (to the µs)", ttl)
	}
	if _, r := l.Apply(State{}, now, 6); !r.Impossible || r.Allowed || r.RetryAfter != 0 {
		t.Errorf("cost 6 over burst 5: %+v, want impossible", r)
	}
}

func TestGCRAFractionalIntervalIsExact(t *testing.T) {
	// 7 per minute: an emission interval of 8.571428… s that no float sums exactly.
	l := Limit{Algorithm: GCRA, Count: 7, Period: time.Minute, Burst: 700}
	var s State
	now := int64(1_790_000_000) * sec
	admitted := 0
	for i := 0; i < 1000; i++ {
		var r Result
		if s, r = l.Apply(s, now, 3); r.Allowed {
			admitted++
		}
	}
	if admitted != 233 {
		t.Fatalf("admitted %d, want floor(700/3) = 233", admitted)
	}
}

func TestAdjust(t *testing.T) {
	l := Limit{Algorithm: GCRA, Count: 100, Period: time.Second}
	now := int64(1_790_000_000) * sec
	s, _ := l.Apply(State{}, now, 80)
	s = l.Adjust(s, now, -50, 0) // refund
	if _, r := l.Apply(s, now, 70); !r.Allowed || r.Remaining != 0 {
		t.Errorf("after refund: %+v", r)
	}
	s = l.Adjust(State{}, now, -50, 0) // never above full
	if _, r := l.Apply(s, now, 101); !r.Impossible {
		t.Errorf("refund overfilled the bucket: %+v", r)
	}
	s = l.Adjust(State{}, now, 150, 0) // debt
	if _, r := l.Apply(s, now, 1); r.Allowed || r.RetryAfter != 510_001 {
		t.Errorf("debt: %+v, want retry 0.51 s", r)
	}
}

func TestCalendarWindows(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no tzdata")
	}
	tests := []struct {
		unit       Unit
		loc        *time.Location
		at         time.Time
		start, end time.Time
	}{
		{Hour, nil, time.Date(2026, 3, 18, 10, 30, 5, 0, time.UTC), time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC), time.Date(2026, 3, 18, 11, 0, 0, 0, time.UTC)},
		{Day, nil, time.Date(2026, 3, 18, 23, 59, 59, 0, time.UTC), time.Date(2026, 3, 18, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 19, 0, 0, 0, 0, time.UTC)},
		{Week, nil, time.Date(2026, 3, 22, 12, 0, 0, 0, time.UTC), time.Date(2026, 3, 16, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 23, 0, 0, 0, 0, time.UTC)},
		{Month, nil, time.Date(2026, 2, 28, 23, 0, 0, 0, time.UTC), time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
		{Month, paris, time.Date(2026, 1, 31, 23, 30, 0, 0, time.UTC), time.Date(2026, 1, 31, 23, 0, 0, 0, time.UTC), time.Date(2026, 2, 28, 23, 0, 0, 0, time.UTC)},
		// a day across the spring DST change in Paris is 23 hours long
		{Day, paris, time.Date(2026, 3, 29, 12, 0, 0, 0, time.UTC), time.Date(2026, 3, 28, 23, 0, 0, 0, time.UTC), time.Date(2026, 3, 29, 22, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		l := Limit{Algorithm: Calendar, Count: 1, Unit: tt.unit, Location: tt.loc}
		s, e := l.Window(tt.at.UnixMicro())
		if s != tt.start.UnixMicro() || e != tt.end.UnixMicro() {
			t.Errorf("%s at %v: window [%v, %v), want [%v, %v)", tt.unit, tt.at,
				time.UnixMicro(s).UTC(), time.UnixMicro(e).UTC(), tt.start, tt.end)
		}
	}
}

// TestFixedWindows: a Fixed window is floor(t/Period)·Period, whatever the
// location (envoyproxy/ratelimit's alignment), and a calendar hour or day
// in UTC is the Fixed window of that length: the same bounds at any instant.
func TestFixedWindows(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		paris = time.FixedZone("CET", 3600)
	}
	at := time.Date(2026, 3, 18, 10, 37, 5, 250_000_000, time.UTC)
	tests := []struct {
		period     time.Duration
		start, end time.Time
	}{
		{time.Second, time.Date(2026, 3, 18, 10, 37, 5, 0, time.UTC), time.Date(2026, 3, 18, 10, 37, 6, 0, time.UTC)},
		{time.Minute, time.Date(2026, 3, 18, 10, 37, 0, 0, time.UTC), time.Date(2026, 3, 18, 10, 38, 0, 0, time.UTC)},
		{10 * time.Minute, time.Date(2026, 3, 18, 10, 30, 0, 0, time.UTC), time.Date(2026, 3, 18, 10, 40, 0, 0, time.UTC)},
		// epoch-aligned weeks start on Thursdays, 30-day months anywhere
		{7 * 24 * time.Hour, time.Date(2026, 3, 12, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 19, 0, 0, 0, 0, time.UTC)},
		{30 * 24 * time.Hour, time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC), time.Date(2026, 4, 7, 0, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		for _, loc := range []*time.Location{nil, paris} {
			l := Limit{Algorithm: Calendar, Count: 1, Unit: Fixed, Period: tt.period, Location: loc}
			if err := l.Validate(); err != nil {
				t.Fatalf("%v: %v", tt.period, err)
			}
			s, e := l.Window(at.UnixMicro())
			if s != tt.start.UnixMicro() || e != tt.end.UnixMicro() {
				t.Errorf("fixed %v (%v): window [%v, %v), want [%v, %v)", tt.period, loc,
					time.UnixMicro(s).UTC(), time.UnixMicro(e).UTC(), tt.start, tt.end)
			}
		}
	}
	for _, unit := range []struct {
		u Unit
		p time.Duration
	}{{Hour, time.Hour}, {Day, 24 * time.Hour}} {
		cal := Limit{Algorithm: Calendar, Count: 1, Unit: unit.u}
		fixed := Limit{Algorithm: Calendar, Count: 1, Unit: Fixed, Period: unit.p}
		for ts := at.UnixMicro(); ts < at.AddDate(0, 0, 3).UnixMicro(); ts += 7*60*1e6 + 13 {
			s1, e1 := cal.Window(ts)
			s2, e2 := fixed.Window(ts)
			if s1 != s2 || e1 != e2 {
				t.Fatalf("%s at %v: calendar [%d, %d), fixed [%d, %d)", unit.u, time.UnixMicro(ts).UTC(), s1, e1, s2, e2)
			}
		}
		if cal.WindowSeconds() != fixed.WindowSeconds() {
			t.Errorf("%s: WindowSeconds %d, fixed %d", unit.u, cal.WindowSeconds(), fixed.WindowSeconds())
		}
	}
	if err := (Limit{Algorithm: Calendar, Count: 1, Unit: Fixed}).Validate(); err == nil {
		t.Error("a fixed window without a period validated")
	}
}

// TestSlidingApproxError measures the two-counter estimate against an exact
// log of admitted events. Its documented error: (1) the first window is
// exact; (2) in any trailing window the exact count never exceeds 2×Count
// (the worst case, all of the previous window's events at its very end);
// (3) under steady random traffic the admitted rate stays within 10% of
// Count per window.
func TestSlidingApproxError(t *testing.T) {
	const n = 100
	w := time.Minute
	l := Limit{Algorithm: SlidingApprox, Count: n, Period: w}
	p := w.Microseconds()
	base := int64(1_790_000_000) * sec
	base -= base % p

	// (1) and (2): adversarial burst at the end of a window.
	var s State
	var log []int64
	admit := func(now int64) bool {
		var r Result
		s, r = l.Apply(s, now, 1)
		if r.Allowed {
			log = append(log, now)
		}
		return r.Allowed
	}
	got := 0
	for i := 0; i < 2*n; i++ {
		if admit(base + p - 1000) {
			got++
		}
	}
	if got != n {
		t.Fatalf("first window admitted %d, want exactly %d", got, n)
	}
	for now := base + p; now < base+3*p; now += p / 100 {
		for admit(now) {
		}
		if c := trailing(log, now, p); c > 2*n {
			t.Fatalf("%d events in the window ending %d, above the 2N bound", c, now-base)
		}
	}

	// (3): steady random traffic at 3× the limit.
	s, log = State{}, nil
	rng := rand.New(rand.NewPCG(1, 2))
	now := base
	for now < base+50*p {
		now += int64(rng.ExpFloat64() * float64(p) / (3 * n))
		admit(now)
	}
	perWindow := float64(len(log)) / 50
	if perWindow < 0.9*n || perWindow > 1.1*n {
		t.Fatalf("steady traffic: %.1f admitted per window, want within 10%% of %d", perWindow, n)
	}
	worst := 0
	for _, at := range log {
		if c := trailing(log, at, p); c > worst {
			worst = c
		}
	}
	t.Logf("steady traffic: %.1f per window, worst trailing window %d (%.0f%% of N)", perWindow, worst, 100*float64(worst)/n)
	if worst > n*12/10 {
		t.Errorf("worst trailing window %d exceeds 1.2N under steady traffic", worst)
	}
}

func trailing(log []int64, now, p int64) int {
	c := 0
	for _, at := range log {
		if at > now-p && at <= now {
			c++
		}
	}
	return c
}

func TestParsePer(t *testing.T) {
	tests := []struct {
		in   string
		d    time.Duration
		unit Unit
		bad  bool
	}{
		{"s", time.Second, "", false}, {"min", time.Minute, "", false}, {"h", time.Hour, "", false},
		{"day", 24 * time.Hour, "", false}, {"week", 168 * time.Hour, "", false}, {"month", 0, Month, false},
		{"30m", 30 * time.Minute, "", false}, {"15s", 15 * time.Second, "", false}, {"2d", 48 * time.Hour, "", false},
		{"1h30m", 90 * time.Minute, "", false}, {"fortnight", 0, "", true}, {"-1s", 0, "", true}, {"0s", 0, "", true},
	}
	for _, tt := range tests {
		d, u, err := ParsePer(tt.in)
		if (err != nil) != tt.bad || d != tt.d || u != tt.unit {
			t.Errorf("ParsePer(%q) = %v, %q, %v", tt.in, d, u, err)
		}
	}
}

// FuzzApply checks invariants of every algorithm on arbitrary inputs: no
// panic, remaining never negative, a denial always has a retry time, and a
// request at the retry time is admitted.
func FuzzApply(f *testing.F) {
	f.Add(uint8(0), int64(10), int64(60), int64(0), int64(3), int64(5), int64(1000))
	f.Add(uint8(1), int64(4), int64(60), int64(0), int64(1), int64(9), int64(59_000_000))
	f.Add(uint8(2), int64(5), int64(0), int64(0), int64(2), int64(4), int64(3_600_000_000))
	f.Add(uint8(3), int64(4), int64(60), int64(0), int64(1), int64(9), int64(59_000_000))
	f.Add(uint8(1), int64(5000), int64(60), int64(0), int64(700), int64(30), int64(7_000_000))
	f.Fuzz(func(t *testing.T, alg uint8, count, periodS, burst, cost int64, reqs int64, gap int64) {
		if count <= 0 || count > 1e9 || periodS <= 0 || periodS > 1e6 || burst < 0 || burst > 1e9 || cost < 0 || cost > 1e9 || reqs < 0 || reqs > 50 || gap < 0 || gap > 1e12 {
			return
		}
		l := Limit{Count: count, Period: time.Duration(periodS) * time.Second}
		switch alg % 4 {
		case 0:
			l.Algorithm, l.Burst = GCRA, burst
		case 1:
			l.Algorithm = Sliding
		case 2:
			l.Algorithm, l.Unit, l.Period = Calendar, Day, 0
		case 3:
			l.Algorithm = SlidingApprox
		}
		var s State
		now := int64(1_790_000_000) * sec
		for i := int64(0); i < reqs; i++ {
			next, r := l.Apply(s, now, cost)
			if r.Remaining < 0 || r.Before < 0 {
				t.Fatalf("negative remaining %+v", r)
			}
			switch {
			case r.Allowed:
				s = next
			case r.Impossible:
				if cost <= l.Capacity() {
					t.Fatalf("cost %d ≤ capacity %d called impossible", cost, l.Capacity())
				}
			default:
				if r.RetryAfter <= 0 {
					t.Fatalf("denied without retry: %+v", r)
				}
				if _, r2 := l.Apply(s, now+r.RetryAfter, cost); !r2.Allowed {
					t.Fatalf("%s: retry at +%dµs refused: %+v then %+v", l.Algorithm, r.RetryAfter, r, r2)
				}
			}
			now += gap
		}
	})
}

// TestWindowHoldsItsInstant checks calendar windows minute by minute across
// the daylight-saving changes of several zones (New York's repeated 1 a.m.
// in November among them): every window holds the instant it was asked
// for, the next window starts where it ends, and an hour is an hour long.
func TestWindowHoldsItsInstant(t *testing.T) {
	var zones []*time.Location
	for _, name := range []string{"UTC", "America/New_York", "Europe/Paris", "Asia/Kolkata", "America/Santiago", "Australia/Sydney"} {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Skipf("time zone data: %v", err)
		}
		zones = append(zones, loc)
	}
	// The days of 2026's changes, in either hemisphere, give or take one.
	days := []time.Time{
		time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 4, 5, 0, 0, 0, 0, time.UTC), time.Date(2026, 9, 6, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 10, 4, 0, 0, 0, 0, time.UTC), time.Date(2026, 10, 25, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
	}
	for _, loc := range zones {
		for _, unit := range []Unit{Hour, Day, Week, Month} {
			l := Limit{Algorithm: Calendar, Count: 1, Unit: unit, Location: loc}
			for _, day := range days {
				for m := -24 * 60; m < 2*24*60; m++ {
					at := day.Add(time.Duration(m) * time.Minute).UnixMicro()
					start, end := l.Window(at)
					if !(start <= at && at < end) {
						t.Fatalf("%s %s: the window of %s is [%s, %s)", loc, unit, time.UnixMicro(at).In(loc),
							time.UnixMicro(start).In(loc), time.UnixMicro(end).In(loc))
					}
					if next, _ := l.Window(end); next != end {
						t.Fatalf("%s %s: the window after [%s, %s) starts at %s", loc, unit, time.UnixMicro(start).In(loc),
							time.UnixMicro(end).In(loc), time.UnixMicro(next).In(loc))
					}
					if unit == Hour && end-start != int64(time.Hour/time.Microsecond) {
						t.Fatalf("%s: an hour window [%s, %s)", loc, time.UnixMicro(start).In(loc), time.UnixMicro(end).In(loc))
					}
				}
			}
		}
	}
}

// TestWindowSeconds: the advertised q/w is the sustained rate of every
// limit, and q its burst.
func TestWindowSeconds(t *testing.T) {
	tests := []struct {
		name string
		l    Limit
		q, w int64
	}{
		{"gcra without burst", Limit{Algorithm: GCRA, Count: 10, Period: time.Minute}, 10, 60},
		{"gcra, burst = count", Limit{Algorithm: GCRA, Count: 10, Period: time.Minute, Burst: 10}, 10, 60},
		{"gcra, burst above count", Limit{Algorithm: GCRA, Count: 10, Period: time.Minute, Burst: 100}, 100, 600},
		{"gcra, burst below count (seed 004)", Limit{Algorithm: GCRA, Count: 30, Period: time.Minute, Burst: 15}, 15, 30},
		{"gcra, window rounded up", Limit{Algorithm: GCRA, Count: 3, Period: time.Second, Burst: 1}, 1, 1},
		{"sliding ignores burst", Limit{Algorithm: Sliding, Count: 100, Period: 30 * time.Minute, Burst: 7}, 100, 1800},
		{"calendar month", Limit{Algorithm: Calendar, Count: 100000, Unit: Month}, 100000, 30 * 86400},
		{"calendar day", Limit{Algorithm: Calendar, Count: 5, Unit: Day}, 5, 86400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if q, w := tt.l.Capacity(), tt.l.WindowSeconds(); q != tt.q || w != tt.w {
				t.Errorf("q=%d;w=%d, want q=%d;w=%d", q, w, tt.q, tt.w)
			}
		})
	}
}

func TestConcurrent(t *testing.T) {
	l := Limit{Algorithm: Concurrent, Count: 3}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	now := int64(1_700_000_000) * sec
	var s State
	steps := []struct {
		name        string
		cost, delta int64 // one of them: a request's slots, or a give-back
		allowed     bool
		remaining   int64
	}{
		{"first", 1, 0, true, 2},
		{"second", 1, 0, true, 1},
		{"third", 1, 0, true, 0},
		{"fourth refused", 1, 0, false, 0},
		{"one given back", 0, -1, false, 0},
		{"fits again", 1, 0, true, 0},
		{"a debt changes nothing", 0, 5, false, 0},
		{"still full", 1, 0, false, 0},
		{"all given back, and more", 0, -9, false, 0},
		{"empty", 1, 0, true, 2},
	}
	for _, st := range steps {
		if st.delta != 0 {
			s = l.Adjust(s, now, st.delta, 0)
			continue
		}
		next, r := l.Apply(s, now, st.cost)
		if r.Allowed != st.allowed || r.Remaining != st.remaining {
			t.Fatalf("%s: %+v, want allowed %v remaining %d", st.name, r, st.allowed, st.remaining)
		}
		if r.Allowed {
			s = next
		} else if r.RetryAfter != ConcurrentRetry || r.Reset != 0 {
			t.Fatalf("%s: retry %d reset %d, want %d and 0", st.name, r.RetryAfter, r.Reset, ConcurrentRetry)
		}
		// Time does not free a slot.
		if _, later := l.Apply(s, now+365*24*3600*sec, 0); later.Remaining != r.Remaining {
			t.Fatalf("%s: a year later %d remain, want %d", st.name, later.Remaining, r.Remaining)
		}
	}
	// A slot taken before the counter started afresh (a reset) is not
	// given back to the new one.
	fresh, _ := l.Apply(State{}, now+5, 1)
	if got := l.Adjust(fresh, now+6, -1, now+4); got.A != 1 {
		t.Errorf("a slot of an earlier counter given back: %v slots, want 1", got.A)
	}
	if got := l.Adjust(fresh, now+6, -1, now+5); got.A != 0 {
		t.Errorf("the counter's own slot given back: %v slots, want 0", got.A)
	}
	if ttl := l.TTL(State{A: 1}, now); ttl < 50*365*24*3600*sec {
		t.Errorf("a slot taken lasts %d µs, want for ever", ttl)
	}
	if ttl := l.TTL(State{}, now); ttl != 0 {
		t.Errorf("no slot taken lasts %d µs, want 0", ttl)
	}
	if _, r := l.Apply(State{}, now, 4); !r.Impossible {
		t.Errorf("4 slots of 3: %+v, want impossible", r)
	}
	for _, bad := range []Limit{{Algorithm: Concurrent, Count: 0}, {Algorithm: Concurrent, Count: 3, Period: time.Second}, {Algorithm: Concurrent, Count: 3, Burst: 5}} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
	if l.Leasable() || l.WindowSeconds() != 0 {
		t.Error("a concurrency limit is leasable or has a window")
	}
}
