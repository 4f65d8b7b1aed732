package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

func TestMemoryResponsesConformance(t *testing.T) {
	storetest.RunResponses(t, func(t *testing.T, clock store.Clock) store.Store {
		m := store.NewMemory(store.MemoryOptions{Clock: clock, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return m
	})
}

// newReplay is a memory store whose responses may count maxBytes (0: the
// default), on a test clock, without a sweeper, closed when t ends.
func newReplay(t testing.TB, maxBytes int64) (*store.Memory, *storetest.Clock) {
	clock := storetest.NewClock(time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC))
	m := store.NewMemory(store.MemoryOptions{Clock: clock.Now, SweepInterval: -1, MaxReplayBytes: maxBytes})
	t.Cleanup(func() { m.Close() })
	return m, clock
}

// cost is what a response of n bytes under a key of two bytes counts.
func cost(n int) int64 { return 2 + int64(n) + store.ReplayEntryOverhead }

// mustKeep keeps n bytes of storetest.Blob under key for ttl and returns them.
func mustKeep(t *testing.T, m *store.Memory, key string, n int, ttl time.Duration) []byte {
	t.Helper()
	r := storetest.Blob(n)
	if err := m.KeepResponse(context.Background(), key, r, ttl); err != nil {
		t.Fatalf("KeepResponse(%s): %v", key, err)
	}
	return r
}

func mustRead(t *testing.T, m *store.Memory, key string) []byte {
	t.Helper()
	got, _, err := m.Response(context.Background(), key)
	if err != nil {
		t.Fatalf("Response(%s): %v", key, err)
	}
	return got
}

// TestMemoryResponsesBudget: past MaxReplayBytes, the oldest whole
// responses are cut to exactly their first ResponseHead bytes before any
// response is dropped; stubs go, oldest first, only when stubs alone
// exceed the budget; a response larger than the budget is kept as a stub
// at once, and one whose stub does not fit is not kept.
func TestMemoryResponsesBudget(t *testing.T) {
	const head = store.ResponseHead
	type keep struct {
		key string
		n   int
	}
	for _, tc := range []struct {
		name      string
		budget    int64
		keeps     []keep
		want      map[string]int // the length each key reads back; -1: none
		evictions int64
	}{
		{"within the budget nothing is cut", 3 * cost(1000),
			[]keep{{"k0", 1000}, {"k1", 1000}, {"k2", 1000}},
			map[string]int{"k0": 1000, "k1": 1000, "k2": 1000}, 0},
		{"the oldest whole responses are cut, as many as needed", 3 * cost(1000),
			[]keep{{"k0", 1000}, {"k1", 1000}, {"k2", 1000}, {"k3", 1000}},
			map[string]int{"k0": head, "k1": head, "k2": 1000, "k3": 1000}, 2},
		{"a newer whole response is cut before an older stub is dropped", 2 * cost(300),
			[]keep{{"k0", 300}, {"k1", 300}, {"k2", 300}, {"k3", 300}},
			map[string]int{"k0": -1, "k1": head, "k2": head, "k3": 300}, 4},
		{"stubs are dropped oldest first", 2 * cost(300),
			[]keep{{"k0", 300}, {"k1", 300}, {"k2", 300}, {"k3", 300}, {"k4", 300}},
			map[string]int{"k0": -1, "k1": -1, "k2": head, "k3": head, "k4": 300}, 6},
		{"short responses are stubs already: the oldest is dropped", 3 * cost(10),
			[]keep{{"k0", 10}, {"k1", 10}, {"k2", 10}, {"k3", 10}},
			map[string]int{"k0": -1, "k1": 10, "k2": 10, "k3": 10}, 1},
		{"a response larger than the budget is kept as a stub at once", 1000,
			[]keep{{"k0", 5000}},
			map[string]int{"k0": head}, 1},
		{"a response larger than the budget cuts, then drops, what its stub needs", cost(100) + cost(head),
			[]keep{{"k0", 100}, {"k1", head}, {"k2", 5000}},
			map[string]int{"k0": -1, "k1": head, "k2": head}, 3},
		{"a replaced response counts once", 2 * cost(1000),
			[]keep{{"k0", 1000}, {"k1", 1000}, {"k0", 1000}, {"k0", 1000}},
			map[string]int{"k0": 1000, "k1": 1000}, 0},
		{"a replacement is the newest: the other is cut first", 2 * cost(1000),
			[]keep{{"k0", 1000}, {"k1", 1000}, {"k0", 1000}, {"k2", 500}},
			map[string]int{"k0": 1000, "k1": head, "k2": 500}, 1},
		{"a budget below one stub keeps nothing", cost(head) - 1,
			[]keep{{"k0", head}, {"k1", 5000}},
			map[string]int{"k0": -1, "k1": -1}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := newReplay(t, tc.budget)
			kept := map[string][]byte{}
			for _, k := range tc.keeps {
				kept[k.key] = mustKeep(t, m, k.key, k.n, time.Hour)
			}
			var held int64
			for key, n := range tc.want {
				got := mustRead(t, m, key)
				switch {
				case n < 0 && got != nil:
					t.Errorf("%s: %d bytes, want it dropped", key, len(got))
				case n < 0:
				case len(got) != n || string(got) != string(kept[key][:n]):
					t.Errorf("%s: %d bytes (nil %v), want the first %d of the %d kept", key, len(got), got == nil, n, len(kept[key]))
				default:
					held += cost(n)
				}
			}
			if got := m.ReplayBytes(); got != held || got > tc.budget {
				t.Errorf("ReplayBytes %d, want %d (budget %d)", got, held, tc.budget)
			}
			if got := m.ReplayEvictions(); got != tc.evictions {
				t.Errorf("ReplayEvictions %d, want %d", got, tc.evictions)
			}
		})
	}
}

