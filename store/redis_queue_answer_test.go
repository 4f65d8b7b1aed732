package store

import (
	"context"
	"errors"
	"fmt"
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
	b := newBatcher(client, lua.Decide, time.Minute, false, 1)
	defer b.close()
	deadline := time.Now().Add(time.Minute)
	errs := make(chan error, 4)
	decide := func(ctx context.Context, tenant string) {
		keys, logs, spec := enc(tenant)
		_, err := b.do(ctx, deadline, "", keys, logs, spec)
		errs <- err
	}
	// Both workers busy with a call each, held by the hook.
	for i, tenant := range []string{"x1", "x2"} {
		go decide(context.Background(), tenant)
		waitQueue(t, b.queue, fmt.Sprintf("worker %d to take %s's call", i+1, tenant), func(_, onWire int) bool { return onWire == i+1 })
	}
	// a's call queued, then its client goes; b's queued behind it.
	ctx, cancel := context.WithCancel(context.Background())
	go decide(ctx, "a")
	waitQueue(t, b.queue, "a's call to queue", func(queued, _ int) bool { return queued == 1 })
	go decide(context.Background(), "b")
	waitQueue(t, b.queue, "b's call to queue", func(queued, _ int) bool { return queued == 2 })
	cancel()
	close(release)
	for range 4 {
		<-errs
	}
	// A call is answered once the queue no longer counts it (answer): with
	// every call returned, no tenant may be left.
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
	if _, err := b.do(context.Background(), time.Now().Add(testCallTimeout), "", keys, logs, spec); errors.Is(err, ErrOverloaded) {
		t.Fatalf("tenant a, nothing of its in flight, capped at 1: %v", err)
	}
}

// testCallTimeout is the deadline these tests give a call to a healthy
// Redis: seconds, so that only what the test is about can make it expire.
const testCallTimeout = 10 * time.Second

// TestAnsweredCallNoLongerCounts: a tenant capped at 1 that decides one
// request after another (each after the previous was answered) is never
// shed.
func TestAnsweredCallNoLongerCounts(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	r := &Redis{prefix: "seq:"}
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 1 << 40, Period: time.Hour}
	b := newBatcher(client, lua.Decide, testCallTimeout, false, 1)
	defer b.close()
	keys, logs, spec := r.encode([]Bucket{{Key: "{a}k", Limit: lim, Cost: 1}}, 0, WallClock(), false)
	shed := 0
	for range 2000 {
		if _, err := b.do(context.Background(), time.Now().Add(testCallTimeout), "", keys, logs, spec); errors.Is(err, ErrOverloaded) {
			shed++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if shed > 0 {
		t.Fatalf("%d of 2000 sequential decisions of one tenant capped at 1 were shed as overloaded", shed)
	}
}
