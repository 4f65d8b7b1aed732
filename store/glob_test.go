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

// backtrackingGlob is GlobMatch as it was before it took linear time: a
// recursion on every * that took exponential time on *a*a*a*a*b. It is
// the reference the table and the fuzz target hold GlobMatch to (its
// semantics are the ones TestGlobMatch checks against Redis); budget
// bounds its calls, and false ok says it ran out.
func backtrackingGlob(pattern, key string, budget *int) (match, ok bool) {
	if *budget--; *budget < 0 {
		return false, false
	}
	for len(pattern) > 0 {
		switch pattern[0] {
		case '*':
			for len(pattern) > 1 && pattern[1] == '*' {
				pattern = pattern[1:]
			}
			if len(pattern) == 1 {
				return true, true
			}
			for i := 0; i <= len(key); i++ {
				m, ok := backtrackingGlob(pattern[1:], key[i:], budget)
				if !ok || m {
					return m, ok
				}
			}
			return false, true
		case '?':
			if len(key) == 0 {
				return false, true
			}
		case '[':
			if len(key) == 0 {
				return false, true
			}
			p, m := referenceSet(pattern[1:], key[0])
			if !m {
				return false, true
			}
			pattern, key = p, key[1:]
			continue
		case '\\':
			if len(pattern) > 1 {
				pattern = pattern[1:]
			}
			fallthrough
		default:
			if len(key) == 0 || pattern[0] != key[0] {
				return false, true
			}
		}
		pattern, key = pattern[1:], key[1:]
	}
	return len(key) == 0, true
}

// referenceSet is the set matching backtrackingGlob had (unchanged since).
func referenceSet(pattern string, c byte) (rest string, ok bool) {
	not := len(pattern) > 0 && pattern[0] == '^'
	if not {
		pattern = pattern[1:]
	}
	match := false
	for len(pattern) > 0 && pattern[0] != ']' {
		switch {
		case pattern[0] == '\\' && len(pattern) > 1:
			pattern = pattern[1:]
			match = match || pattern[0] == c
		case len(pattern) > 2 && pattern[1] == '-':
			lo, hi := pattern[0], pattern[2]
			if lo > hi {
				lo, hi = hi, lo
			}
			match = match || lo <= c && c <= hi
			pattern = pattern[2:]
		default:
			match = match || pattern[0] == c
		}
		pattern = pattern[1:]
	}
	if len(pattern) > 0 {
		pattern = pattern[1:]
	}
	return pattern, match != not
}

// globTable is patterns and keys on which GlobMatch must say what the
// backtracking matcher said: Cascade's reset shapes, every element, and
// the edges (empty pattern or key, trailing \, unclosed set, runs of *).
var globTable = []struct{ pattern, key string }{
	{"{api|*}org=acme[#/]*", "{api|org=acme}org=acme#requests.gcra.60000000"},
	{"{api|*}org=acme[#/]*", "{api|org=acme}org=acme/user=ann#requests"},
	{"{api|*}org=acme[#/]*", "{api|org=acmex}org=acmex#requests"},
	{"{api|*}org=acme[#/]*", "{other|org=acme}org=acme#requests"},
	{"{api|*}org=acm?[#/]*", "{api|org=acme}org=acme#r"},
	{"", ""}, {"", "a"}, {"*", ""}, {"**", ""}, {"*", "abc"}, {"a*", "a"}, {"a*", "ba"},
	{"*a", ""}, {"*a", "a"}, {"*a", "ba"}, {"*a", "ab"}, {"a*b", "ab"}, {"a*b", "axxb"},
	{"a*b", "axxbx"}, {"a*b*c", "abbbc"}, {"a*b*c", "acb"}, {"*?", ""}, {"*?", "x"},
	{"?", ""}, {"?", "a"}, {"?", "ab"}, {"a?b", "a/b"}, {"a[*?]b", "a*b"}, {"a[*?]b", "axb"},
	{"a[^/]b", "a/b"}, {"a[^/]b", "a-b"}, {"a[a-c]*", "abz"}, {"a[c-a]*", "ab"},
	{"a\\*b", "a*b"}, {"a\\*b", "axb"}, {"a[\\]]b", "a]b"}, {"a[-]b", "a-b"},
	{"a[b", "ab"}, {"a[b", "a"}, {"[", "x"}, {"[]", "x"}, {"[^]", "x"}, {"[a-", "-"},
	{"\\", "\\"}, {"\\", ""}, {"a\\", "a"}, {"a\\", "a\\"}, {"[\\", "\\"},
	{"*a*a*a*a*b", strings.Repeat("a", 30)}, {"*a*a*a*a*b", strings.Repeat("a", 30) + "b"},
	{"*[ab]*?*\\a", "xxbyya"}, {"a**b**", "ab"}, {"*x*", "yyy"}, {"*x*", "yxy"},
}

