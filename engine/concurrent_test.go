package engine

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
)

// TestConcurrencySlots: a concurrency limit takes one slot per admitted
// request whatever its cost, all or nothing with the path's other limits;
// Done gives it back once however often it is called; a refund (charge_on,
// a reservation given back) leaves the slot to Done; a reconciled cost
// never touches it; a refused request holds none.
func TestConcurrencySlots(t *testing.T) {
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{
			{Count: 100, Per: "min", Dimension: "tokens"},
			{Count: 2, Algorithm: "concurrent"},
		}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	e := New(Config{Trees: []*Tree{{Tree: tree}}, Dimensions: []string{"tokens"}, Store: mem, StoreName: "memory", DenialLog: "off"})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	ctx := context.Background()
	decide := func(tokens int64) *Decision {
		t.Helper()
		d := new(Decision)
		e.Begin(d)
		if err := e.Add(d, e.Tree("api"), []string{"ann"}); err != nil {
			t.Fatal(err)
		}
		if err := e.Decide(ctx, d, Request{Estimates: []int64{tokens}}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	slotsLeft := func() int64 {
		t.Helper()
		d := decide(0) // looks at the tokens, takes a slot: given back at once
		defer d.Done(ctx)
		if !d.Allowed {
			return 0
		}
		return d.Results[1].Remaining + 1
	}

	a := decide(10)
	b := decide(10)
	if !a.Allowed || !b.Allowed || !a.NeedsDone() || a.Limits[1].Cost != 1 || a.Costs[1] != 1 {
		t.Fatalf("two requests of 10 tokens on 2 slots: %v %v, slot cost %d", a.Allowed, b.Allowed, a.Limits[1].Cost)
	}
	if a.Limits[1].Holder == b.Limits[1].Holder || a.Limits[1].Holder == 0 {
		t.Fatalf("holders %d and %d: want distinct, non-zero", a.Limits[1].Holder, b.Limits[1].Holder)
	}
	third := decide(10)
	if third.Allowed || third.NeedsDone() || third.Blocked != "api/user" || third.Retry != time.Second {
		t.Fatalf("a third in flight: allowed %v, blocked %q, retry %v; want refused by the slots, retry 1s", third.Allowed, third.Blocked, third.Retry)
	}
	if third.Results[0].Remaining != 80 {
		t.Fatalf("the refused third charged tokens: %d left, want 80", third.Results[0].Remaining)
	}
	// A refund gives the tokens back, not the slot.
	if err := a.Refund(ctx); err != nil {
		t.Fatal(err)
	}
	if n := slotsLeft(); n != 0 {
		t.Fatalf("a refund gave a slot back: %d free", n)
	}
	// A reconciled cost touches the tokens only.
	b.Reconcile(Usage{Dimension: "tokens", Actual: 0})
	e.Close() // waits for the reconciliation
	if n := slotsLeft(); n != 0 {
		t.Fatalf("a reconciliation gave a slot back: %d free", n)
	}
	if err := a.Done(ctx); err != nil {
		t.Fatal(err)
	}
	if a.NeedsDone() {
		t.Fatal("a decision still holds its slot after Done")
	}
	if err := a.Done(ctx); err != nil { // twice is once
		t.Fatal(err)
	}
	if n := slotsLeft(); n != 1 {
		t.Fatalf("after one Done (called twice): %d slots free, want 1", n)
	}
	b.Done(ctx)
	if n := slotsLeft(); n != 2 {
		t.Fatalf("after both are done: %d slots free, want 2", n)
	}
	if d := decide(1000); d.Allowed || d.NeedsDone() || !d.Impossible {
		t.Fatal("an impossible cost took a slot")
	}
	if n := slotsLeft(); n != 2 {
		t.Fatalf("after an impossible request: %d slots free, want 2", n)
	}
}

// TestConcurrencyMixedModes: when only a tree in shadow mode refuses, the
// enforcing tree is decided again alone and takes a slot: Done gives it
// back (requests one at a time never run out of slots).
func TestConcurrencyMixedModes(t *testing.T) {
	enf := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 2, Algorithm: "concurrent"}}},
	}}
	sh := &hierarchy.Tree{Name: "trial", Tiers: []*hierarchy.Tier{
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 1, Per: "h"}}},
	}}
	for _, tr := range []*hierarchy.Tree{enf, sh} {
		if err := tr.Compile(); err != nil {
			t.Fatal(err)
		}
	}
	c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	shadowTree := &Tree{Tree: sh}
	mode := Shadow
	shadowTree.mode.Store(&mode)
	e := New(Config{Trees: []*Tree{{Tree: enf}, shadowTree}, Store: mem, StoreName: "memory", DenialLog: "off", Mode: Enforce})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	ctx := context.Background()
	for i := range 4 {
		d := new(Decision)
		e.Begin(d)
		for _, name := range []string{"api", "trial"} {
			if err := e.Add(d, e.Tree(name), []string{"ann"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Decide(ctx, d, Request{}); err != nil {
			t.Fatal(err)
		}
		t.Logf("request %d: allowed %v, holds slots %v", i+1, d.Allowed, d.NeedsDone())
		if !d.Allowed {
			t.Fatalf("request %d, sequential (each Done before the next), refused by %s: slots leaked", i+1, d.Blocked)
		}
		d.Done(ctx) // the response ended
	}
}

// TestConcurrencyRefusalsAreNoStrikes: refusals for want of a slot do not
// count towards a penalty box: a client that retries after Retry-After: 1
// while its long request runs is not boxed.
func TestConcurrencyRefusalsAreNoStrikes(t *testing.T) {
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 1000, Per: "min"}, {Count: 1, Algorithm: "concurrent"}},
			Penalty: &hierarchy.Penalty{For: "10m", After: 3, Within: "1m"}},
	}}
	e, c := penaltyEngine(t, nil, []*hierarchy.Tree{tree})
	ctx := context.Background()
	long := decideUsers(t, e, [2]string{"api", "ann"}) // one long request in flight
	for i := range 3 {
		c.now += int64(time.Second / time.Microsecond) // retries after Retry-After: 1
		d := decideUsers(t, e, [2]string{"api", "ann"})
		t.Logf("retry %d: allowed %v reason %s retry %v", i+1, d.Allowed, d.Reason, d.Retry)
	}
	long.Done(ctx) // the long request ends
	c.now += int64(time.Second / time.Microsecond)
	d := decideUsers(t, e, [2]string{"api", "ann"})
	if !d.Allowed {
		t.Fatalf("no request in flight, yet refused: %s, retry %v", d.Reason, d.Retry)
	}
}

