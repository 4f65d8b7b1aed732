package control

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// TestSharedThroughRedis: a change through one instance reaches another
// at its next poll (every 250 ms) and calls its subscriber; a new instance
// (a restart) loads the state; on a standalone Redis and on a 3-master
// Cluster, each instance with its own client.
func TestSharedThroughRedis(t *testing.T) {
	for _, tt := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient { return redisClient(t, redistest.Shared(t).Addr()) }},
		{"cluster", func(t *testing.T) redis.UniversalClient {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.SharedCluster(t).Addrs(), ContextTimeoutEnabled: true,
				DialTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
			t.Cleanup(func() { c.Close() })
			return c
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prefix := testPrefix(t)
			instance := func() *Runtime { return open(t, NewRedisBackend(tt.client(t), prefix), Options{}) } // default Poll
			a, b := instance(), instance()
			rec := &recorder{}
			b.Subscribe(rec.fn)
			ctx := context.Background()
			value := "big:corp/組織\x00" + strings.Repeat("x", 10<<10)

			if _, err := a.SetOverride(ctx, &Override{Tree: "acme", Tier: "org", Value: value, Limits: perHour(50000), Note: "deal"}); err != nil {
				t.Fatal(err)
			}
			if a.Snapshot().Override("acme", "org", value) == nil {
				t.Fatal("the writer did not apply its own change before returning")
			}
			took := waitFor(t, "B's subscriber sees A's override", func() bool {
				return rec.count() == 2 && rec.last().Override("acme", "org", value) != nil
			})
			t.Logf("the other instance applied the change after %v", took)
			if o := b.Snapshot().Override("acme", "org", value); o == nil || o.Limits[0].Count != 50000 || o.Note != "deal" {
				t.Fatalf("B's override: %+v", o)
			}

			if _, err := a.SetMode(ctx, &Mode{Tree: "acme", Mode: ModeWarn}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "B sees A's mode", func() bool { return b.Snapshot().Mode("acme") != nil })

			restarted := instance()
			if s := restarted.Snapshot(); s.Override("acme", "org", value) == nil || s.Mode("acme") == nil || s.Version() != a.Snapshot().Version() {
				t.Fatal("a new instance did not load the state")
			}

			old, err := b.DeleteOverride(ctx, "acme", "org", value)
			if err != nil || old == nil || old.Value != value {
				t.Fatalf("delete through B: %v %v", old, err)
			}
			waitFor(t, "A and the new instance see B's deletion", func() bool {
				return a.Snapshot().Override("acme", "org", value) == nil && restarted.Snapshot().Override("acme", "org", value) == nil
			})
		})
	}
}

// TestRedisDown: a killed Redis does not fail New, never takes the
// state away, fails writes with a wrapped error; a Redis that comes back
// (empty: nothing is persisted here) is followed, whatever its version.
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	prefix := "down:"
	counted := &polled{Backend: NewRedisBackend(redisClient(t, srv.Addr()), prefix)}
	r := open(t, counted, Options{Poll: 20 * time.Millisecond})
	for _, v := range []string{"a", "b", "c"} {
		if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: v, Unlimited: true}); err != nil {
			t.Fatal(err)
		}
	}

	srv.Kill()
	waitPolls(t, counted, 3) // failed
	if len(r.Snapshot().Overrides()) != 3 {
		t.Fatal("the state was dropped when Redis went away")
	}
	_, err := r.SetMode(ctx, &Mode{Tree: "t", Mode: ModeWarn})
	var inv *InvalidError
	if err == nil || errors.As(err, &inv) || errors.Unwrap(err) == nil || !strings.Contains(err.Error(), "setting the mode: the store failed") {
		t.Fatalf("a write to a dead Redis: %v, want a wrapped store error", err)
	}
	start := time.Now()
	dead := open(t, NewRedisBackend(redisClient(t, srv.Addr()), prefix), Options{Poll: 20 * time.Millisecond})
	if len(dead.Snapshot().Overrides()) != 0 || dead.Snapshot().Version() != -1 {
		t.Fatal("New with Redis down: want an empty state")
	}
	// New bounds its load by ioTimeout (2 s), and a dead Redis refuses at
	// once: 10 s is a New that waits for Redis, not a slow machine.
	d := time.Since(start)
	t.Logf("New with Redis down returned after %v", d)
	if d > 10*time.Second {
		t.Fatalf("New with Redis down took %v", d)
	}

	// Redis restarts empty, at version 0 < 3: both instances follow it,
	// and a change made then reaches both.
	srv.Restart(t)
	waitFor(t, "the restarted, empty Redis followed", func() bool { return len(r.Snapshot().Overrides()) == 0 })
	if _, err := dead.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "after", Unlimited: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a change after the restart", func() bool { return r.Snapshot().Override("t", "u", "after") != nil })
}

// TestRedisPaused: a Redis that hangs fails writes by their context's
// deadline (the client's own timeouts are far longer) and keeps the
// state; overrides still expire.
func TestRedisPaused(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	c := newClock()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true,
		DialTimeout: time.Minute, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { client.Close() })
	r := open(t, NewRedisBackend(client, "paused:"), Options{Poll: 10 * time.Millisecond, Now: c.Now})
	if _, err := r.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "v", Unlimited: true, Expires: c.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := r.DeleteOverride(wctx, "t", "u", "v")
	d := time.Since(start)
	t.Logf("a write to a paused Redis failed after %v: %v", d, err)
	var ne net.Error
	if err == nil || !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("a write to a paused Redis: %v, want its context's timeout", err)
	}
	// Not the client's timeouts (a minute): the context's deadline.
	if d > 30*time.Second {
		t.Fatalf("a write to a paused Redis took %v", d)
	}
	if r.Snapshot().Override("t", "u", "v") == nil {
		t.Fatal("the state was dropped while Redis hung")
	}
	c.Advance(time.Minute)
	waitFor(t, "an expiry while Redis hangs", func() bool { return r.Snapshot().Override("t", "u", "v") == nil })
}

// TestRedisKeys: the documented layout, in one Cluster slot.
func TestRedisKeys(t *testing.T) {
	srv := redistest.Shared(t)
	prefix := testPrefix(t)
	r := open(t, NewRedisBackend(redisClient(t, srv.Addr()), prefix), Options{Poll: time.Hour})
	if _, err := r.SetMode(context.Background(), &Mode{Tree: "t", Mode: ModeShadow}); err != nil {
		t.Fatal(err)
	}
	if v, err := redistest.Do(srv.Addr(), "GET", prefix+"{cascade-control}version"); err != nil || v != "1" {
		t.Fatalf("version key: %q %v", v, err)
	}
	if v, err := redistest.Do(srv.Addr(), "HGET", prefix+"{cascade-control}state", "m\x00t"); err != nil || !strings.Contains(v, `"mode":"shadow"`) {
		t.Fatalf("state field: %q %v", v, err)
	}
	state, _ := redistest.Do(srv.Addr(), "CLUSTER", "KEYSLOT", prefix+"{cascade-control}state")
	version, _ := redistest.Do(srv.Addr(), "CLUSTER", "KEYSLOT", prefix+"{cascade-control}version")
	if state != version {
		// Standalone servers answer CLUSTER KEYSLOT too.
		t.Fatalf("slots %s and %s differ", state, version)
	}
	if ttl, _ := redistest.Do(srv.Addr(), "TTL", prefix+"{cascade-control}state"); ttl != "-1" {
		t.Fatalf("the state has a TTL: %s", ttl)
	}
}
