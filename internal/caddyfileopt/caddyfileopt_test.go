package caddyfileopt

import "testing"

// TestEditDistance: the distance behind the suggestions.
func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"a", "", 1}, {"mising", "missing", 1}, {"adress", "address", 1},
		{"tear", "tier", 2}, {"kitten", "sitting", 3}, {"limit", "limit", 0},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestNearest: a typo finds its option; a short word needs to be within
// one edit; nothing near finds nothing.
func TestNearest(t *testing.T) {
	allowed := []string{"tier", "match", "missing", "address"}
	for opt, want := range map[string]string{"mising": "missing", "adress": "address", "tie": "tier", "tear": "", "frobnicate": "", "mach": "match"} {
		if got := Nearest(opt, allowed); got != want {
			t.Errorf("Nearest(%q) = %q, want %q", opt, got, want)
		}
	}
}
