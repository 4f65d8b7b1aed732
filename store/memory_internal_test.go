package store

import (
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/rate"
)

// TestMemoryHashCollisions: keys whose hashes collide keep separate state,
// and expire separately.
func TestMemoryHashCollisions(t *testing.T) {
	now := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC).UnixMicro()
	m := NewMemory(MemoryOptions{SweepInterval: -1, Clock: func() int64 { return now }})
	defer m.Close()
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Minute}
	short := rate.Limit{Algorithm: rate.GCRA, Count: 10, Period: time.Second}
	const h = 42 // one hash for three keys
	m.store(h, Bucket{Key: "a", Limit: lim}, rate.State{A: 3, T: now}, now)
	m.store(h, Bucket{Key: "b", Limit: lim}, rate.State{A: 7, T: now}, now)
	m.store(h, Bucket{Key: "c", Limit: short}, rate.State{A: 1, T: now}, now)
	if a, b := m.stateOf(h, "a", now), m.stateOf(h, "b", now); a.A != 3 || b.A != 7 {
		t.Fatalf("colliding keys share state: a=%v b=%v", a, b)
	}
	if s := m.stateOf(h, "d", now); s != (rate.State{}) {
		t.Fatalf("an absent key with a colliding hash read %v", s)
	}
	m.store(h, Bucket{Key: "a", Limit: lim}, rate.State{A: 4, T: now}, now)
	if m.Len() != 3 || m.stateOf(h, "a", now).A != 4 || m.stateOf(h, "b", now).A != 7 {
		t.Fatalf("update in a chain: len %d", m.Len())
	}
	now += 200_000 // c (0.1 s of state) has expired
	m.Sweep()
	if m.Len() != 2 || m.stateOf(h, "b", now).A != 7 {
		t.Fatalf("sweep of a chain: len %d", m.Len())
	}
}