// TestMemoryResponsesAccounting: ReplayBytes follows replacements, cuts,
// expiry (read, swept, or met while making room: never counted as an
// eviction) and a lower budget after Reconfigure.
func TestMemoryResponsesAccounting(t *testing.T) {
	ctx := context.Background()
	expectBytes := func(t *testing.T, m *store.Memory, want int64, evictions int64) {
		t.Helper()
		if got := m.ReplayBytes(); got != want {
			t.Fatalf("ReplayBytes %d, want %d", got, want)
		}
		if got := m.ReplayEvictions(); got != evictions {
			t.Fatalf("ReplayEvictions %d, want %d", got, evictions)
		}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, m *store.Memory, clock *storetest.Clock)
	}{
		{"replace", func(t *testing.T, m *store.Memory, _ *storetest.Clock) {
			mustKeep(t, m, "k0", 1000, time.Hour)
			expectBytes(t, m, cost(1000), 0)
			mustKeep(t, m, "k0", 10, time.Hour)
			expectBytes(t, m, cost(10), 0)
			mustKeep(t, m, "k0", 0, time.Hour)
			expectBytes(t, m, cost(0), 0)
		}},
		{"expiry on the injected clock, found by a read", func(t *testing.T, m *store.Memory, clock *storetest.Clock) {
			r := mustKeep(t, m, "k0", 100, time.Minute)
			clock.Advance(time.Minute - time.Microsecond)
			if got := mustRead(t, m, "k0"); string(got) != string(r) {
				t.Fatalf("a moment before its ttl: %d bytes, want the %d kept", len(got), len(r))
			}
			expectBytes(t, m, cost(100), 0)
			clock.Advance(time.Microsecond)
			if got := mustRead(t, m, "k0"); got != nil {
				t.Fatalf("at its ttl: %d bytes, want none", len(got))
			}
			expectBytes(t, m, 0, 0)
		}},
		{"expiry found by Sweep", func(t *testing.T, m *store.Memory, clock *storetest.Clock) {
			mustKeep(t, m, "k0", 100, time.Minute)
			mustKeep(t, m, "k1", 200, time.Hour)
			mustKeep(t, m, "k2", 300, 2*time.Minute)
			clock.Advance(2 * time.Minute)
			m.Sweep()
			expectBytes(t, m, cost(200), 0)
			clock.Advance(time.Hour)
			m.Sweep()
			expectBytes(t, m, 0, 0)
		}},
		{"expired responses make room before live ones are cut", func(t *testing.T, m *store.Memory, clock *storetest.Clock) {
			m.Reconfigure(store.MemoryOptions{MaxReplayBytes: 2 * cost(300)})
			mustKeep(t, m, "k0", 300, time.Second)
			mustKeep(t, m, "k1", 300, time.Hour)
			clock.Advance(2 * time.Second)
			mustKeep(t, m, "k2", 300, time.Hour)
			expectBytes(t, m, 2*cost(300), 0)
		}},
		{"a lower budget is reached at the next keep", func(t *testing.T, m *store.Memory, _ *storetest.Clock) {
			for i := range 4 {
				mustKeep(t, m, fmt.Sprintf("k%d", i), 1000, time.Hour)
			}
			expectBytes(t, m, 4*cost(1000), 0)
			m.Reconfigure(store.MemoryOptions{MaxReplayBytes: 2 * cost(1000)})
			mustKeep(t, m, "k4", 1000, time.Hour)
			// All four older responses are cut: only then does k4 fit.
			expectBytes(t, m, 4*cost(store.ResponseHead)+cost(1000), 4)
		}},
		{"the buckets are never evicted for responses", func(t *testing.T, m *store.Memory, _ *storetest.Clock) {
			m.Reconfigure(store.MemoryOptions{MaxKeys: 1, MaxReplayBytes: 4 * cost(1000)})
			b := []store.Bucket{{Key: "{r}|k", Limit: storetest.GCRA(10, time.Hour), Cost: 1}}
			if _, err := m.Decide(ctx, b); err != nil {
				t.Fatal(err)
			}
			for i := range 100 {
				mustKeep(t, m, fmt.Sprintf("k%d", i%100), 1000, time.Hour)
			}
			if m.Len() != 1 || m.Evictions() != 0 {
				t.Fatalf("%d buckets, %d evicted: responses took the limits' room", m.Len(), m.Evictions())
			}
			if d, _ := m.Decide(ctx, b); d.Results[0].Remaining != 8 {
				t.Fatalf("remaining %d after two requests, want 8", d.Results[0].Remaining)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, clock := newReplay(t, 0)
			tc.run(t, m, clock)
		})
	}
}

