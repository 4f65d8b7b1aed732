package logsample

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSampler(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	type event struct {
		key     string
		at      time.Duration
		log     bool
		summary Summary
	}
	tests := []struct {
		name    string
		maxKeys int
		events  []event
	}{
		{"first of each key per interval", 0, []event{
			{"a", 0, true, Summary{}},
			{"a", time.Second, false, Summary{}},
			{"b", 2 * time.Second, true, Summary{}},
			{"a", 3 * time.Second, false, Summary{}},
			{"b", 59 * time.Second, false, Summary{}},
			{"a", 61 * time.Second, true, Summary{Suppressed: 3, Keys: 2, Interval: 61 * time.Second}},
			{"a", 62 * time.Second, false, Summary{}},
		}},
		{"nothing held back, nothing to report", 0, []event{
			{"a", 0, true, Summary{}},
			{"a", 2 * time.Minute, true, Summary{}},
		}},
		{"bounded keys", 2, []event{
			{"a", 0, true, Summary{}},
			{"b", 0, true, Summary{}},
			{"c", 0, false, Summary{}},
			{"d", time.Minute, true, Summary{Suppressed: 1, Keys: 1, Interval: time.Minute}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New(time.Minute, tt.maxKeys)
			for i, e := range tt.events {
				log, sum := s.Allow(e.key, t0.Add(e.at))
				if log != e.log || sum != e.summary {
					t.Fatalf("event %d (%s at %v): %v %+v, want %v %+v", i, e.key, e.at, log, sum, e.log, e.summary)
				}
			}
		})
	}
}

func TestConcurrent(t *testing.T) {
	s := New(time.Hour, 0)
	now := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	logged := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				if ok, _ := s.Allow(fmt.Sprint(i), now); ok {
					mu.Lock()
					logged++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if logged != 100 {
		t.Fatalf("logged %d, want each of 100 keys once", logged)
	}
}

func BenchmarkAllowSeen(b *testing.B) {
	s := New(time.Hour, 0)
	now := time.Now()
	s.Allow("k", now)
	for i := 0; i < b.N; i++ {
		s.Allow("k", now)
	}
}

// TestEvery: one event per interval is let through, with the count of
// those held back since the last one.
func TestEvery(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	e := &Every{Interval: time.Second}
	for _, step := range []struct {
		at   time.Duration
		ok   bool
		held int64
	}{
		{0, true, 0},
		{100 * time.Millisecond, false, 0},
		{999 * time.Millisecond, false, 0},
		{time.Second, true, 2},
		{1500 * time.Millisecond, false, 0},
		{5 * time.Second, true, 1},
		{5 * time.Second, false, 0},
	} {
		ok, held := e.Allow(t0.Add(step.at))
		if ok != step.ok || held != step.held {
			t.Errorf("at %v: Allow = %v, %d; want %v, %d", step.at, ok, held, step.ok, step.held)
		}
	}
	var zero Every // a second
	if ok, _ := zero.Allow(t0); !ok {
		t.Error("the zero value held back the first event")
	}
	if ok, _ := zero.Allow(t0.Add(999 * time.Millisecond)); ok {
		t.Error("the zero value let two events through within a second")
	}
}

// TestEveryConcurrent: of many events at one instant, exactly one is let
// through, and the next one after the interval counts all the others.
func TestEveryConcurrent(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	var e Every
	var wg sync.WaitGroup
	var through atomic.Int64
	for range 100 {
		wg.Go(func() {
			if ok, _ := e.Allow(t0); ok {
				through.Add(1)
			}
		})
	}
	wg.Wait()
	if through.Load() != 1 {
		t.Fatalf("%d of 100 simultaneous events let through, want 1", through.Load())
	}
	if ok, held := e.Allow(t0.Add(time.Second)); !ok || held != 99 {
		t.Fatalf("a second later: %v, %d held; want true, 99", ok, held)
	}
}
