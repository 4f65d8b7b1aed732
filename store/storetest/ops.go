package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/store"
)

// RunOps runs the conformance suite of the operator's operations (Peek,
// Reset, ResetMatching) against the stores open makes: peeking charges
// nothing and reports what a decision would, a reset makes buckets full, a
// subtree reset deletes the subtree and nothing else. Paths span two hash
// tags, as a global ceiling and a tenant's subtree do.
func RunOps(t *testing.T, open Opener) {
	ctx := context.Background()
	ceiling, perOrg, perUser := gcra(100, time.Minute, 0), gcra(20, time.Minute, 0), gcra(10, time.Minute, 0)
	log := sliding(5, time.Minute)
	path := func(tenant, user string) []store.Bucket {
		return []store.Bucket{
			{Key: "{ops|all=*}all=*#r", Limit: ceiling, Cost: 1},
			{Key: "{ops|org=" + tenant + "}all=*/org=" + tenant + "#r", Limit: perOrg, Cost: 1},
			{Key: "{ops|org=" + tenant + "}all=*/org=" + tenant + "/user=" + user + "#r", Limit: perUser, Cost: 1},
			{Key: "{ops|org=" + tenant + "}all=*/org=" + tenant + "/user=" + user + "#l", Limit: log, Cost: 1},
		}
	}
	decide := func(t *testing.T, s store.Store, buckets []store.Bucket, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if d, err := s.Decide(ctx, buckets); err != nil || !d.Allowed {
				t.Fatalf("decision %d: allowed %v, err %v", i, d.Allowed, err)
			}
		}
	}
	remaining := func(t *testing.T, s store.Store, buckets []store.Bucket) []int64 {
		t.Helper()
		d, err := store.Peek(ctx, s, buckets)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]int64, len(d.Results))
		for i, r := range d.Results {
			out[i] = r.Remaining
		}
		return out
	}
	equal := func(t *testing.T, what string, got, want []int64) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: %v, want %v", what, got, want)
			}
		}
	}

	t.Run("peek charges nothing", func(t *testing.T) {
		clock := NewClock(start)
		s := open(t, clock.Now)
		alice := path("acme", "alice")
		decide(t, s, alice, 3)
		for i := 0; i < 3; i++ {
			equal(t, "peek", remaining(t, s, alice), []int64{97, 17, 7, 2})
		}
		// Peeking a cost that does not fit says when it would.
		big := append([]store.Bucket(nil), alice...)
		for i := range big {
			big[i].Cost = 3
		}
		d, err := store.Peek(ctx, s, big)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed || d.Results[3].Allowed || !d.Results[2].Allowed || d.Results[3].RetryAfter <= 0 {
			t.Fatalf("peek of cost 3: %+v", d)
		}
		// The next real decisions see the buckets as the first three left them.
		decide(t, s, alice, 2)
		equal(t, "after two more", remaining(t, s, alice), []int64{95, 15, 5, 0})
		if d, _ := s.Decide(ctx, alice); d.Allowed {
			t.Fatal("a sixth request passed a sliding window of 5")
		}
	})

	t.Run("reset", func(t *testing.T) {
		clock := NewClock(start)
		s := open(t, clock.Now)
		r := s.(store.Resetter)
		alice, bob, other := path("acme", "alice"), path("acme", "bob"), path("zeta", "carol")
		decide(t, s, alice, 5)
		decide(t, s, bob, 1)
		decide(t, s, other, 1)
		// alice's own buckets only: the org and the ceiling keep their count.
		n, err := r.Reset(ctx, []string{alice[2].Key, alice[3].Key})
		if err != nil || n != 2 {
			t.Fatalf("Reset: %d, %v; want 2", n, err)
		}
		equal(t, "alice reset", remaining(t, s, alice), []int64{93, 14, 10, 5})
		if n, err := r.Reset(ctx, []string{alice[2].Key}); err != nil || n != 0 {
			t.Fatalf("Reset of a full bucket: %d, %v; want 0", n, err)
		}
		decide(t, s, alice, 5) // the log was reset with its bucket: five fit again
		if d, _ := s.Decide(ctx, alice); d.Allowed {
			t.Fatal("a sixth request passed the reset sliding window")
		}
		// The subtree of org acme: its bucket, alice's and bob's; not the
		// ceiling above it, nor another org.
		org := "all=*/org=acme"
		n, err = r.ResetMatching(ctx, store.KeyMatch{
			Glob: "{ops|*}" + org + "[#/]*",
			Match: func(k string) bool {
				_, rest, ok := strings.Cut(k, "}")
				return ok && strings.HasPrefix(k, "{ops|") && strings.HasPrefix(rest, org) &&
					len(rest) > len(org) && (rest[len(org)] == '#' || rest[len(org)] == '/')
			},
		})
		if err != nil || n != 5 {
			t.Fatalf("ResetMatching: %d, %v; want 5 (org, alice's two, bob's two)", n, err)
		}
		equal(t, "alice after the org's reset", remaining(t, s, alice), []int64{88, 20, 10, 5})
		equal(t, "bob after the org's reset", remaining(t, s, bob), []int64{88, 20, 10, 5})
		equal(t, "another org", remaining(t, s, other), []int64{88, 19, 9, 4})
	})
}
