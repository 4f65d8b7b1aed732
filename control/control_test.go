package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// clock is a settable clock for Options.Now.
type clock struct{ now atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.now.Store(time.Date(2026, 11, 24, 16, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.now.Load()).UTC() }
func (c *clock) Advance(d time.Duration) { c.now.Add(int64(d)) }

func open(t *testing.T, b Backend, opts Options) *Runtime {
	t.Helper()
	r, err := New(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func perHour(n int64) []*hierarchy.Limit { return []*hierarchy.Limit{{Count: n, Per: "h"}} }

// recorder is a subscriber that keeps every snapshot it is given.
type recorder struct {
	mu    sync.Mutex
	snaps []*Snapshot
}

func (rec *recorder) fn(s *Snapshot) {
	rec.mu.Lock()
	rec.snaps = append(rec.snaps, s)
	rec.mu.Unlock()
}

func (rec *recorder) count() int { rec.mu.Lock(); defer rec.mu.Unlock(); return len(rec.snaps) }

func (rec *recorder) last() *Snapshot {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.snaps[len(rec.snaps)-1]
}

// patience bounds a wait for something the Runtime does by itself (a
// poll, an expiry): polls every few milliseconds, or 250 ms by default,
// so that 10 s is a Runtime that does not do it, not a slow machine.
const patience = 10 * time.Second

// waitFor polls cond until it holds, or fails the test after patience. It
// returns how long that took.
func waitFor(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > patience {
			t.Fatalf("%s: not within %v", what, patience)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// polled is a Backend that counts the polls made on it (each poll asks
// for the version once).
type polled struct {
	Backend
	polls atomic.Int64
}

func (p *polled) Version(ctx context.Context) (int64, error) {
	p.polls.Add(1)
	return p.Backend.Version(ctx)
}

// waitPolls waits until n whole polls of b have run since it was called:
// what a poll does by the state as it is now has then been done.
func waitPolls(t *testing.T, b *polled, n int64) {
	t.Helper()
	// A poll expires overrides before it asks for the version: the first
	// to ask after the call may have expired them before it. Once the
	// n+2nd asked, the n polls between began and ended after the call.
	from := b.polls.Load()
	waitFor(t, fmt.Sprintf("%d whole polls", n), func() bool { return b.polls.Load() >= from+n+2 })
}

// backendCase makes backends that share one state: the memory backend, or
// Redis with a key prefix of the test's own (one client per backend, as
// separate instances have).
type backendCase struct {
	name string
	// shared returns a function making backends on one state.
	shared func(t *testing.T) func() Backend
}

func backendCases() []backendCase {
	return []backendCase{
		{"memory", func(t *testing.T) func() Backend {
			b := NewMemoryBackend()
			return func() Backend { return b }
		}},
		{"redis", func(t *testing.T) func() Backend {
			addr := redistest.Shared(t).Addr()
			prefix := testPrefix(t)
			return func() Backend { return NewRedisBackend(redisClient(t, addr), prefix) }
		}},
	}
}

// testPrefix is a key prefix of the test's own on a shared Redis.
func testPrefix(t *testing.T) string {
	return fmt.Sprintf("ctl-%s-%d:", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
}

// redisClient is a client of its own for the Redis at addr, made as the
// store makes its own (a call bounded by its context: a poll by the
// Runtime's I/O timeout), with timeouts a busy machine does not reach.
func redisClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		DialTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestChanges: set, replace and delete overrides and modes through one
// Runtime; each returns what it replaced, applies before it returns, and
// calls the subscriber once.
func TestChanges(t *testing.T) {
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			ctx := context.Background()
			c := newClock()
			r := open(t, bc.shared(t)(), Options{Poll: time.Hour, Now: c.Now})
			rec := &recorder{}
			r.Subscribe(rec.fn)
			if rec.count() != 1 || len(rec.last().Overrides()) != 0 {
				t.Fatalf("Subscribe: %d calls, want 1 with the current (empty) snapshot", rec.count())
			}

			steps := []struct {
				name   string
				do     func() (old any, err error)
				old    string // the old value's JSON, "null" for none
				notify bool
				check  func(s *Snapshot) error
			}{
				{"set", func() (any, error) {
					return r.SetOverride(ctx, &Override{Tree: "api", Tier: "org", Value: "acme", Limits: perHour(50000), Note: "deal closed"})
				}, "null", true, func(s *Snapshot) error {
					o := s.Override("api", "org", "acme")
					if o == nil || o.Limits[0].Count != 50000 || o.Note != "deal closed" || !o.Updated.Equal(c.Now()) {
						return fmt.Errorf("override %+v", o)
					}
					return nil
				}},
				{"replace", func() (any, error) {
					c.Advance(time.Minute)
					return r.SetOverride(ctx, &Override{Tree: "api", Tier: "org", Value: "acme", Unlimited: true})
				}, `{"tree":"api","tier":"org","value":"acme","limits":[{"count":50000,"per":"h"}],"note":"deal closed","updated":"2026-11-24T16:00:00Z"}`, true,
					func(s *Snapshot) error {
						if o := s.Override("api", "org", "acme"); o == nil || !o.Unlimited || len(o.Limits) != 0 {
							return fmt.Errorf("override %+v", o)
						}
						return nil
					}},
				{"second override", func() (any, error) {
					return r.SetOverride(ctx, &Override{Tree: "api", Tier: "org", Value: "beta", Limits: perHour(10)})
				}, "null", true, func(s *Snapshot) error {
					if n := len(s.Overrides()); n != 2 {
						return fmt.Errorf("%d overrides, want 2", n)
					}
					return nil
				}},
				{"mode", func() (any, error) { return r.SetMode(ctx, &Mode{Tree: "api", Mode: ModeShadow, Note: "migration"}) },
					"null", true, func(s *Snapshot) error {
						if m := s.Mode("api"); m == nil || m.Mode != ModeShadow || m.Note != "migration" || m.Updated.IsZero() {
							return fmt.Errorf("mode %+v", m)
						}
						return nil
					}},
				{"mode replaced", func() (any, error) { return r.SetMode(ctx, &Mode{Tree: "api", Mode: ModeWarn}) },
					`{"tree":"api","mode":"shadow","note":"migration","updated":"2026-11-24T16:01:00Z"}`, true,
					func(s *Snapshot) error {
						if m := s.Mode("api"); m == nil || m.Mode != ModeWarn {
							return fmt.Errorf("mode %+v", m)
						}
						return nil
					}},
				{"mode deleted", func() (any, error) { return r.DeleteMode(ctx, "api") },
					`{"tree":"api","mode":"warn","updated":"2026-11-24T16:01:00Z"}`, true,
					func(s *Snapshot) error {
						if m := s.Mode("api"); m != nil || len(s.Modes()) != 0 {
							return fmt.Errorf("mode %+v still there", m)
						}
						return nil
					}},
				{"mode deleted again", func() (any, error) { return r.DeleteMode(ctx, "api") }, "null", false, nil},
				{"delete", func() (any, error) { return r.DeleteOverride(ctx, "api", "org", "acme") },
					`{"tree":"api","tier":"org","value":"acme","unlimited":true,"updated":"2026-11-24T16:01:00Z"}`, true,
					func(s *Snapshot) error {
						if s.Override("api", "org", "acme") != nil || len(s.Overrides()) != 1 {
							return fmt.Errorf("overrides %v", s.Overrides())
						}
						return nil
					}},
				{"delete again", func() (any, error) { return r.DeleteOverride(ctx, "api", "org", "acme") }, "null", false, nil},
			}
			for _, st := range steps {
				before, version := rec.count(), r.Snapshot().Version()
				old, err := st.do()
				if err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
				if got, _ := json.Marshal(old); string(got) != st.old {
					t.Errorf("%s: old = %s, want %s", st.name, got, st.old)
				}
				want := before
				if st.notify {
					want++
				}
				if rec.count() != want {
					t.Errorf("%s: the subscriber was called %d times, want %d", st.name, rec.count()-before, want-before)
				}
				if st.check != nil {
					if err := st.check(r.Snapshot()); err != nil {
						t.Errorf("%s: snapshot: %v", st.name, err)
					}
					if err := st.check(rec.last()); err != nil {
						t.Errorf("%s: the subscriber's snapshot: %v", st.name, err)
					}
					if r.Snapshot().Version() <= version {
						t.Errorf("%s: version %d did not grow from %d", st.name, r.Snapshot().Version(), version)
					}
				}
			}
		})
	}
}

// TestSetOverrideCopies: SetOverride neither changes nor keeps the
// caller's override, and stamps Updated itself.
func TestSetOverrideCopies(t *testing.T) {
	c := newClock()
	r := open(t, NewMemoryBackend(), Options{Poll: time.Hour, Now: c.Now})
	given := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	o := &Override{Tree: "t", Tier: "u", Value: "v", Limits: perHour(5), Updated: given}
	if _, err := r.SetOverride(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if !o.Updated.Equal(given) {
		t.Error("SetOverride changed the caller's override")
	}
	o.Limits[0].Count = 99
	got := r.Snapshot().Override("t", "u", "v")
	if got.Limits[0].Count != 5 || !got.Updated.Equal(c.Now()) {
		t.Errorf("stored %+v (limit %d), want count 5 updated %v", got, got.Limits[0].Count, c.Now())
	}
}

func TestValidation(t *testing.T) {
	c := newClock()
	r := open(t, NewMemoryBackend(), Options{Poll: time.Hour, Now: c.Now})
	ctx := context.Background()
	ok := func(o Override) *Override { return &o }
	base := Override{Tree: "t", Tier: "user", Value: "x", Unlimited: true}
	for _, tt := range []struct {
		name string
		do   func() error
		says string
	}{
		{"no tree", func() error { o := base; o.Tree = ""; _, err := r.SetOverride(ctx, &o); return err }, "the tree is empty"},
		{"no tier", func() error { o := base; o.Tier = ""; _, err := r.SetOverride(ctx, &o); return err }, "the tier is empty"},
		{"NUL in tier", func() error { o := base; o.Tier = "a\x00b"; _, err := r.SetOverride(ctx, &o); return err }, "NUL"},
		{"long tree", func() error {
			o := base
			o.Tree = strings.Repeat("t", 2000)
			_, err := r.SetOverride(ctx, &o)
			return err
		}, "at most 1024"},
		{"nil", func() error { _, err := r.SetOverride(ctx, nil); return err }, "no override"},
		{"neither", func() error { o := base; o.Unlimited = false; _, err := r.SetOverride(ctx, &o); return err }, "needs limits"},
		{"both", func() error { o := base; o.Limits = perHour(1); _, err := r.SetOverride(ctx, &o); return err }, "not both"},
		{"null limit", func() error {
			_, err := r.SetOverride(ctx, ok(Override{Tree: "t", Tier: "u", Limits: []*hierarchy.Limit{nil}}))
			return err
		}, "limit 1 is null"},
		{"bad limit", func() error {
			_, err := r.SetOverride(ctx, ok(Override{Tree: "t", Tier: "u", Limits: []*hierarchy.Limit{{Count: 1, Per: "fortnight"}}}))
			return err
		}, "limit 1 (1/fortnight)"},
		{"zero count", func() error {
			_, err := r.SetOverride(ctx, ok(Override{Tree: "t", Tier: "u", Limits: []*hierarchy.Limit{{Count: 0, Per: "s"}}}))
			return err
		}, "limit 1"},
		{"past", func() error {
			o := base
			o.Expires = c.Now().Add(-time.Second)
			_, err := r.SetOverride(ctx, &o)
			return err
		},
			"expires 2026-11-24T15:59:59Z is in the past: give a future RFC 3339 time, or omit it"},
		{"now", func() error { o := base; o.Expires = c.Now(); _, err := r.SetOverride(ctx, &o); return err }, "in the past"},
		{"long note", func() error {
			o := base
			o.Note = strings.Repeat("n", 1025)
			_, err := r.SetOverride(ctx, &o)
			return err
		}, "the note is 1025 bytes long"},
		{"long value", func() error {
			o := base
			o.Value = strings.Repeat("v", 16<<10+1)
			_, err := r.SetOverride(ctx, &o)
			return err
		}, "the value is 16385 bytes long"},
		{"bad mode", func() error { _, err := r.SetMode(ctx, &Mode{Tree: "t", Mode: "loud"}); return err }, `mode "loud": use enforce, warn or shadow`},
		{"empty mode", func() error { _, err := r.SetMode(ctx, &Mode{Tree: "t"}); return err }, `mode ""`},
		{"mode without tree", func() error { _, err := r.SetMode(ctx, &Mode{Mode: ModeWarn}); return err }, "the tree is empty"},
		{"mode note", func() error {
			_, err := r.SetMode(ctx, &Mode{Tree: "t", Mode: ModeWarn, Note: strings.Repeat("n", 5000)})
			return err
		}, "note"},
		{"nil mode", func() error { _, err := r.SetMode(ctx, nil); return err }, "no mode"},
		{"delete without tier", func() error { _, err := r.DeleteOverride(ctx, "t", "", "x"); return err }, "the tier is empty"},
		{"delete mode without tree", func() error { _, err := r.DeleteMode(ctx, ""); return err }, "the tree is empty"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			var inv *InvalidError
			if !errors.As(err, &inv) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("error %v, want an *InvalidError saying %q", err, tt.says)
			}
		})
	}
	if s := r.Snapshot(); len(s.Overrides()) != 0 || len(s.Modes()) != 0 || s.Version() != 0 {
		t.Fatalf("an invalid change reached the store: version %d", s.Version())
	}
	// The bounds themselves are fine.
	o := base
	o.Value, o.Note, o.Expires = strings.Repeat("v", 16<<10), strings.Repeat("n", 1024), c.Now().Add(time.Second)
	if _, err := r.SetOverride(ctx, &o); err != nil {
		t.Fatalf("an override at the bounds: %v", err)
	}
}

// TestOverrideJSON: an override survives JSON with every limit field, and
// an unset expiry is left out.
func TestOverrideJSON(t *testing.T) {
	o := &Override{
		Tree: "llm", Tier: "team", Value: "a:b/ç",
		Limits: []*hierarchy.Limit{
			{Count: 100000, Per: "h", Dimension: "tokens", Burst: 5000, Algorithm: "gcra"},
			{Count: 1000000, Per: "month", Dimension: "tokens", Algorithm: "calendar", Timezone: "Europe/Paris"},
			{Count: 60, Per: "min", Algorithm: "sliding"},
		},
		Expires: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		Note:    "pilot",
		Updated: time.Date(2026, 11, 24, 16, 0, 0, 0, time.UTC),
	}
	raw, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"tree":"llm","tier":"team","value":"a:b/ç","limits":[` +
		`{"count":100000,"per":"h","dimension":"tokens","burst":5000,"algorithm":"gcra"},` +
		`{"count":1000000,"per":"month","dimension":"tokens","algorithm":"calendar","timezone":"Europe/Paris"},` +
		`{"count":60,"per":"min","algorithm":"sliding"}],` +
		`"expires":"2026-12-01T00:00:00Z","note":"pilot","updated":"2026-11-24T16:00:00Z"}`
	if string(raw) != want {
		t.Fatalf("JSON\n got %s\nwant %s", raw, want)
	}
	var back Override
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(&back)
	if string(again) != want {
		t.Fatalf("round trip\n got %s\nwant %s", again, want)
	}
	for i, l := range back.Limits {
		if err := l.Validate(); err != nil {
			t.Errorf("limit %d after the round trip: %v", i, err)
		}
	}
	if raw, _ := json.Marshal(&Override{Tree: "t", Tier: "u", Unlimited: true}); strings.Contains(string(raw), "expires") {
		t.Errorf("an override that never expires has an expiry: %s", raw)
	}
}

// TestValues: any bytes in a value, up to 16 KiB, name one override, in
// every backend and on another instance.
func TestValues(t *testing.T) {
	values := []string{
		"acme", "a:b", "a:b:c", "tenant/42", "{tag}", "é", "組織", "🚀",
		"with\x00nul", "with\x00", "\xff", "\xfe", "", " ",
		strings.Repeat("x", 10<<10), strings.Repeat("é", 8<<10),
	}
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			ctx := context.Background()
			backend := bc.shared(t)
			a := open(t, backend(), Options{Poll: 5 * time.Millisecond})
			for i, v := range values {
				if _, err := a.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: v, Limits: perHour(int64(i + 1))}); err != nil {
					t.Fatalf("value %q: %v", clip(v), err)
				}
			}
			b := open(t, backend(), Options{Poll: 5 * time.Millisecond}) // loads at start
			for _, r := range []*Runtime{a, b} {
				s := r.Snapshot()
				if len(s.Overrides()) != len(values) {
					t.Fatalf("%d overrides, want %d", len(s.Overrides()), len(values))
				}
				for i, v := range values {
					o := s.Override("t", "u", v)
					if o == nil || o.Value != v || o.Limits[0].Count != int64(i+1) {
						t.Errorf("value %q: %+v", clip(v), o)
					}
				}
				for i := 1; i < len(s.Overrides()); i++ {
					if s.Overrides()[i-1].Value >= s.Overrides()[i].Value {
						t.Errorf("overrides not sorted: %q before %q", clip(s.Overrides()[i-1].Value), clip(s.Overrides()[i].Value))
					}
				}
			}
			old, err := b.DeleteOverride(ctx, "t", "u", "\xff")
			if err != nil || old == nil || old.Value != "\xff" || old.Limits[0].Count != 11 {
				t.Fatalf("delete \\xff: %+v %v", old, err)
			}
			if a.Snapshot().Override("t", "u", "\xfe") == nil {
				t.Fatal("deleting \\xff deleted \\xfe")
			}
			waitFor(t, "the deletion reaches the other instance", func() bool {
				return a.Snapshot().Override("t", "u", "\xff") == nil
			})
		})
	}
}

// TestSubscribe: cancel stops the calls, may be called from the
// subscriber, and subscribers see snapshots in order under concurrent
// writes.
func TestSubscribe(t *testing.T) {
	ctx := context.Background()
	r := open(t, NewMemoryBackend(), Options{Poll: time.Hour})
	rec := &recorder{}
	cancel := r.Subscribe(rec.fn)
	var selfCancel func()
	var selfCalls atomic.Int32
	selfCancel = r.Subscribe(func(*Snapshot) {
		if selfCalls.Add(1) == 2 {
			selfCancel() // must not deadlock
		}
	})
	for i := range 3 {
		if _, err := r.SetMode(ctx, &Mode{Tree: fmt.Sprint(i), Mode: ModeWarn}); err != nil {
			t.Fatal(err)
		}
	}
	if rec.count() != 4 {
		t.Fatalf("%d calls, want 4 (the current snapshot and 3 changes)", rec.count())
	}
	if n := selfCalls.Load(); n != 2 {
		t.Fatalf("a subscriber that cancelled itself on its 2nd call was called %d times", n)
	}
	cancel()
	cancel()
	if _, err := r.SetMode(ctx, &Mode{Tree: "x", Mode: ModeWarn}); err != nil {
		t.Fatal(err)
	}
	if rec.count() != 4 {
		t.Fatal("a cancelled subscriber was called")
	}

	// Concurrent writers: the subscriber sees versions grow, one call at
	// a time, and ends with the final state.
	var inCall atomic.Int32
	var mu sync.Mutex
	var versions []int64
	r.Subscribe(func(s *Snapshot) {
		if inCall.Add(1) != 1 {
			t.Error("the subscriber was called concurrently with itself")
		}
		mu.Lock()
		versions = append(versions, s.Version())
		mu.Unlock()
		inCall.Add(-1)
	})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 20 {
				if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: fmt.Sprint(w, "-", i), Limits: perHour(1)}); err != nil {
					t.Error(err)
				}
				_ = r.Snapshot().Overrides()
			}
		})
	}
	wg.Wait()
	for i := 1; i < len(versions); i++ {
		if versions[i] <= versions[i-1] {
			t.Fatalf("the subscriber saw version %d after %d", versions[i], versions[i-1])
		}
	}
	if got := len(r.Snapshot().Overrides()); got != 160 {
		t.Fatalf("%d overrides, want 160", got)
	}
	if versions[len(versions)-1] != r.Snapshot().Version() {
		t.Fatalf("the subscriber's last version %d is not the current %d", versions[len(versions)-1], r.Snapshot().Version())
	}
}

// TestTwoRuntimesOneMemoryBackend: a memory backend shared by two
// Runtimes (two handlers of one process) is polled like Redis.
func TestTwoRuntimesOneMemoryBackend(t *testing.T) {
	b := NewMemoryBackend()
	a := open(t, b, Options{Poll: 5 * time.Millisecond})
	other := open(t, b, Options{Poll: 5 * time.Millisecond})
	rec := &recorder{}
	other.Subscribe(rec.fn)
	if _, err := a.SetOverride(context.Background(), &Override{Tree: "t", Tier: "u", Value: "v", Unlimited: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the other Runtime's subscriber", func() bool {
		return rec.count() == 2 && rec.last().Override("t", "u", "v") != nil
	})
}

// TestExpiry: an override goes when its time comes, without any write:
// a poll publishes a snapshot without it, calls the subscribers, and
// removes it from the backend.
func TestExpiry(t *testing.T) {
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			c := newClock()
			backend := &polled{Backend: bc.shared(t)()}
			r := open(t, backend, Options{Poll: 5 * time.Millisecond, Now: c.Now})
			rec := &recorder{}
			r.Subscribe(rec.fn)
			ctx := context.Background()
			if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "soon", Unlimited: true, Expires: c.Now().Add(time.Hour)}); err != nil {
				t.Fatal(err)
			}
			if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "later", Unlimited: true, Expires: c.Now().Add(2 * time.Hour)}); err != nil {
				t.Fatal(err)
			}
			if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "never", Unlimited: true}); err != nil {
				t.Fatal(err)
			}
			calls := rec.count()
			c.Advance(time.Hour - time.Nanosecond)
			waitPolls(t, backend, 3) // which must find nothing to do
			if len(r.Snapshot().Overrides()) != 3 || rec.count() != calls {
				t.Fatal("an override went before its time")
			}

			c.Advance(time.Nanosecond)
			waitFor(t, "a snapshot without the expired override", func() bool {
				return rec.count() > calls && rec.last().Override("t", "u", "soon") == nil
			})
			if s := r.Snapshot(); s.Override("t", "u", "soon") != nil || s.Override("t", "u", "later") == nil || len(s.Overrides()) != 2 {
				t.Fatalf("after the first expiry: %d overrides", len(s.Overrides()))
			}
			waitFor(t, "the expired entry pruned from the backend", func() bool {
				_, fields, err := backend.Load(ctx)
				return err == nil && len(fields) == 2 && fields[overrideField("t", "u", "soon")] == nil
			})

			c.Advance(2 * time.Hour)
			waitFor(t, "the second expiry", func() bool {
				s := rec.last()
				return len(s.Overrides()) == 1 && s.Override("t", "u", "never") != nil
			})
			waitFor(t, "the second entry pruned", func() bool {
				_, fields, err := backend.Load(ctx)
				return err == nil && len(fields) == 1
			})
			// A new instance never publishes what expired, nor does
			// NewSnapshot.
			if s := NewSnapshot([]*Override{{Tree: "t", Tier: "u", Value: "x", Unlimited: true, Expires: c.Now()}}, nil, c.Now()); len(s.Overrides()) != 0 {
				t.Fatal("NewSnapshot kept an expired override")
			}
		})
	}
}

// racingBackend replaces an entry just before the Runtime prunes it, as
// another instance could.
type racingBackend struct {
	Backend
	replaced atomic.Bool
	replace  func()
}

func (b *racingBackend) DeleteIf(ctx context.Context, field string, value []byte) (bool, error) {
	if !b.replaced.Swap(true) {
		b.replace()
	}
	return b.Backend.DeleteIf(ctx, field, value)
}

// TestPruneKeepsReplacement: an expired entry replaced by a newer one
// before the prune is not deleted, and the newer one applies.
func TestPruneKeepsReplacement(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	mem := NewMemoryBackend()
	writer := open(t, mem, Options{Poll: time.Hour, Now: c.Now})
	rb := &racingBackend{Backend: mem, replace: func() {
		if _, err := writer.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "v", Limits: perHour(7)}); err != nil {
			t.Error(err)
		}
	}}
	counted := &polled{Backend: rb}
	r := open(t, counted, Options{Poll: 5 * time.Millisecond, Now: c.Now})
	if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "v", Unlimited: true, Expires: c.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Minute)
	waitFor(t, "the replacement applied", func() bool {
		o := r.Snapshot().Override("t", "u", "v")
		return rb.replaced.Load() && o != nil && !o.Unlimited
	})
	waitPolls(t, counted, 3) // which must not prune the replacement
	_, fields, _ := mem.Load(ctx)
	if o := decode[Override](fields[overrideField("t", "u", "v")]); o == nil || o.Limits[0].Count != 7 {
		t.Fatalf("the replacement was pruned: %v", fields)
	}
}

// TestBackendDeleteIf: the compare-and-delete every backend provides.
func TestBackendDeleteIf(t *testing.T) {
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			ctx := context.Background()
			b := bc.shared(t)()
			v0, _ := b.Version(ctx)
			if old, err := b.Set(ctx, "f", []byte("one")); old != nil || err != nil {
				t.Fatalf("set: %q %v", old, err)
			}
			if old, err := b.Set(ctx, "f", []byte("two")); string(old) != "one" || err != nil {
				t.Fatalf("replace: %q %v", old, err)
			}
			v2, _ := b.Version(ctx)
			if ok, err := b.DeleteIf(ctx, "f", []byte("one")); ok || err != nil {
				t.Fatalf("deleted a replaced entry: %v %v", ok, err)
			}
			if ok, err := b.DeleteIf(ctx, "g", []byte("one")); ok || err != nil {
				t.Fatalf("deleted a missing entry: %v %v", ok, err)
			}
			if old, err := b.Delete(ctx, "g"); old != nil || err != nil {
				t.Fatalf("delete missing: %q %v", old, err)
			}
			if v, _ := b.Version(ctx); v != v2 || v2 != v0+2 {
				t.Fatalf("versions %d, %d, %d: want +2 for two sets, then no change for no-ops", v0, v2, v)
			}
			if ok, err := b.DeleteIf(ctx, "f", []byte("two")); !ok || err != nil {
				t.Fatalf("did not delete the entry: %v %v", ok, err)
			}
			v, fields, err := b.Load(ctx)
			if err != nil || len(fields) != 0 || v != v2+1 {
				t.Fatalf("load: v%d %v %v", v, fields, err)
			}
		})
	}
}

// TestLogging: each change is logged at INFO with its fields, values
// clipped; changes that change nothing are not.
func TestLogging(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	c := newClock()
	r := open(t, NewMemoryBackend(), Options{Poll: time.Hour, Now: c.Now, Logger: zap.New(core)})
	r.ShowValues(func(tree, tier, value string) (string, bool) { return value, tree == "t" })
	ctx := context.Background()
	long := strings.Repeat("é", 300) // 600 bytes
	r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: long, Limits: []*hierarchy.Limit{{Count: 100000, Per: "h", Dimension: "tokens"}}, Note: "why"})
	r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: long, Unlimited: true, Expires: c.Now().Add(time.Hour)})
	r.DeleteOverride(ctx, "t", "u", long)
	r.DeleteOverride(ctx, "t", "u", long)
	r.SetMode(ctx, &Mode{Tree: "t", Mode: ModeShadow, Note: "test"})
	r.DeleteMode(ctx, "t")
	r.DeleteMode(ctx, "t")

	var got []string
	for _, e := range logs.AllUntimed() {
		if e.Level != zapcore.InfoLevel {
			continue
		}
		fields := e.ContextMap()
		if v, ok := fields["value"].(string); ok {
			if len(v) > 256+20 || !strings.HasPrefix(v, strings.Repeat("é", 128)) || !strings.HasSuffix(v, "… (600 bytes)") {
				t.Errorf("%s: value %q not clipped to 256 bytes", e.Message, v)
			}
		}
		got = append(got, fmt.Sprintf("%s old=%v new=%v note=%v", e.Message, fields["old"], fields["new"], fields["note"]))
	}
	want := []string{
		"rate limit override set old=<nil> new=map[limits:[100000 tokens/h] note:why updated:2026-11-24T16:00:00Z] note=why",
		"rate limit override set old=map[limits:[100000 tokens/h] note:why updated:2026-11-24T16:00:00Z] new=map[expires:2026-11-24T17:00:00Z unlimited:true updated:2026-11-24T16:00:00Z] note=",
		"rate limit override deleted old=map[expires:2026-11-24T17:00:00Z unlimited:true updated:2026-11-24T16:00:00Z] new=<nil> note=",
		"rate limit mode set old= new=shadow note=test",
		"rate limit mode deleted old=shadow new=<nil> note=test",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("INFO logs:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// flakyBackend fails while down is set.
type flakyBackend struct {
	Backend
	down atomic.Bool
}

var errDown = errors.New("connection refused")

func (b *flakyBackend) Version(ctx context.Context) (int64, error) {
	if b.down.Load() {
		return 0, errDown
	}
	return b.Backend.Version(ctx)
}

func (b *flakyBackend) Load(ctx context.Context) (int64, map[string][]byte, error) {
	if b.down.Load() {
		return 0, nil, errDown
	}
	return b.Backend.Load(ctx)
}

func (b *flakyBackend) Set(ctx context.Context, f string, v []byte) ([]byte, error) {
	if b.down.Load() {
		return nil, errDown
	}
	return b.Backend.Set(ctx, f, v)
}

// TestBackendDown: a failing backend keeps the last state, expires
// overrides all the same, fails writes with its error wrapped, and is
// logged at most once per 10s, and again when it recovers.
func TestBackendDown(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	c := newClock()
	b := &flakyBackend{Backend: NewMemoryBackend()}
	b.down.Store(true)
	counted := &polled{Backend: b}
	r := open(t, counted, Options{Poll: 2 * time.Millisecond, Now: c.Now, Logger: zap.New(core)})
	if n := logs.FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
		t.Fatalf("%d warnings at start, want 1", n)
	}
	if s := r.Snapshot(); s == nil || len(s.Overrides()) != 0 || s.Version() != -1 {
		t.Fatal("New with the backend down: want an empty snapshot of version -1")
	}
	waitPolls(t, counted, 5) // failed, within 10s of clock time
	if n := logs.FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
		t.Fatalf("%d warnings in 10s, want 1", n)
	}
	c.Advance(10 * time.Second)
	waitFor(t, "a second warning after 10s", func() bool { return logs.FilterLevelExact(zapcore.WarnLevel).Len() == 2 })

	b.down.Store(false)
	waitFor(t, "the recovery logged", func() bool {
		return logs.FilterMessage("rate limit runtime state: the store answers again").Len() == 1
	})
	ctx := context.Background()
	if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "v", Unlimited: true, Expires: c.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "w", Unlimited: true}); err != nil {
		t.Fatal(err)
	}

	b.down.Store(true)
	_, err := r.SetMode(ctx, &Mode{Tree: "t", Mode: ModeWarn})
	var inv *InvalidError
	if !errors.Is(err, errDown) || errors.As(err, &inv) || !strings.Contains(err.Error(), "setting the mode") {
		t.Fatalf("a write to a failing backend: %v, want the backend's error wrapped", err)
	}
	waitPolls(t, counted, 3) // failed
	if r.Snapshot().Override("t", "u", "v") == nil || r.Snapshot().Override("t", "u", "w") == nil {
		t.Fatal("the state was dropped while the backend failed")
	}
	c.Advance(time.Minute)
	waitFor(t, "an expiry while the backend fails", func() bool {
		s := r.Snapshot()
		return s.Override("t", "u", "v") == nil && s.Override("t", "u", "w") != nil
	})
}

// TestReadBackFails: a change stored but not read back still applies at
// once, and the next poll reloads the truth.
func TestReadBackFails(t *testing.T) {
	mem := NewMemoryBackend()
	b := &loadFails{Backend: mem}
	r := open(t, b, Options{Poll: 5 * time.Millisecond})
	b.fail.Store(true)
	ctx := context.Background()
	if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "v", Unlimited: true}); err != nil {
		t.Fatal(err)
	}
	if r.Snapshot().Override("t", "u", "v") == nil {
		t.Fatal("a stored change not applied at once when the read-back failed")
	}
	if _, err := mem.Set(ctx, modeField("t"), []byte(`{"tree":"t","mode":"warn"}`)); err != nil {
		t.Fatal(err)
	}
	b.fail.Store(false)
	waitFor(t, "the poll reloads", func() bool { return r.Snapshot().Mode("t") != nil })
	if r.Snapshot().Override("t", "u", "v") == nil {
		t.Fatal("the change was lost")
	}
}

type loadFails struct {
	Backend
	fail atomic.Bool
}

func (b *loadFails) Load(ctx context.Context) (int64, map[string][]byte, error) {
	if b.fail.Load() {
		return 0, nil, errDown
	}
	return b.Backend.Load(ctx)
}

// TestUnreadableEntries: entries that do not decode, or of another
// format, are ignored rather than failing the state.
func TestUnreadableEntries(t *testing.T) {
	mem := NewMemoryBackend()
	ctx := context.Background()
	mem.Set(ctx, overrideField("t", "u", "bad"), []byte("{not json"))
	mem.Set(ctx, "x\x00future", []byte("{}"))
	mem.Set(ctx, overrideField("t", "u", "good"), []byte(`{"unlimited":true}`))
	core, logs := observer.New(zapcore.WarnLevel)
	r := open(t, mem, Options{Poll: time.Hour, Logger: zap.New(core)})
	s := r.Snapshot()
	if len(s.Overrides()) != 1 || s.Override("t", "u", "good") == nil {
		t.Fatalf("overrides %v", s.Overrides())
	}
	if logs.Len() != 1 {
		t.Fatalf("%d warnings, want 1 for the entry that does not decode", logs.Len())
	}
}

func TestNilSnapshot(t *testing.T) {
	var s *Snapshot
	if s.Overrides() != nil || s.Override("a", "b", "c") != nil || s.Modes() != nil || s.Mode("a") != nil || s.Version() != -1 {
		t.Fatal("a nil snapshot is not the empty state")
	}
}

func TestClose(t *testing.T) {
	r, err := New(NewMemoryBackend(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Close() != nil || r.Close() != nil {
		t.Fatal("Close failed")
	}
	if _, err := r.SetMode(context.Background(), &Mode{Tree: "t", Mode: ModeWarn}); err != nil || r.Snapshot().Mode("t") == nil {
		t.Fatalf("a write after Close: %v", err)
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Fatal("New without a backend")
	}
}

// TestLoggedValuesShownByHandlers: the Runtime's logs write a tier's value
// as the handlers that know its tree show it: raw when every one shows it
// raw, a fingerprint when any one does (two handlers may name a tree
// alike, one keyed on a credential), and not at all for a tree none knows.
func TestLoggedValuesShownByHandlers(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	r := open(t, NewMemoryBackend(), Options{Poll: time.Hour, Logger: zap.New(core)})
	r.ShowValues(func(tree, tier, value string) (string, bool) { return value, tree == "api" || tree == "open" })
	cancel := r.ShowValues(func(tree, tier, value string) (string, bool) {
		return "fp:0123456789ab", tree == "api"
	})
	ctx := context.Background()
	limits := []*hierarchy.Limit{{Count: 5, Per: "h"}}
	for _, tree := range []string{"api", "open", "other"} {
		if _, err := r.SetOverride(ctx, &Override{Tree: tree, Tier: "key", Value: "Bearer sk-secret", Limits: limits}); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	if _, err := r.SetOverride(ctx, &Override{Tree: "api", Tier: "key", Value: "Bearer sk-secret", Limits: limits, Note: "again"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range logs.AllUntimed() {
		got = append(got, fmt.Sprint(e.ContextMap()["tree"], " ", e.ContextMap()["value"]))
	}
	want := []string{"api fp:0123456789ab", "open Bearer sk-secret", "other (not shown: no handler has tree other)", "api Bearer sk-secret"}
	if !slices.Equal(got, want) {
		t.Fatalf("values logged: %q, want %q", got, want)
	}
}
