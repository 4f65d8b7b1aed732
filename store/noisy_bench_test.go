package store_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// BenchmarkNoisyNeighbour measures what one tenant's load does to the
// others' decisions on one Redis: 8 quiet tenants, each deciding 200
// times a second (open loop: on schedule, whatever the answers' latency),
// alone, beside a noisy tenant at 20× a quiet one's rate (4,000/s, open
// loop), and beside a flood (256 callers back to back, as fast as the
// store answers). It reports the quiet tenants' p50 and p99 decision
// latency, and the noisy tenant's decisions per second. Each run lasts
// 3 s, so the default -benchtime runs each once.
func BenchmarkNoisyNeighbour(b *testing.B) {
	srv := redistest.Start(b)
	for _, load := range []string{"alone", "noisy=20x", "flood=256"} {
		b.Run(load, func(b *testing.B) {
			s := newRedis(b, store.RedisOptions{Addrs: []string{srv.Addr()}, KeyPrefix: fmt.Sprintf("noisy%d:", time.Now().UnixNano())})
			for b.Loop() {
				quiet, noisy := noisyRun(b, s, load, 3*time.Second)
				slices.Sort(quiet)
				b.ReportMetric(float64(quiet[len(quiet)/2].Microseconds()), "quiet-p50-µs")
				b.ReportMetric(float64(quiet[len(quiet)*99/100].Microseconds()), "quiet-p99-µs")
				b.ReportMetric(float64(noisy)/3, "noisy-decisions/s")
			}
		})
	}
}

// noisyRun runs the quiet tenants for d beside load, and returns each
// quiet decision's latency and how many decisions the noisy tenant made.
func noisyRun(b *testing.B, s *store.Redis, load string, d time.Duration) ([]time.Duration, int64) {
	path := func(tenant string, user int) []store.Bucket {
		lim := storetest.GCRA(1_000_000_000, time.Hour) // never refuses: latency only
		org := "{api|org=" + tenant + "}"
		return []store.Bucket{
			{Key: "{api|global}", Limit: lim, Cost: 1}, // a ceiling all share
			{Key: org, Limit: lim, Cost: 1},
			{Key: org + fmt.Sprintf("/user=u%d", user%50), Limit: lim, Cost: 1},
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		mu      sync.Mutex
		latency []time.Duration
		noisy   atomic.Int64
		wg      sync.WaitGroup
	)
	decide := func(p []store.Bucket) time.Duration {
		start := time.Now()
		if _, err := s.Decide(context.Background(), p); err != nil {
			b.Error(err)
		}
		return time.Since(start)
	}
	// paced calls fn every interval, each call in its own goroutine.
	paced := func(interval time.Duration, fn func(i int)) {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			wg.Add(1)
			go func() { defer wg.Done(); fn(i) }()
		}
	}
	switch load {
	case "noisy=20x": // 4,000/s: four every millisecond
		wg.Add(1)
		go paced(time.Millisecond, func(i int) {
			for j := range 4 {
				decide(path("noisy", 4*i+j))
				noisy.Add(1)
			}
		})
	case "flood=256":
		for range 256 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					decide(path("noisy", i))
					noisy.Add(1)
				}
			}()
		}
	}
	for q := range 8 {
		wg.Add(1)
		go paced(5*time.Millisecond, func(i int) {
			took := decide(path(fmt.Sprintf("quiet%d", q), i))
			mu.Lock()
			latency = append(latency, took)
			mu.Unlock()
		})
	}
	wg.Wait()
	return latency, noisy.Load()
}
