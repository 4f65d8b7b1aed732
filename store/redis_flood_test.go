package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/rate"
)

// TestFloodDoesNotOpenTheBreaker: a healthy Redis 20 ms away, the default
// timeout (250 ms), no tenant_in_flight, and one tenant flooding this
// instance with 3,000 callers (more than Redis answers within the timeout). The
// flood's decisions that wait out their timeout in this instance's queue
// say nothing of Redis: the breaker must not open, and a quiet tenant must
// never be refused with ErrBreakerOpen.
//
// It is a load test, run by hand (CASCADE_FLOOD=1 go test -run Flood
// ./store/): on a machine loaded by other tests or the race detector, the
// 3,000 callers starve the batcher's own goroutines of CPU, and decisions
// then time out on the wire too — which the breaker rightly counts.
func TestFloodDoesNotOpenTheBreaker(t *testing.T) {
	if os.Getenv("CASCADE_FLOOD") == "" {
		t.Skip("a load test: set CASCADE_FLOOD=1 to run it on an otherwise idle machine")
	}
	srv := redistest.Shared(t)
	s, err := NewRedis(context.Background(), RedisOptions{
		Addrs: []string{srv.Addr()}, KeyPrefix: fmt.Sprintf("flood%d:", time.Now().UnixNano()),
		Breaker: BreakerOptions{Failures: 3, Cooldown: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A healthy Redis 20 ms away (another zone): 2 batches of 64 in flight,
	// about 6,400 decisions/s.
	s.Client().AddHook(latency(20 * time.Millisecond))
	var opened atomic.Value
	s.SetBreakerChange(func(_ string, open bool, err error) {
		if open {
			opened.Store(fmt.Sprintf("%T %v", err, err))
		}
	})
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 1 << 40, Period: time.Hour}
	path := func(tenant string) []Bucket { return []Bucket{{Key: "{" + tenant + "}k", Limit: lim, Cost: 1}} }
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var floodTimeouts atomic.Int64
	for range 3000 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := s.Decide(context.Background(), path("flood")); errors.Is(err, context.DeadlineExceeded) {
					floodTimeouts.Add(1)
				}
			}
		}()
	}
	open, quietErr := 0, map[string]int{}
	for ctx.Err() == nil {
		if _, err := s.Decide(context.Background(), path("quiet")); errors.Is(err, ErrBreakerOpen) {
			open++
		} else if err != nil {
			quietErr[err.Error()]++
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	t.Logf("opened by %v; flood timeouts %d, breaker trips %d, quiet errors %v", opened.Load(), floodTimeouts.Load(), s.BreakerTrips(), quietErr)
	if s.BreakerTrips() > 0 || open > 0 {
		t.Fatalf("Redis healthy, one tenant flooding: the breaker opened %d times, %d quiet decisions refused with ErrBreakerOpen", s.BreakerTrips(), open)
	}
}
