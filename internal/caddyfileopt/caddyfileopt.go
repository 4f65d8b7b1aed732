// Package caddyfileopt reads the arguments of Caddyfile options and
// explains an option a block does not take: the pieces every Cascade
// Caddyfile parser shares, so that each says the same thing the same way.
package caddyfileopt

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// OneOf reads the option's one argument, which must be one of allowed.
func OneOf(d *caddyfile.Dispenser, allowed ...string) (string, error) {
	opt := d.Val()
	if !d.NextArg() {
		return "", d.Errf("%s needs one of: %s", opt, strings.Join(allowed, ", "))
	}
	for _, a := range allowed {
		if d.Val() == a {
			if d.NextArg() {
				return "", d.Errf("%s: unexpected argument %q", opt, d.Val())
			}
			return a, nil
		}
	}
	return "", d.Errf("%s %q: use one of %s", opt, d.Val(), strings.Join(allowed, ", "))
}

// Int reads the option's argument as a non-negative whole number.
func Int(d *caddyfile.Dispenser) (int, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.Errf("%s needs a number", opt)
	}
	n, err := strconv.Atoi(d.Val())
	if err != nil || n < 0 {
		return 0, d.Errf("%s %q: use a non-negative whole number", opt, d.Val())
	}
	return n, nil
}

// Int64 is Int as an int64.
func Int64(d *caddyfile.Dispenser) (int64, error) {
	n, err := Int(d)
	return int64(n), err
}

// Float reads the option's argument as a positive number.
func Float(d *caddyfile.Dispenser) (float64, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.Errf("%s needs a number", opt)
	}
	f, err := strconv.ParseFloat(d.Val(), 64)
	if err != nil || f <= 0 {
		return 0, d.Errf("%s %q: use a positive number", opt, d.Val())
	}
	return f, nil
}

// Size reads the option's argument as a byte size such as 1MB or 512KiB.
func Size(d *caddyfile.Dispenser) (int64, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.Errf("%s needs a size such as 1MiB", opt)
	}
	n, err := humanize.ParseBytes(d.Val())
	if err != nil || n == 0 {
		return 0, d.Errf("%s %q: use a size such as 1MiB or 65536", opt, d.Val())
	}
	return int64(n), nil
}

// Duration reads the option's argument as a positive duration such as 5s,
// of at most max when max is positive.
func Duration(d *caddyfile.Dispenser, max time.Duration) (time.Duration, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.Errf("%s needs a duration such as 5s", opt)
	}
	dur, err := caddy.ParseDuration(d.Val())
	switch {
	case err != nil || dur <= 0:
		return 0, d.Errf("%s %q: use a positive duration such as 5s", opt, d.Val())
	case max > 0 && dur > max:
		return 0, d.Errf("%s %q: use at most %v", opt, d.Val(), max)
	}
	return dur, nil
}

// Str reads the option's argument into dst.
func Str(d *caddyfile.Dispenser, dst *string) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.Errf("%s needs a value", opt)
	}
	*dst = d.Val()
	return nil
}

// Unknown is the error for an option the block where (e.g. "tier org")
// does not take. With a hint (where the option belongs, for a known
// misplacement), it says that; otherwise it suggests the allowed option
// the option looks like a typo of, and lists the allowed ones.
func Unknown(d *caddyfile.Dispenser, where, opt string, allowed []string, hint string) error {
	if hint != "" {
		return d.Errf("%s: %s is not an option here: %s", where, opt, hint)
	}
	msg := fmt.Sprintf("%s: unknown option %q", where, opt)
	if near := Nearest(opt, allowed); near != "" {
		msg += fmt.Sprintf(": did you mean %q?", near)
	}
	return d.Errf("%s (expected %s)", msg, orList(allowed))
}

// Nearest is the allowed option opt is a likely typo of: at most two edits
// away (one for options of four letters or fewer), or "" when none is.
func Nearest(opt string, allowed []string) string {
	best, bestDist := "", 3
	if len(opt) <= 4 {
		bestDist = 2
	}
	for _, a := range allowed {
		if d := editDistance(opt, a); d < bestDist {
			best, bestDist = a, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// orList writes items as "a, b or c".
func orList(items []string) string {
	if len(items) == 1 {
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}
