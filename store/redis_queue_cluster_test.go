package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/rate"
)

// TestClusterCeilingIsNotATenant: on a Cluster, a path with a global
// ceiling is decided by two script calls (the tenant's slot, then the
// ceiling's). Two tenants with one decision each, tenant_in_flight 1: no
// tenant is over its cap, so neither may be shed.
func TestClusterCeilingIsNotATenant(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s, err := NewRedis(context.Background(), RedisOptions{
		Addrs: c.Addrs(), Cluster: true, KeyPrefix: fmt.Sprintf("ceiling%d:", time.Now().UnixNano()),
		Timeout: testCallTimeout, TenantInFlight: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lim := rate.Limit{Algorithm: rate.GCRA, Count: 1000, Period: time.Hour}
	path := func(org string) []Bucket {
		return []Bucket{
			{Key: "{api|global=all}global=all#1", Limit: lim, Cost: 1},
			{Key: "{api|org=" + org + "}org=" + org + "#1", Limit: lim, Cost: 1},
		}
	}
	for _, org := range []string{"a", "b"} { // scripts loaded, slot map warm
		if _, err := s.Decide(context.Background(), path(org)); err != nil {
			t.Fatal(err)
		}
	}
	_ = s.Client().(*redis.ClusterClient).ForEachShard(context.Background(), func(_ context.Context, n *redis.Client) error {
		n.AddHook(latency(100 * time.Millisecond))
		return nil
	})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, org := range []string{"a", "b"} {
		wg.Add(1)
		go func() { defer wg.Done(); _, errs[i] = s.Decide(context.Background(), path(org)) }()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("tenant %s, its only decision: %v", []string{"a", "b"}[i], err)
		}
	}
}
