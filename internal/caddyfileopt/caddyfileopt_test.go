package caddyfileopt

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

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

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		input string
		max   time.Duration
		want  time.Duration
		err   string
	}{
		{"timeout 5s", 0, 5 * time.Second, ""},
		{"retry_within 1m", time.Minute, time.Minute, ""},
		{"retry_within 61s", time.Minute, 0, `retry_within "61s": use at most 1m0s`},
		{"timeout 0s", 0, 0, `timeout "0s": use a positive duration`},
		{"timeout -1s", 0, 0, "use a positive duration"},
		{"timeout soon", 0, 0, "use a positive duration"},
		{"timeout", 0, 0, "timeout needs a duration"},
	} {
		d := caddyfile.NewTestDispenser(tc.input)
		d.Next()
		got, err := Duration(d, tc.max)
		if tc.err == "" && (err != nil || got != tc.want) || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %v, %v; want %v, an error with %q", tc.input, got, err, tc.want, tc.err)
		}
	}
}
