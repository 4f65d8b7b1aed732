package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
)

// TestBreaker: against a real Redis that hangs (SIGSTOP), the calls wait
// out the timeout until Failures of them in a row have failed; then the
// breaker opens and calls fail at once, without waiting, until Redis
// answers a background ping again; then decisions carry on from the state
// Redis kept.
func TestBreaker(t *testing.T) {
	const timeout = 150 * time.Millisecond
	srv := redistest.Start(t)
	changes := make(chan bool, 4)
	s := newRedis(t, store.RedisOptions{Addrs: []string{srv.Addr()}, KeyPrefix: prefix(t), Timeout: timeout,
		Breaker: store.BreakerOptions{Failures: 2, Cooldown: 50 * time.Millisecond, OnChange: func(open bool, err error) {
			if open != (err != nil) {
				t.Errorf("OnChange(%v, %v): an opening names its failure, a closing none", open, err)
			}
			changes <- open
		}}})
	ctx := context.Background()
	bucket := []store.Bucket{{Key: "{b}k", Limit: gcra(3, time.Hour), Cost: 1}}
	if d, err := s.Decide(ctx, bucket); err != nil || !d.Allowed {
		t.Fatalf("with Redis up: %+v %v", d, err)
	}

	srv.Pause()
	for i := range 2 {
		start := time.Now()
		_, err := s.Decide(ctx, bucket)
		if !errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrBreakerOpen) {
			t.Fatalf("failure %d: %v, want the store's own error", i+1, err)
		}
		if took := time.Since(start); took < timeout/2 {
			t.Fatalf("failure %d came after %v, before the timeout: the breaker opened too soon", i+1, took)
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
	other := []store.Bucket{{Key: "{b}other", Limit: gcra(1, time.Hour), Cost: 1}}
	start := time.Now()
	_, errDecide := s.Decide(ctx, other)
	errAdjust := s.Adjust(ctx, []store.Bucket{{Key: "{b}other", Limit: gcra(1, time.Hour), Cost: 5}})
	if took := time.Since(start); !errors.Is(errDecide, store.ErrBreakerOpen) || !errors.Is(errAdjust, store.ErrBreakerOpen) || took > timeout/2 {
		t.Fatalf("with the breaker open: %v, %v after %v; want ErrBreakerOpen at once", errDecide, errAdjust, took)
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
	case <-time.After(10 * time.Second):
		t.Fatal("the breaker did not close after Redis came back")
	}
	// What the open breaker refused never reached Redis: other's one
	// request is still there.
	if d, err := s.Decide(ctx, other); err != nil || !d.Allowed {
		t.Fatalf("after the outage, other: %+v %v: a call refused by the breaker was charged", d, err)
	}
	// k had 2 of 3 left; the two calls that timed out were sent before
	// Redis hung, and Redis may have run them when it woke: at most 2 more
	// are admitted, never more (a timed-out call may count, never one
	// more than was asked).
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
