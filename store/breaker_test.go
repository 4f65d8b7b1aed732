package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// TestBreaker: against a real Redis that hangs (SIGSTOP), the calls wait
// out the timeout until Failures of them in a row have failed; then the
// breaker opens and calls fail at once, without reaching Redis, until Redis
// answers a background ping again; then decisions carry on from the state
// Redis kept.
func TestBreaker(t *testing.T) {
	// What each failure waits out while Redis hangs, and all that a call
	// to the healthy Redis gets: seconds, for a slow machine.
	const timeout = 2 * time.Second
	srv := redistest.Start(t)
	changes := make(chan bool, 4)
	s := newRedis(t, store.RedisOptions{Addrs: []string{srv.Addr()}, KeyPrefix: prefix(t), Timeout: timeout,
		Breaker: store.BreakerOptions{Failures: 2, Cooldown: 50 * time.Millisecond, OnChange: func(_ string, open bool, err error) {
			if open != (err != nil) {
				t.Errorf("OnChange(%v, %v): an opening names its failure, a closing none", open, err)
			}
			changes <- open
		}}})
	scripts := &counter{}
	s.Client().(*redis.Client).AddHook(scripts)
	ctx := context.Background()
	bucket := []store.Bucket{{Key: "{b}k", Limit: storetest.GCRA(3, time.Hour), Cost: 1}}
	if d, err := s.Decide(ctx, bucket); err != nil || !d.Allowed {
		t.Fatalf("with Redis up: %+v %v", d, err)
	}

	srv.Pause()
	// A call that this instance's own queue held past half its timeout
	// (a slow machine) fails as ErrQueueTimeout, an overload of its own
	// that says nothing of Redis: it does not count, and is tried again.
	for failures, tries := 0, 1; failures < 2; tries++ {
		if tries > 10 {
			t.Fatalf("%d calls to a hung Redis, %d of them failures of the store's own", tries-1, failures)
		}
		start := time.Now()
		_, err := s.Decide(ctx, bucket)
		took := time.Since(start)
		t.Logf("call %d failed after %v: %v", tries, took, err)
		if errors.Is(err, store.ErrOverloaded) {
			if s.BreakerOpen() {
				t.Fatalf("call %d: the breaker opened on this instance's own overload: %v", tries, err)
			}
			continue
		}
		failures++
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrBreakerOpen) {
			t.Fatalf("failure %d: %v, want the store's own error", failures, err)
		}
		if took < timeout/2 {
			t.Fatalf("failure %d came after %v, before the timeout: the breaker opened too soon", failures, took)
		}
		if failures == 1 && s.BreakerOpen() {
			t.Fatal("the breaker opened after one failure of 2")
		}
	}
	select {
	case open := <-changes:
		if !open {
			t.Fatal("the breaker closed instead of opening")
		}
	default:
		t.Fatal("two failures in a row did not open the breaker")
	}
	if !s.BreakerOpen() || s.BreakerTrips() != 1 {
		t.Fatalf("open %v, trips %d", s.BreakerOpen(), s.BreakerTrips())
	}
	// Open: no call waits on Redis, nor reaches it.
	other := []store.Bucket{{Key: "{b}other", Limit: storetest.GCRA(1, time.Hour), Cost: 1}}
	sent := scripts.sent.Load()
	start := time.Now()
	_, errDecide := s.Decide(ctx, other)
	errAdjust := s.Adjust(ctx, []store.Bucket{{Key: "{b}other", Limit: storetest.GCRA(1, time.Hour), Cost: 5}})
	t.Logf("with the breaker open, Decide and Adjust failed in %v", time.Since(start))
	if !errors.Is(errDecide, store.ErrBreakerOpen) || !errors.Is(errAdjust, store.ErrBreakerOpen) {
		t.Fatalf("with the breaker open: %v, %v; want ErrBreakerOpen", errDecide, errAdjust)
	}
	if n := scripts.sent.Load() - sent; n != 0 {
		t.Fatalf("with the breaker open, %d scripts were sent to Redis; want none", n)
	}
	if !errors.Is(errDecide, store.ErrUnavailable) {
		t.Fatal("ErrBreakerOpen does not wrap ErrUnavailable: the failure policies would not apply")
	}

	srv.Resume()
	select {
	case open := <-changes:
		if open {
			t.Fatal("opened twice")
		}
	case <-time.After(timeout + unavailableBound):
		t.Fatal("the breaker did not close after Redis came back")
	}
	// What the open breaker refused never reached Redis: other's one
	// request is still there.
	if d, err := s.Decide(ctx, other); err != nil || !d.Allowed {
		t.Fatalf("after the outage, other: %+v %v: a call refused by the breaker was charged", d, err)
	}
	// k had 2 of 3 left; the calls that timed out reached the hung Redis,
	// which may have run them when it woke: at most 2 more are admitted,
	// never more (a timed-out call may count, never one more than was
	// asked).
	admitted := 0
	for range 4 {
		d, err := s.Decide(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted > 2 {
		t.Fatalf("%d admitted after the outage with at most 2 left", admitted)
	}
}