// TestReplayRefusedForSlotNotCounted: a retry of an ended request is let
// through without a charge, but still needs a concurrency slot; refused
// for want of one, it is not one of its record's retries: with one retry
// allowed, the retry after the slot came back is still replayed (not
// charged as a new request).
func TestReplayRefusedForSlotNotCounted(t *testing.T) {
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{
			{Count: 100, Per: "min"},
			{Count: 1, Algorithm: "concurrent"},
		}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	e := New(Config{Trees: []*Tree{{Tree: tree}}, Store: mem, StoreName: "memory", DenialLog: "off",
		Idempotency: Idempotency{TTL: time.Hour, InFlight: time.Minute, Retries: 1}})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	ctx := context.Background()
	decide := func(key string) *Decision {
		t.Helper()
		d := new(Decision)
		e.Begin(d)
		if err := e.Add(d, e.Tree("api"), []string{"ann"}); err != nil {
			t.Fatal(err)
		}
		if err := e.Decide(ctx, d, Request{Idempotency: key}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	first := decide("k")
	if !first.Allowed || first.Replayed {
		t.Fatalf("first request: allowed %v replayed %v", first.Allowed, first.Replayed)
	}
	first.Done(ctx)
	other := decide("") // takes the only slot
	if !other.Allowed {
		t.Fatal("another request refused")
	}
	if retry := decide("k"); retry.Allowed || retry.Replayed {
		t.Fatalf("a retry while the slot is taken: allowed %v replayed %v, want refused", retry.Allowed, retry.Replayed)
	}
	other.Done(ctx)
	retry := decide("k")
	if !retry.Allowed || !retry.Replayed {
		t.Fatalf("the retry once the slot is back: allowed %v replayed %v, want replayed (the refused one was not counted)", retry.Allowed, retry.Replayed)
	}
	retry.Done(ctx)
	if again := decide("k"); !again.Allowed || again.Replayed {
		t.Fatalf("the next: allowed %v replayed %v, want a new request (its one retry used)", again.Allowed, again.Replayed)
	}
}
