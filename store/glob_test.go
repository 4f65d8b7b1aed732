package store_test

import (
	"strings"
	"testing"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
)

// TestGlobMatch checks GlobMatch against a real Redis's own matching
// (SCAN's MATCH uses the same code as KEYS), on patterns of the forms
// Cascade's resets use and a few more.
func TestGlobMatch(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	p := prefix(t)
	keys := []string{
		"{api|org=acme}org=acme#requests.gcra.60000000",
		"{api|org=acme}org=acme/user=ann#requests.gcra.60000000",
		"{api|org=acme}org=acme/user=ann/agent=x#requests.gcra.60000000",
		"{api|org=acmex}org=acmex#requests.gcra.60000000",
		"{api|org=acme}org=acmex/user=bob#requests.gcra.60000000",
		"{other|org=acme}org=acme#requests.gcra.60000000",
		"a/b", "a*b", "a?b", "abc", "ab", "a]b", "a-b", "",
	}
	for _, k := range keys {
		if _, err := redistest.Do(addr, "SET", p+k, "1"); err != nil {
			t.Fatal(err)
		}
	}
	for _, pattern := range []string{
		"{api|*}org=acme[#/]*", "{api|*}org=acme/user=ann[#/]*", "{api|*}org=acm?[#/]*",
		"*", "a*", "a?b", "a[*?]b", "a[^/]b", "a[a-c]*", "a[c-a]*", "a\\*b", "a[\\]]b", "a[-]b", "ab*", "?", "a[b",
	} {
		got, err := redistest.Do(addr, "KEYS", p+pattern)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{}
		for _, k := range splitLines(got) {
			want[k[len(p):]] = true
		}
		for _, k := range keys {
			if GlobMatch := store.GlobMatch(pattern, k); GlobMatch != want[k] {
				t.Errorf("GlobMatch(%q, %q) = %v, Redis says %v", pattern, k, GlobMatch, want[k])
			}
		}
	}
}

func splitLines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
