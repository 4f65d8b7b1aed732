package engine

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/caddy-cascade/cascade/hierarchy"
)

func TestFingerprints(t *testing.T) {
	a := NewFingerprints([]byte("0123456789abcdef"), nil, nil)
	b := NewFingerprints(nil, func(context.Context) ([]byte, error) { return []byte("0123456789abcdef"), nil }, nil)
	fp := a.Value("Bearer sk-secret-123")
	if !regexp.MustCompile(`^fp:[0-9a-f]{12}$`).MatchString(fp) || b.Value("Bearer sk-secret-123") != fp {
		t.Fatalf("fingerprints %s and %s under one secret", fp, b.Value("Bearer sk-secret-123"))
	}
	if a.Value("Bearer sk-secret-124") == fp {
		t.Fatal("two values fingerprint alike")
	}
	// A value too long to be escaped in a key fingerprints as its key's
	// hashed form does.
	long := strings.Repeat("k", 100)
	if a.Value(long) != a.Of(hierarchy.Escape(long)) {
		t.Fatal("a long value fingerprints otherwise than its key segment")
	}
	calls := 0
	failing := NewFingerprints(nil, func(context.Context) ([]byte, error) { calls++; return nil, errors.New("down") }, nil)
	if got := failing.Value("x"); got != Unknown {
		t.Fatalf("without the secret: %s, want %s", got, Unknown)
	}
	failing.Value("x")
	if calls != 1 {
		t.Fatalf("the secret was read %d times within a second, want 1", calls)
	}
}

func TestShowError(t *testing.T) {
	tr := &hierarchy.Tree{Name: "llm", Tiers: []*hierarchy.Tier{{Name: "key", Key: "{http.request.header.Authorization}",
		Limits: []*hierarchy.Limit{{Count: 1, Per: "min"}}}}}
	if err := tr.Compile(); err != nil {
		t.Fatal(err)
	}
	e := New(Config{Trees: []*Tree{{Tree: tr}}})
	var plan hierarchy.Plan
	tr.Resolve([]string{"Bearer sk-secret-123"}, &plan)
	cause := errors.New("down")
	err := fmt.Errorf("lease: key %q twice, value %s: %w", plan.Buckets[0].Key, "Bearer sk-secret-123", cause)
	shown := e.ShowError(err, plan.Buckets)
	if strings.Contains(shown.Error(), "sk-secret") || !strings.Contains(shown.Error(), "fp:") || !errors.Is(shown, cause) {
		t.Fatalf("shown: %v", shown)
	}
	if k := e.ShowKey(plan.Buckets[0].Key); strings.Contains(k, "sk-secret") || !strings.HasPrefix(k, "{llm|key=fp:") {
		t.Fatalf("ShowKey: %s", k)
	}
}

// TestShowKeyOfAnotherHandlersTree: two handlers may name a tree alike, one
// keyed on a credential and the other not. The other's engine, asked to
// show the first's key, fingerprints the segments of tiers its own tree
// does not have, and shows its own tiers' values only where they are not
// sensitive.
func TestShowKeyOfAnotherHandlersTree(t *testing.T) {
	tree := func(tier, key string) *hierarchy.Tree {
		tr := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{{Name: tier, Key: key, Limits: []*hierarchy.Limit{{Count: 1, Per: "min"}}}}}
		if err := tr.Compile(); err != nil {
			t.Fatal(err)
		}
		return tr
	}
	secret := tree("key", "{http.request.header.Authorization}")
	open := New(Config{Trees: []*Tree{{Tree: tree("ip", "{http.request.remote.host}")}}, Fingerprints: NewFingerprints([]byte("0123456789abcdef"), nil, nil)})
	var plan hierarchy.Plan
	secret.Resolve([]string{"Bearer sk-secret-123"}, &plan)
	if k := open.ShowKey(plan.Buckets[0].Key); strings.Contains(k, "sk-secret") || !strings.Contains(k, "key=fp:") {
		t.Fatalf("a key of a tier the engine's tree of that name does not have: %s", k)
	}
	var own hierarchy.Plan
	open.Tree("api").Resolve([]string{"10.0.0.1"}, &own)
	if k := open.ShowKey(own.Buckets[0].Key); k != own.Buckets[0].Key {
		t.Fatalf("a key of the engine's own tier, not sensitive: %s, want it as it is (%s)", k, own.Buckets[0].Key)
	}
}
