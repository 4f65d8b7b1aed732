package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/rate"
)

func queuedCall(tenant string, i int) *call {
	return &call{keys: []string{"p:{global}#1", fmt.Sprintf("p:{api|org=%s}u%d#1", tenant, i)}, done: make(chan struct{})}
}

func tenantsOf(batch []*call) []string {
	var out []string
	for _, c := range batch {
		out = append(out, tenantOf(c.keys))
	}
	return out
}

// TestFairQueueTakesTurns: a tenant flooding the queue does not delay
// another's decisions: a batch takes a call of each tenant in turn, each
// tenant's in the order they came.
func TestFairQueueTakesTurns(t *testing.T) {
	q := newFairQueue(0)
	var noisy []*call
	for i := range 300 {
		c := queuedCall("noisy", i)
		noisy = append(noisy, c)
		if err := q.push(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*call{queuedCall("quiet", 0), queuedCall("calm", 0), queuedCall("quiet", 1)} {
		if err := q.push(c); err != nil {
			t.Fatal(err)
		}
	}
	batch := q.take(nil, 8, 1024)
	got := fmt.Sprint(tenantsOf(batch))
	if want := "[p:{api|org=noisy} p:{api|org=quiet} p:{api|org=calm} p:{api|org=noisy} p:{api|org=quiet} p:{api|org=noisy} p:{api|org=noisy} p:{api|org=noisy}]"; got != want {
		t.Fatalf("first batch %s, want %s", got, want)
	}
	// Within a tenant, first in first out.
	var order []*call
	for _, c := range batch {
		if tenantOf(c.keys) == "p:{api|org=noisy}" {
			order = append(order, c)
		}
	}
	for i, c := range order {
		if c != noisy[i] {
			t.Fatalf("noisy call %d of the batch is not the %dth queued", i, i)
		}
	}
	q.finished(batch)
	// The rest: the flood alone, in order, bounded by calls and buckets.
	batch = q.take(nil, 64, 20)
	if len(batch) != 10 || batch[0] != noisy[5] {
		t.Fatalf("second batch: %d calls (want 10: 20 buckets of 2), first the noisy tenant's %v", len(batch), batch[0] == noisy[5])
	}
	q.finished(batch)
	if len(q.tenants) != 1 || q.queued != 300-15 {
		t.Fatalf("left: %d tenants, %d calls; want the noisy one's %d", len(q.tenants), q.queued, 300-15)
	}
}

// TestFairQueueBounds: a tenant at its cap (queued and on the wire) is
// refused at once; a full queue makes the tenant with the most queued give
// way; close fails what is queued.
func TestFairQueueBounds(t *testing.T) {
	q := newFairQueue(3)
	for i := range 3 {
		if err := q.push(queuedCall("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	batch := q.take(nil, 2, 1024) // two on the wire, one queued: still three
	if err := q.push(queuedCall("a", 3)); !errors.Is(err, ErrOverloaded) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a fourth call of a tenant capped at 3: %v, want ErrOverloaded", err)
	}
	if err := q.push(queuedCall("b", 0)); err != nil {
		t.Fatalf("another tenant: %v", err)
	}
	q.finished(batch)
	if err := q.push(queuedCall("a", 4)); err != nil {
		t.Fatalf("after its calls were answered: %v", err)
	}

	q = newFairQueue(0)
	var flood []*call
	for i := range queueMax {
		c := queuedCall("flood", i)
		flood = append(flood, c)
		if err := q.push(c); err != nil {
			t.Fatal(err)
		}
	}
	quiet := queuedCall("quiet", 0)
	if err := q.push(quiet); err != nil {
		t.Fatalf("a quiet tenant's call with the queue full of a flood: %v", err)
	}
	select {
	case <-flood[queueMax-1].done:
		if !errors.Is(flood[queueMax-1].err, ErrOverloaded) {
			t.Fatalf("the flood's newest call: %v, want ErrOverloaded", flood[queueMax-1].err)
		}
	default:
		t.Fatal("the queue is full and the quiet call was queued: the flood's newest call must give way")
	}
	if err := q.push(queuedCall("flood", -1)); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("the flood's call with the queue full: %v, want ErrOverloaded", err)
	}
	q.close()
	for _, c := range []*call{quiet, flood[0]} {
		select {
		case <-c.done:
			if !errors.Is(c.err, redis.ErrClosed) {
				t.Fatalf("queued call after close: %v", c.err)
			}
		default:
			t.Fatal("a queued call was left after close")
		}
	}
	if err := q.push(queuedCall("late", 0)); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("push after close: %v", err)
	}
}

// TestOverloadedIsNotAFailure: the breaker counts Redis's failures, not
// decisions this instance shed.
func TestOverloadedIsNotAFailure(t *testing.T) {
	b := newBreaker("test", &BreakerOptions{Failures: 2, Cooldown: time.Second}, nil)
	for range 5 {
		b.record(fmt.Errorf("redis store: decide: %w", ErrOverloaded))
	}
	if b.open.Load() || b.failures.Load() != 0 {
		t.Fatalf("breaker open %v after shedding, %d failures; want neither", b.open.Load(), b.failures.Load())
	}
}

// TestAdjustsLeaveDecisionsTheirConnections: corrections on the wire are
// bounded below the pool's size; one beyond the bound waits for its turn
// and, at its timeout, fails as this instance's overload (not Redis's
// failure), while decisions go on. A correction that waits for its turn
// never reaches Redis, so its store's timeout is short; the calls that do
// go through a store whose timeout a slow machine cannot reach.
func TestAdjustsLeaveDecisionsTheirConnections(t *testing.T) {
	open := func(timeout time.Duration) *Redis {
		s, err := NewRedis(context.Background(), RedisOptions{Addrs: []string{redistest.Shared(t).Addr()}, KeyPrefix: "adjusts:", PoolSize: 6,
			Timeout: timeout, Breaker: BreakerOptions{Failures: 1}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if cap(s.adjusts) != 3 {
			t.Fatalf("pool 6: %d corrections at once, want 3 (the batch workers' 2 and one more left)", cap(s.adjusts))
		}
		for range cap(s.adjusts) { // the corrections on the wire
			s.adjusts <- struct{}{}
		}
		return s
	}
	short, s := open(100*time.Millisecond), open(testCallTimeout)
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 100, Period: time.Hour}
	b := []Bucket{{Key: "{t}k", Limit: lim, Cost: 1}}
	err := short.Adjust(context.Background(), []Bucket{{Key: "{t}k", Limit: lim, Cost: -1}})
	if !errors.Is(err, ErrOverloaded) || !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a correction beyond the bound: %v, want ErrOverloaded at its timeout", err)
	}
	if short.BreakerOpen() {
		t.Fatal("the breaker opened on this instance's own overload")
	}
	if d, err := s.Decide(context.Background(), b); err != nil || !d.Allowed {
		t.Fatalf("a decision while corrections fill their share: %v, %v", d.Allowed, err)
	}
	<-s.adjusts
	if err := s.Adjust(context.Background(), []Bucket{{Key: "{t}k", Limit: lim, Cost: -1}}); err != nil {
		t.Fatalf("a correction once one is done: %v", err)
	}
}
