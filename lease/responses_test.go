package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/lease"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/store/storetest"
)

// TestLeaseResponsesConformance: a lease store keeps responses in the
// store it wraps, memory or Redis, as that store would.
func TestLeaseResponsesConformance(t *testing.T) {
	inners := []struct {
		name string
		open func(t *testing.T, clock store.Clock) store.Leaser
	}{
		{"memory", func(t *testing.T, clock store.Clock) store.Leaser {
			return store.NewMemory(store.MemoryOptions{Clock: clock, SweepInterval: -1})
		}},
		{"redis", func(t *testing.T, clock store.Clock) store.Leaser {
			r, err := store.NewRedis(context.Background(), store.RedisOptions{Addrs: []string{redistest.Shared(t).Addr()},
				KeyPrefix: fmt.Sprintf("lease:%s:%x:", strings.NewReplacer("/", "_", " ", "_", "{", "", "}", "").Replace(t.Name()), rand.Uint32()),
				Clock:     clock, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}},
	}
	for _, in := range inners {
		t.Run(in.name, func(t *testing.T) {
			storetest.RunResponses(t, func(t *testing.T, clock store.Clock) store.Store {
				ls, err := lease.New(in.open(t, clock), lease.Options{Clock: clock, Sweep: -1})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ls.Close() }) // closes the inner store too
				return ls
			})
		})
	}
}

// leaserOnly is a Leaser that keeps no responses.
type leaserOnly struct{ store.Leaser }

// TestLeaseResponsesNeedTheInnerStores: over a store that keeps no
// responses, a lease store's calls fail, saying so.
func TestLeaseResponsesNeedTheInnerStores(t *testing.T) {
	ls, err := lease.New(leaserOnly{store.NewMemory(store.MemoryOptions{SweepInterval: -1})}, lease.Options{Sweep: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	ctx := context.Background()
	if err := ls.KeepResponse(ctx, "{k}", []byte("x"), time.Minute); err == nil {
		t.Error("KeepResponse over a store without responses: no error")
	}
	if got, _, err := ls.Response(ctx, "{k}"); err == nil || got != nil {
		t.Errorf("Response over a store without responses: %q, %v; want an error", got, err)
	}
}
