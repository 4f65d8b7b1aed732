package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
)

// downStore is a store whose every call fails as an unreachable Redis's
// does: what the engine does then is what is under test here (the real
// failure, a stopped redis-server, is the root package's TestStoreRoutes).
type downStore struct{}

func (downStore) Decide(context.Context, []store.Bucket) (store.Decision, error) {
	return store.Decision{}, store.ErrUnavailable
}
func (downStore) Adjust(context.Context, []store.Bucket) error { return store.ErrUnavailable }
func (downStore) Close() error                                 { return nil }

// TestRouteOnError: when a store fails, a path follows the policy of the
// store it lives in — its route's for a routed tenant (else the handler's),
// the handler's for everyone else — and only "local" decides in memory,
// even when another route's "local" gave the engine a memory store.
func TestRouteOnError(t *testing.T) {
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "org", Key: "{org}", Limits: []*hierarchy.Limit{{Count: 10, Per: "min"}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC).UnixMicro()}
	for _, tt := range []struct {
		name                  string
		handler, local, other string // policies: the handler's, route "own"'s, route "inherit"'s
		org                   string
		wantLocal             bool
		wantPolicy            string
	}{
		{"routed local", "deny", "local", "", "bigco", true, ""},
		{"routed, inheriting deny", "deny", "local", "", "midco", false, "deny"},
		{"unrouted, handler deny", "deny", "local", "", "acme", false, "deny"},
		{"unrouted, handler allow", "allow", "local", "", "acme", false, "allow"},
		{"routed deny, handler local", "local", "deny", "", "bigco", false, "deny"},
		{"unrouted, handler local", "local", "deny", "", "acme", true, ""},
		{"routed allow", "deny", "local", "allow", "midco", false, "allow"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
			e := New(Config{
				Trees: []*Tree{{Tree: tree}}, Store: downStore{}, StoreName: "shared", OnError: tt.handler,
				Local: mem, LocalShare: 0.5,
				Routes: []Route{
					{Name: "own", Store: downStore{}, Tenants: map[string]bool{"{api|org=bigco}": true}, OnError: tt.local},
					{Name: "inherit", Store: downStore{}, Tenants: map[string]bool{"{api|org=midco}": true}, OnError: tt.other},
				},
				DenialLog: "off",
			})
			defer func() { e.Close(); _ = mem.Close() }()
			var d Decision
			e.Begin(&d)
			if err := e.Add(&d, e.Tree("api"), append(d.Values(), tt.org)); err != nil {
				t.Fatal(err)
			}
			err := e.Decide(context.Background(), &d, Request{})
			if tt.wantLocal {
				if err != nil || !d.Local || !d.Allowed {
					t.Fatalf("err %v, local %v, allowed %v: want decided in memory", err, d.Local, d.Allowed)
				}
				return
			}
			if !errors.Is(err, store.ErrUnavailable) || d.Local || d.OnStoreError != tt.wantPolicy {
				t.Fatalf("err %v, local %v, policy %q: want the store's error and policy %q", err, d.Local, d.OnStoreError, tt.wantPolicy)
			}
		})
	}
}
