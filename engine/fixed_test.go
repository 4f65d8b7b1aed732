package engine

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
)

// TestFixedWindow: "3/10m fixed" admits three requests in each ten minutes
// counted from the Unix epoch (:00, :10, :20 …), whenever the first comes,
// and its reset is the window's end.
func TestFixedWindow(t *testing.T) {
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "key", Key: "{key}", Limits: []*hierarchy.Limit{{Count: 3, Per: "10m", Algorithm: hierarchy.Fixed}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	hierarchy.QualifyPolicies([]*hierarchy.Tree{tree})
	start := time.Date(2026, 11, 25, 12, 7, 30, 0, time.UTC) // 2m30s before the window ends at 12:10
	c := &clock{now: start.UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	e := New(Config{Trees: []*Tree{{Tree: tree}}, Store: mem, StoreName: "memory", DenialLog: "off"})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	try := func() *Decision {
		t.Helper()
		d := new(Decision)
		e.Begin(d)
		if err := e.Add(d, e.Tree("api"), append(d.Values(), "k")); err != nil {
			t.Fatal(err)
		}
		if err := e.Decide(context.Background(), d, Request{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.Release)
		return d
	}
	for i := range 3 {
		if d := try(); !d.Allowed {
			t.Fatalf("request %d of the window refused", i+1)
		}
	}
	d := try()
	if d.Allowed {
		t.Fatal("the fourth request of the window admitted")
	}
	if want := 150 * time.Second; d.RetryAfter < want-time.Second || d.RetryAfter > want {
		t.Fatalf("retry after %v, want the window's end, %v away", d.RetryAfter, want)
	}
	c.now = time.Date(2026, 11, 25, 12, 9, 59, 999_999_000, time.UTC).UnixMicro()
	if try().Allowed {
		t.Fatal("admitted a microsecond before the window's end")
	}
	// A mark (an alert's, once a window) is claimed once in each window.
	for i, want := range []bool{true, false} {
		if got, err := d.Mark(context.Background(), 0, "80"); err != nil || got != want {
			t.Fatalf("mark %d in the first window: %v, %v; want %v", i+1, got, err, want)
		}
	}
	c.now = time.Date(2026, 11, 25, 12, 10, 0, 0, time.UTC).UnixMicro()
	for i := range 3 {
		if d := try(); !d.Allowed {
			t.Fatalf("request %d of the next window refused", i+1)
		}
	}
	if got, err := d.Mark(context.Background(), 0, "80"); err != nil || !got {
		t.Fatalf("mark in the next window: %v, %v; want true", got, err)
	}
}
