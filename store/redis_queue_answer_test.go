package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/lua"
	"github.com/caddy-cascade/cascade/rate"
)

// TestExpiredCallKeepsItsTenantsCount: a call whose client went away while
// it was queued shares a batch with another tenant's live call. Once both
// are answered, neither tenant may still count a call in flight: tenant a
// must be able to decide again under tenant_in_flight 1, and both tenants
// must be forgotten.
func TestExpiredCallKeepsItsTenantsCount(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	client.AddHook(until(release))
	r := &Redis{prefix: "onwire:"}
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 100, Period: time.Hour}
	enc := func(tenant string) ([]string, []string, []byte) {
		return r.encode([]Bucket{{Key: "{" + tenant + "}k", Limit: lim, Cost: 1}}, 0, WallClock(), false)
	}
	b := newBatcher(client, lua.Decide, 5*time.Second, false, 1)
	defer b.close()
	deadline := time.Now().Add(5 * time.Second)
	errs := make(chan error, 4)
	decide := func(ctx context.Context, tenant string) {
		keys, logs, spec := enc(tenant)
		_, err := b.do(ctx, deadline, "", keys, logs, spec)
		errs <- err
	}
	// Both workers busy with a call each, held by the hook.
	go decide(context.Background(), "x1")
	go decide(context.Background(), "x2")
	time.Sleep(50 * time.Millisecond)
	// a's call queued, then its client goes; b's queued behind it.
	ctx, cancel := context.WithCancel(context.Background())
	go decide(ctx, "a")
	time.Sleep(20 * time.Millisecond)
	go decide(context.Background(), "b")
	time.Sleep(20 * time.Millisecond)
	cancel()
	close(release)
	for range 4 {
		<-errs
	}
	time.Sleep(50 * time.Millisecond) // the workers' finished()
	b.queue.mu.Lock()
	left := map[string]int{}
	for name, tc := range b.queue.tenants {
		left[name] = tc.onWire
	}
	b.queue.mu.Unlock()
	t.Logf("left: %v", left)
	if len(left) != 0 {
		t.Errorf("tenants left with nothing queued or in flight (name: onWire): %v", left)
	}
	keys, logs, spec := enc("a")
	if _, err := b.do(context.Background(), time.Now().Add(time.Second), "", keys, logs, spec); errors.Is(err, ErrOverloaded) {
		t.Fatalf("tenant a, nothing of its in flight, capped at 1: %v", err)
	}
}

// TestAnsweredCallNoLongerCounts: a tenant capped at 1 that decides one
// request after another (each after the previous was answered) is never
// shed.
func TestAnsweredCallNoLongerCounts(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	r := &Redis{prefix: "seq:"}
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 1 << 40, Period: time.Hour}
	b := newBatcher(client, lua.Decide, 5*time.Second, false, 1)
	defer b.close()
	keys, logs, spec := r.encode([]Bucket{{Key: "{a}k", Limit: lim, Cost: 1}}, 0, WallClock(), false)
	shed := 0
	for range 2000 {
		if _, err := b.do(context.Background(), time.Now().Add(time.Second), "", keys, logs, spec); errors.Is(err, ErrOverloaded) {
			shed++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if shed > 0 {
		t.Fatalf("%d of 2000 sequential decisions of one tenant capped at 1 were shed as overloaded", shed)
	}
}