// TestGlobMatchAsBefore: GlobMatch gives the backtracking matcher's
// answer on every pattern and key of the table.
func TestGlobMatchAsBefore(t *testing.T) {
	for _, tt := range globTable {
		budget := 1 << 24
		want, ok := backtrackingGlob(tt.pattern, tt.key, &budget)
		if !ok {
			t.Fatalf("the reference ran out of steps on %q, %q", tt.pattern, tt.key)
		}
		if got := store.GlobMatch(tt.pattern, tt.key); got != want {
			t.Errorf("GlobMatch(%q, %q) = %v, the backtracking matcher said %v", tt.pattern, tt.key, got, want)
		}
	}
}

// TestGlobMatchLinear: the pattern a reset message can carry is another
// process's (or, through Pub/Sub, anyone's): *a*a*…*b against a key of
// 110 a's — the backtracking matcher's exponential case — takes at most
// (len(pattern)+1)·(len(key)+1) steps; the backtracking matcher needs more
// than 10⁷ calls for a pattern a third as long.
func TestGlobMatchLinear(t *testing.T) {
	key := strings.Repeat("a", 110)
	pattern := strings.Repeat("*a", 40) + "*b"
	match, steps := store.GlobMatchSteps(pattern, key)
	if match {
		t.Fatalf("%q matched %q", pattern, key)
	}
	if bound := (len(pattern) + 1) * (len(key) + 1); steps > bound {
		t.Fatalf("matching took %d steps, more than (len(pattern)+1)·(len(key)+1) = %d", steps, bound)
	}
	budget := 10_000_000
	if _, ok := backtrackingGlob(strings.Repeat("*a", 13)+"*b", key, &budget); ok {
		t.Fatalf("the backtracking matcher finished within 10⁷ calls: the pattern is not its bad case")
	}
	t.Logf("%d steps for a %d-byte pattern against a %d-byte key", steps, len(pattern), len(key))
}

// FuzzGlobMatch: on any pattern and key GlobMatch says what the
// backtracking matcher says (when it finishes within its budget), within
// (len(pattern)+1)·(len(key)+1) steps.
func FuzzGlobMatch(f *testing.F) {
	for _, tt := range globTable {
		f.Add(tt.pattern, tt.key)
	}
	f.Fuzz(func(t *testing.T, pattern, key string) {
		if len(pattern) > 64 || len(key) > 256 {
			return
		}
		got, steps := store.GlobMatchSteps(pattern, key)
		if bound := (len(pattern) + 1) * (len(key) + 1); steps > bound {
			t.Fatalf("GlobMatch(%q, %q) took %d steps, more than %d", pattern, key, steps, bound)
		}
		budget := 20_000
		if want, ok := backtrackingGlob(pattern, key, &budget); ok && got != want {
			t.Fatalf("GlobMatch(%q, %q) = %v, the backtracking matcher said %v", pattern, key, got, want)
		}
	})
}
