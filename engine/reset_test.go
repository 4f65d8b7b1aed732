package engine

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
)

// downResetter is a routed store that is down, admin calls included.
type downResetter struct{ downStore }

func (downResetter) Reset(context.Context, []string) (int, error) { return 0, store.ErrUnavailable }
func (downResetter) ResetMatching(context.Context, store.KeyMatch) (int, error) {
	return 0, store.ErrUnavailable
}

// TestResetUnroutedTenantIgnoresOtherStores: resetting an unrouted tenant's
// bucket touches the handler's store only: its buckets live nowhere else,
// and a routed store being down must not fail it.
func TestResetUnroutedTenantIgnoresOtherStores(t *testing.T) {
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "org", Key: "{org}", Limits: []*hierarchy.Limit{{Count: 2, Per: "min"}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	defer mem.Close()
	e := New(Config{
		Trees: []*Tree{{Tree: tree}}, Store: mem, StoreName: "shared", OnError: "deny",
		Routes:    []Route{{Name: "own", Store: downResetter{}, Tenants: map[string]bool{"{api|org=bigco}": true}}},
		DenialLog: "off",
	})
	defer e.Close()
	var d Decision
	e.Begin(&d)
	if err := e.Add(&d, e.Tree("api"), append(d.Values(), "acme")); err != nil {
		t.Fatal(err)
	}
	if err := e.Decide(context.Background(), &d, Request{}); err != nil || !d.Allowed {
		t.Fatalf("acme's first request: %v, allowed %v", err, d.Allowed)
	}
	n, err := e.Reset(context.Background(), e.Tree("api"), []string{"acme"}, false)
	if err != nil || n != 1 {
		t.Fatalf("reset of unrouted org acme with a routed store down: %d buckets, %v; want 1, nil", n, err)
	}
}