// TestMemoryResponsesConcurrent keeps, replaces and reads responses from
// many goroutines under a budget that keeps cutting and dropping them (run
// it with -race): every read is a response kept, whole or its head; the
// budget holds throughout; everything is gone once swept past every ttl.
func TestMemoryResponsesConcurrent(t *testing.T) {
	const budget = 20_000
	m, clock := newReplay(t, budget)
	ctx := context.Background()
	// A response whose byte i is its first byte plus i: whole or cut,
	// what is read can be checked without knowing what was kept.
	response := func(n int) []byte {
		b := make([]byte, n)
		seed := byte(rand.Uint32())
		for i := range b {
			b[i] = seed + byte(i)
		}
		return b
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				key := fmt.Sprintf("k%d", rand.IntN(40))
				if i%3 == 0 {
					if err := m.KeepResponse(ctx, key, response(rand.IntN(2000)), time.Duration(1+rand.IntN(60))*time.Second); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				got, _, err := m.Response(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				for j := range got {
					if got[j] != got[0]+byte(j) {
						t.Errorf("goroutine %d: %s reads %d bytes, not a response kept (byte %d)", g, key, len(got), j)
						return
					}
				}
				if len(got) > 0 {
					got[0]++ // the caller's own copy
				}
				if i%50 == 0 {
					clock.Advance(time.Second)
					m.Sweep()
				}
				if n := m.ReplayBytes(); n > budget {
					t.Errorf("ReplayBytes %d over the budget of %d", n, budget)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d bytes held, %d cut or dropped", m.ReplayBytes(), m.ReplayEvictions())
	clock.Advance(time.Minute)
	m.Sweep()
	if n := m.ReplayBytes(); n != 0 {
		t.Fatalf("ReplayBytes %d once every ttl has passed and the store was swept, want 0", n)
	}
}
