package engine

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
)

// hiddenResponses is a store that keeps no responses.
type hiddenResponses struct{ store.Store }

// failingResponses is a store whose responses cannot be looked up.
type failingResponses struct{ store.Store }

func (failingResponses) Response(context.Context, string) ([]byte, int64, error) {
	return nil, 0, store.ErrUnavailable
}

func (failingResponses) KeepResponse(context.Context, string, []byte, time.Duration) error {
	return store.ErrUnavailable
}

// replayEngine is an engine with replay on a memory store with a clock:
// alice's requests, 100 a minute.
func replayEngine(t *testing.T, wrap func(store.Store) store.Store) (*Engine, *clock) {
	t.Helper()
	tree := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{
		{Name: "user", Key: "{user}", Limits: []*hierarchy.Limit{{Count: 100, Per: "min"}}},
	}}
	if err := tree.Compile(); err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC).UnixMicro()}
	mem := store.NewMemory(store.MemoryOptions{Clock: c.read, SweepInterval: -1})
	var st store.Store = mem
	if wrap != nil {
		st = wrap(mem)
	}
	e := New(Config{Trees: []*Tree{{Tree: tree}}, Store: st, StoreName: "memory", DenialLog: "off",
		Idempotency: Idempotency{TTL: time.Hour, InFlight: time.Minute, Retries: 10, Replay: true}})
	t.Cleanup(func() { e.Close(); _ = mem.Close() })
	return e, c
}

func replayDecide(t *testing.T, e *Engine, key string) (*Decision, error) {
	t.Helper()
	d := new(Decision)
	e.Begin(d)
	t.Cleanup(d.Release)
	if err := e.Add(d, e.Tree("api"), []string{"alice"}); err != nil {
		t.Fatal(err)
	}
	return d, e.Decide(context.Background(), d, Request{Idempotency: key})
}

// TestReplay: under Idempotency.Replay a first request keeps its response
// and every retry finds it, uncharged; a forgotten record (a server
// error) or one given back makes a retry a new attempt; a record whose
// request never said how it ended (a crash), or whose response could not
// be kept, refuses retries as in flight until InFlight, then is a new
// attempt.
func TestReplay(t *testing.T) {
	ctx := context.Background()
	remaining := func(t *testing.T, e *Engine) int64 {
		t.Helper()
		d, err := replayDecide(t, e, "")
		if err != nil || !d.Allowed {
			t.Fatalf("a request without a key: %v allowed %v", err, d.Allowed)
		}
		return d.Results[0].Remaining
	}
	for _, tt := range []struct {
		name string
		end  func(*Decision) // how the first request ends
		// What a retry is at once, and after InFlight (a new attempt keeps
		// its response: its retries are replayed): "replayed",
		// "in_flight" or "new".
		retry, later string
	}{
		{"kept", func(d *Decision) { d.Keep(ctx, []byte("the response")); d.Done(ctx) }, "replayed", "replayed"},
		{"forgotten", func(d *Decision) { d.Forget(); d.Done(ctx) }, "new", "replayed"},
		{"given back", func(d *Decision) { d.Refund(ctx) }, "new", "replayed"},
		{"crashed", func(*Decision) {}, "in_flight", "new"},
		{"done without its response", func(d *Decision) { d.Done(ctx) }, "in_flight", "new"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, c := replayEngine(t, nil)
			first, err := replayDecide(t, e, "POST /charges\nk1")
			if err != nil || !first.Allowed || first.Replayed || !first.KeepsResponse() {
				t.Fatalf("the first: %v allowed %v replayed %v keeps %v", err, first.Allowed, first.Replayed, first.KeepsResponse())
			}
			tt.end(first)
			check := func(want string) {
				t.Helper()
				before := remaining(t, e)
				d, err := replayDecide(t, e, "POST /charges\nk1")
				if err != nil {
					t.Fatal(err)
				}
				got := "new"
				switch {
				case d.Replayed && d.Allowed:
					got = "replayed"
					if !bytes.Equal(d.Response, []byte("the response")) || d.KeepsResponse() {
						t.Fatalf("replayed %q keeps %v, want the kept response", d.Response, d.KeepsResponse())
					}
				case d.Reason == ReasonInFlight && !d.Allowed:
					got = "in_flight"
				case !d.Allowed || d.Replayed || !d.KeepsResponse():
					t.Fatalf("a retry: allowed %v replayed %v reason %s keeps %v", d.Allowed, d.Replayed, d.Reason, d.KeepsResponse())
				}
				if got != want {
					t.Fatalf("a retry: %s, want %s", got, want)
				}
				charged := before - 1 - remaining(t, e) // the remaining call itself costs 1
				if wantCharged := int64(map[bool]int{true: 1}[want == "new"]); charged != wantCharged {
					t.Fatalf("a %s retry was charged %d, want %d", want, charged, wantCharged)
				}
				if want == "new" {
					d.Keep(ctx, []byte("the response")) // a new attempt is the first again
				}
			}
			check(tt.retry)
			c.now += (time.Minute + time.Second).Microseconds()
			check(tt.later)
		})
	}
}

// TestReplayNeedsResponses: replay refuses a store that keeps no
// responses; a lookup the store fails is the store's failure (its
// policy applies), not a new attempt.
func TestReplayNeedsResponses(t *testing.T) {
	e, _ := replayEngine(t, func(s store.Store) store.Store { return hiddenResponses{s} })
	if err := e.CheckReplay(); err == nil {
		t.Fatal("CheckReplay accepted a store that keeps no responses")
	}
	e, _ = replayEngine(t, func(s store.Store) store.Store { return failingResponses{s} })
	if err := e.CheckReplay(); err != nil {
		t.Fatal(err)
	}
	d, err := replayDecide(t, e, "POST /charges\nk1")
	if !errors.Is(err, store.ErrUnavailable) || d.Reason != ReasonStoreError || d.Allowed {
		t.Fatalf("a lookup that failed: %v reason %s allowed %v, want the store's error", err, d.Reason, d.Allowed)
	}
}

// TestReplayFreeThenCharged: a kept response is answered free Retries
// times; after that a retry that finds it is charged as any request, and
// answered with it when admitted.
func TestReplayFreeThenCharged(t *testing.T) {
	ctx := context.Background()
	e, _ := replayEngine(t, nil)
	cfg := e.Config()
	cfg.Idempotency.Retries = 2
	e = New(cfg)
	t.Cleanup(e.Close)
	first, err := replayDecide(t, e, "POST /charges\nk1")
	if err != nil || !first.KeepsResponse() {
		t.Fatalf("the first: %v keeps %v", err, first.KeepsResponse())
	}
	first.Keep(ctx, []byte("the response"))
	left := first.Results[0].Remaining
	for i := range 4 {
		d, err := replayDecide(t, e, "POST /charges\nk1")
		if err != nil || !d.Allowed || !bytes.Equal(d.Response, []byte("the response")) || d.KeepsResponse() {
			t.Fatalf("retry %d: %v allowed %v response %q keeps %v", i+1, err, d.Allowed, d.Response, d.KeepsResponse())
		}
		if free := i < 2; d.Replayed != free || (free && len(d.Results) != 0) {
			t.Fatalf("retry %d: replayed %v, want %v (2 free)", i+1, d.Replayed, free)
		}
		if !d.Replayed {
			left--
			if d.Results[0].Remaining != left {
				t.Fatalf("retry %d, charged: %d left, want %d", i+1, d.Results[0].Remaining, left)
			}
		}
	}
}
