package adaptive

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketsCoverTheirValues(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	check := func(d time.Duration) {
		i := bucketOf(d)
		if i < 0 || i >= numBuckets {
			t.Fatalf("bucketOf(%v) = %d out of range", d, i)
		}
		lo, hi := bucketBounds(i)
		ns := float64(max(d, 0))
		if i == numBuckets-1 {
			if ns < lo {
				t.Fatalf("%v in overflow bucket below its bound %v", d, lo)
			}
			return
		}
		if ns < lo || ns >= hi {
			t.Fatalf("bucketOf(%v) = %d with bounds [%v, %v)", d, i, lo, hi)
		}
		if i > 0 && (hi-lo)/lo > 1.0/subCount+1e-12 {
			t.Fatalf("bucket %d is %.1f%% wide", i, 100*(hi-lo)/lo)
		}
	}
	for _, d := range []time.Duration{-1, 0, 1, 1<<minExp - 1, 1 << minExp, 1<<minExp + 1, 500 * time.Millisecond, 2 * time.Second, 1<<maxExp - 1, 1 << maxExp, math.MaxInt64} {
		check(d)
	}
	for range 100_000 {
		check(time.Duration(math.Exp(r.Float64() * 27))) // 1ns … 530s
	}
	// Buckets are monotone: a longer latency never lands in an earlier bucket.
	prev := 0
	for d := time.Duration(1); d < 1<<40; d = d*9/8 + 1 {
		if b := bucketOf(d); b < prev {
			t.Fatalf("bucketOf(%v) = %d < %d", d, b, prev)
		} else {
			prev = b
		}
	}
}

func TestQuantileAccuracy(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	for _, tc := range []struct {
		name string
		gen  func() time.Duration
	}{
		{"uniform 1ms–1s", func() time.Duration { return time.Millisecond + time.Duration(r.Int64N(int64(time.Second))) }},
		{"lognormal around 200ms", func() time.Duration { return time.Duration(2e8 * math.Exp(0.8*r.NormFloat64())) }},
		{"bimodal 10ms / 3s", func() time.Duration {
			if r.Float64() < 0.02 {
				return 3 * time.Second
			}
			return 10 * time.Millisecond
		}},
	} {
		w := newWindow(30*time.Second, time.Second, 0)
		var all []time.Duration
		for range 20_000 {
			d := tc.gen()
			all = append(all, d)
			w.record(d, false)
		}
		slices.Sort(all)
		exact := all[int(math.Ceil(0.99*float64(len(all))))-1]
		st := w.stats(len(w.slots))
		if st.requests != uint64(len(all)) {
			t.Fatalf("%s: %d requests, want %d", tc.name, st.requests, len(all))
		}
		rel := math.Abs(float64(st.p99-exact)) / float64(exact)
		t.Logf("%s: p99 %v, exact %v (%.2f%% off)", tc.name, st.p99, exact, 100*rel)
		if rel > 0.05 {
			t.Errorf("%s: p99 %v, exact %v (%.1f%% off)", tc.name, st.p99, exact, 100*rel)
		}
	}
	var empty [numBuckets]uint64
	if quantile(&empty, 0, 0.99) != 0 {
		t.Error("p99 of nothing must be 0")
	}
}

func TestRecordCountsErrors(t *testing.T) {
	for _, tc := range []struct {
		status int
		failed bool
	}{
		{200, false}, {204, false}, {304, false}, {404, false}, {429, false}, {499, false},
		{500, true}, {502, true}, {503, true}, {504, true}, {599, true},
		{0, true}, // no response: an upstream timeout before any status
		{-1, true},
	} {
		h := newHarness(t, Config{MinRequests: 1}, Options{})
		h.c.Record(time.Millisecond, tc.status)
		s := h.step(0)
		if got := s.ErrorRate.Value == 100; got != tc.failed {
			t.Errorf("status %d: error rate %v%%, failed want %v", tc.status, s.ErrorRate.Value, tc.failed)
		}
	}
}

func TestWindowAdvance(t *testing.T) {
	for _, tc := range []struct {
		name          string
		span, tick    time.Duration
		wantSlots     int
		wantWidth     time.Duration
		samples       []time.Duration // offsets of successive samples from the first
		wantRotations []int           // total rotations after each sample
	}{
		{"one slot per tick", 10 * time.Second, time.Second, 11, time.Second,
			[]time.Duration{time.Second, 2 * time.Second, 3 * time.Second}, []int{1, 2, 3}},
		{"ticker jitter", 10 * time.Second, time.Second, 11, time.Second,
			[]time.Duration{1300 * time.Millisecond, 2200 * time.Millisecond, 3100 * time.Millisecond, 3900 * time.Millisecond, 4200 * time.Millisecond}, []int{1, 2, 3, 4, 4}},
		{"late tick skips slots", 10 * time.Second, time.Second, 11, time.Second,
			[]time.Duration{time.Second, 5 * time.Second}, []int{1, 5}},
		{"long window, wide slots", 10 * time.Minute, time.Second, 61, 10 * time.Second,
			[]time.Duration{time.Second, 9 * time.Second, 10 * time.Second, 20 * time.Second}, []int{0, 0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWindow(tc.span, tc.tick, 0)
			if len(w.slots) != tc.wantSlots || w.width != tc.wantWidth {
				t.Fatalf("%d slots of %v, want %d of %v", len(w.slots), w.width, tc.wantSlots, tc.wantWidth)
			}
			w.advance(epoch)
			for i, off := range tc.samples {
				w.advance(epoch.Add(off))
				if got := int(w.cur.Load()); got != tc.wantRotations[i]%len(w.slots) {
					t.Errorf("after sample at +%v: slot %d, want %d", off, got, tc.wantRotations[i]%len(w.slots))
				}
			}
		})
	}
	// A gap longer than the window clears everything.
	w := newWindow(5*time.Second, time.Second, 0)
	w.advance(epoch)
	for range 100 {
		w.record(time.Millisecond, true)
	}
	w.advance(epoch.Add(time.Hour))
	if st := w.stats(len(w.slots)); st.requests != 0 || st.errors != 0 {
		t.Errorf("after an hour: %+v, want empty", st)
	}
}

func TestHealthier(t *testing.T) {
	full := windowStats{requests: 1000, errors: 50, p99: 2 * time.Second}
	recent := windowStats{requests: 200, errors: 2, p99: 100 * time.Millisecond}
	got := healthier(full, recent)
	if got.p99 != 100*time.Millisecond || got.requests != 1000 || got.errors != 10 {
		t.Errorf("healthier = %+v, want p99 100ms, 10 errors of 1000 (the recent 1%%)", got)
	}
	got = healthier(recent, full)
	if got.errors != 2 || got.p99 != 100*time.Millisecond {
		t.Errorf("healthier(recent, full) = %+v, want the recent values", got)
	}
}
