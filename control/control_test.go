package control

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/internal/redistest"
)

// clock is a settable clock for Options.Now.
type clock struct{ now atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Unix(0, c.now.Load()) }
func (c *clock) Advance(d time.Duration) { c.now.Add(int64(d)) }

func newClock() *clock {
	c := &clock{}
	c.now.Store(time.Date(2026, 11, 24, 16, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func open(t *testing.T, b Backend, opts Options) *Runtime {
	t.Helper()
	r, err := New(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func limits(specs ...string) []*hierarchy.Limit {
	var out []*hierarchy.Limit
	for _, s := range specs {
		count, per, _ := strings.Cut(s, "/")
		n := int64(0)
		for _, c := range count {
			n = n*10 + int64(c-'0')
		}
		out = append(out, &hierarchy.Limit{Count: n, Per: per})
	}
	return out
}

func TestMemoryBackend(t *testing.T) {
	ctx := context.Background()
	r := open(t, NewMemoryBackend(), Options{Poll: time.Hour})
	var got []*Snapshot
	var mu sync.Mutex
	cancel := r.Subscribe(func(s *Snapshot) { mu.Lock(); got = append(got, s); mu.Unlock() })
	defer cancel()

	value := "a:b/é" + strings.Repeat("x", 10<<10)
	old, err := r.SetOverride(ctx, &Override{Tree: "acme", Tier: "user", Value: value, Limits: limits("50000/h"), Note: "deal closed"})
	if err != nil || old != nil {
		t.Fatalf("set: %v %v", old, err)
	}
	o := r.Snapshot().Override("acme", "user", value)
	if o == nil || o.Limits[0].Count != 50000 || o.Note != "deal closed" || o.Updated.IsZero() {
		t.Fatalf("snapshot: %+v", o)
	}
	old, err = r.SetOverride(ctx, &Override{Tree: "acme", Tier: "user", Value: value, Unlimited: true})
	if err != nil || old == nil || old.Limits[0].Count != 50000 {
		t.Fatalf("replace: %+v %v", old, err)
	}
	if _, err := r.SetMode(ctx, &Mode{Tree: "acme", Mode: "shadow"}); err != nil {
		t.Fatal(err)
	}
	if m := r.Snapshot().Mode("acme"); m == nil || m.Mode != "shadow" {
		t.Fatalf("mode %+v", m)
	}
	if old, _ := r.DeleteMode(ctx, "acme"); old == nil || r.Snapshot().Mode("acme") != nil {
		t.Fatal("mode not deleted")
	}
	if old, _ := r.DeleteOverride(ctx, "acme", "user", value); old == nil || !old.Unlimited || len(r.Snapshot().Overrides()) != 0 {
		t.Fatal("override not deleted")
	}
	if old, err := r.DeleteOverride(ctx, "acme", "user", value); old != nil || err != nil {
		t.Fatalf("deleting nothing: %v %v", old, err)
	}
	mu.Lock()
	n := len(got)
	mu.Unlock()
	if n != 5 {
		t.Fatalf("%d snapshots to the subscriber, want one per change (5)", n)
	}
}

func TestValidation(t *testing.T) {
	c := newClock()
	r := open(t, NewMemoryBackend(), Options{Poll: time.Hour, Now: c.Now})
	ctx := context.Background()
	for _, tt := range []struct {
		o    *Override
		says string
	}{
		{&Override{Tier: "user", Value: "x", Unlimited: true}, "names its tree"},
		{&Override{Tree: "t", Tier: "user", Value: "x"}, "no limits"},
		{&Override{Tree: "t", Tier: "user", Value: "x", Unlimited: true, Limits: limits("1/s")}, "exclusive"},
		{&Override{Tree: "t", Tier: "user", Value: "x", Limits: limits("0/s")}, "count"},
		{&Override{Tree: "t", Tier: "user", Value: "x", Unlimited: true, Expires: c.Now().Add(-time.Second)}, "in the past"},
		{&Override{Tree: "t", Tier: "user", Value: "x", Unlimited: true, Note: strings.Repeat("n", 2000)}, "note"},
		{&Override{Tree: "t", Tier: "user", Value: strings.Repeat("v", 17<<10), Unlimited: true}, "value"},
	} {
		_, err := r.SetOverride(ctx, tt.o)
		var inv *InvalidError
		if err == nil || !strings.Contains(err.Error(), tt.says) || !errorsAs(err, &inv) {
			t.Errorf("%+v: %v, want an InvalidError saying %q", tt.o, err, tt.says)
		}
	}
	if _, err := r.SetMode(ctx, &Mode{Tree: "t", Mode: "loud"}); err == nil {
		t.Error("mode loud accepted")
	}
	if len(r.Snapshot().Overrides()) != 0 {
		t.Fatal("an invalid change was stored")
	}
}

func errorsAs(err error, target **InvalidError) bool {
	e, ok := err.(*InvalidError)
	if ok {
		*target = e
	}
	return ok
}

// TestExpiry: an override goes when its time comes, without any write:
// the next poll publishes a snapshot without it and prunes it.
func TestExpiry(t *testing.T) {
	c := newClock()
	b := NewMemoryBackend()
	r := open(t, b, Options{Poll: 5 * time.Millisecond, Now: c.Now})
	notified := make(chan *Snapshot, 10)
	r.Subscribe(func(s *Snapshot) { notified <- s })
	ctx := context.Background()
	if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "x", Unlimited: true, Expires: c.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	<-notified
	c.Advance(59 * time.Minute)
	time.Sleep(30 * time.Millisecond) // polls, which must find nothing to do
	if len(r.Snapshot().Overrides()) != 1 || len(notified) != 0 {
		t.Fatal("the override went before its time")
	}
	c.Advance(time.Minute)
	select {
	case s := <-notified:
		if len(s.Overrides()) != 0 {
			t.Fatal("the expired override is still in the snapshot")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no snapshot after the expiry")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, fields, _ := b.Load(ctx)
		if len(fields) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the expired override was not pruned: %v", fields)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func redisClient(t *testing.T, addrs []string) redis.UniversalClient {
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	return c
}

// waitFor polls cond until it holds, or fails after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// TestSharedThroughRedis: a change through one instance reaches another
// within a second, a new instance (a restart) loads it, on a standalone
// Redis and on a 3-master Cluster.
func TestSharedThroughRedis(t *testing.T) {
	for _, tt := range []struct {
		name  string
		addrs func(t *testing.T) []string
	}{
		{"standalone", func(t *testing.T) []string { return []string{redistest.Shared(t).Addr()} }},
		{"cluster", func(t *testing.T) []string { return redistest.SharedCluster(t).Addrs() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addrs := tt.addrs(t)
			prefix := "ctl-" + strings.ReplaceAll(t.Name(), "/", "-") + ":"
			a := open(t, NewRedisBackend(redisClient(t, addrs), prefix), Options{})
			b := open(t, NewRedisBackend(redisClient(t, addrs), prefix), Options{})
			seen := make(chan struct{}, 10)
			b.Subscribe(func(*Snapshot) { seen <- struct{}{} })
			ctx := context.Background()
			if _, err := a.SetOverride(ctx, &Override{Tree: "acme", Tier: "org", Value: "big:corp", Limits: limits("50000/h")}); err != nil {
				t.Fatal(err)
			}
			took := waitFor(t, time.Second, "B sees A's override", func() bool { return b.Snapshot().Override("acme", "org", "big:corp") != nil })
			t.Logf("seen by the other instance after %v", took)
			<-seen
			if _, err := a.SetMode(ctx, &Mode{Tree: "acme", Mode: "warn"}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, time.Second, "B sees A's mode", func() bool { return b.Snapshot().Mode("acme") != nil })
			c := open(t, NewRedisBackend(redisClient(t, addrs), prefix), Options{})
			if c.Snapshot().Override("acme", "org", "big:corp") == nil || c.Snapshot().Mode("acme") == nil {
				t.Fatal("a new instance did not load the state")
			}
			if _, err := b.DeleteOverride(ctx, "acme", "org", "big:corp"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, time.Second, "A sees B's deletion", func() bool { return a.Snapshot().Override("acme", "org", "big:corp") == nil })
		})
	}
}

// TestRedisDown: an unreachable Redis does not fail New, keeps the last
// state in force, and fails writes with an error.
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	prefix := "down:"
	r := open(t, NewRedisBackend(redisClient(t, []string{srv.Addr()}), prefix), Options{Poll: 20 * time.Millisecond})
	ctx := context.Background()
	if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "v", Unlimited: true}); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	time.Sleep(100 * time.Millisecond) // several failed polls
	if r.Snapshot().Override("t", "u", "v") == nil {
		t.Fatal("the state was dropped when Redis went away")
	}
	if _, err := r.SetMode(ctx, &Mode{Tree: "t", Mode: "warn"}); err == nil {
		t.Fatal("a write to a dead Redis succeeded")
	}
	dead := open(t, NewRedisBackend(redisClient(t, []string{srv.Addr()}), prefix), Options{})
	if len(dead.Snapshot().Overrides()) != 0 {
		t.Fatal("state from nowhere")
	}
}
