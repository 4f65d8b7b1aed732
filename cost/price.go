package cost

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
)

// This file holds money: exact decimal amounts in micro-units, price lists
// keyed by model name, and what a usage report costs at a price.
//
// Amounts are int64 micro-units (millionths of the money dimension's unit,
// e.g. of a dollar), parsed from their decimal text and never through a
// float, so "0.075" is exactly 75,000 and sums of many small charges do not
// drift.

// microsPerUnit is the number of micro-units in one unit of money, and also
// the number of tokens a price is quoted for (per million tokens).
const microsPerUnit = 1_000_000

// maxAmountFractionDigits is the finest precision ParseAmount accepts: one
// micro-unit.
const maxAmountFractionDigits = 6

// amountError is ParseAmount's error: the input and what is wrong with it.
// Provision reports the reason under the entry's own name.
type amountError struct {
	input, reason string
}

func (e *amountError) Error() string { return fmt.Sprintf("amount %q: %s", e.input, e.reason) }

// ParseAmount parses a non-negative decimal with at most six fractional
// digits ("20", "0.50", "0.075") into micro-units (20_000_000, 500_000,
// 75_000), exactly. Signs, exponents, spaces, an empty string, a point
// without digits on both sides, more than six decimals and values beyond
// the int64 range are errors that name the input.
func ParseAmount(s string) (int64, error) {
	fail := func(reason string) (int64, error) { return 0, &amountError{input: s, reason: reason} }
	if s == "" {
		return fail("empty")
	}
	whole, frac, hasPoint := strings.Cut(s, ".")
	switch {
	case s[0] == '-' || s[0] == '+':
		return fail("a sign is not allowed (amounts are non-negative)")
	case whole == "" || hasPoint && frac == "":
		return fail("needs digits on both sides of the decimal point")
	}
	for _, part := range []string{whole, frac} {
		for i := 0; i < len(part); i++ {
			if part[i] < '0' || part[i] > '9' {
				if (part[i] == 'e' || part[i] == 'E') && i > 0 && '0' <= part[i-1] && part[i-1] <= '9' {
					return fail("exponents are not allowed; write the decimal out")
				}
				return fail(fmt.Sprintf("unexpected %q: only digits and one decimal point are allowed", part[i]))
			}
		}
	}
	if len(frac) > maxAmountFractionDigits {
		return fail("finer than a micro-unit (at most 6 decimal places)")
	}
	var n int64
	for i := 0; i < len(whole); i++ {
		d := int64(whole[i] - '0')
		if n > (math.MaxInt64-d)/10 {
			return fail("too large (the most is 9223372036854.775807)")
		}
		n = n*10 + d
	}
	if n > math.MaxInt64/microsPerUnit {
		return fail("too large (the most is 9223372036854.775807)")
	}
	n *= microsPerUnit
	var f int64
	for i := 0; i < maxAmountFractionDigits; i++ {
		f *= 10
		if i < len(frac) {
			f += int64(frac[i] - '0')
		}
	}
	if n > math.MaxInt64-f {
		return fail("too large (the most is 9223372036854.775807)")
	}
	return n + f, nil
}

// ModelPrice is what one model's tokens cost, per million tokens, in the
// money dimension's unit, as decimals ([ParseAmount]).
type ModelPrice struct {
	// Model is a model name, or a pattern where * matches any run of
	// characters (gpt-4o*, claude-*-sonnet*).
	Model string `json:"model"`
	// Input is the price of 1M input tokens.
	Input string `json:"input"`
	// Output is the price of 1M output tokens.
	Output string `json:"output"`
	// CachedInput is the price of 1M input tokens read from the provider's
	// prompt cache (default Input).
	CachedInput string `json:"cached_input,omitempty"`
	// CacheWrite is the price of 1M input tokens written to the provider's
	// prompt cache (Anthropic's cache_creation_input_tokens; default Input).
	CacheWrite string `json:"cache_write,omitempty"`
}

// Rate is a model's price in micro-units per 1M tokens.
type Rate struct {
	Input, Output, CachedInput, CacheWrite int64
}

// Cost is what usage u costs at r, in micro-units, rounded up:
//
//	((Input − CachedInput − CacheWrite)×r.Input + CachedInput×r.CachedInput
//	  + CacheWrite×r.CacheWrite + Output×r.Output) / 1e6
//
// computed exactly and saturating at math.MaxInt64. Negative counts and
// rates count as 0, CachedInput is capped at Input and CacheWrite at what
// is left of it, and Total and Found are ignored (call it for a report
// that was found).
func (r Rate) Cost(u Usage) int64 {
	in := uint64(max(u.Input, 0))
	cached := min(uint64(max(u.CachedInput, 0)), in)
	written := min(uint64(max(u.CacheWrite, 0)), in-cached)
	out := uint64(max(u.Output, 0))

	// Each product is below 2^126 and the sum of the four below 2^128, so
	// 128 bits hold the exact total before the division.
	var hi, lo uint64
	add := func(tokens uint64, rate int64) {
		h, l := bits.Mul64(tokens, uint64(max(rate, 0)))
		var carry uint64
		lo, carry = bits.Add64(lo, l, 0)
		hi, _ = bits.Add64(hi, h, carry)
	}
	add(in-cached-written, r.Input)
	add(cached, r.CachedInput)
	add(written, r.CacheWrite)
	add(out, r.Output)

	var carry uint64
	lo, carry = bits.Add64(lo, microsPerUnit-1, 0) // round up
	hi += carry
	if hi >= microsPerUnit { // the quotient would not fit 64 bits
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, microsPerUnit)
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// Pricing is a price list: the first entry whose Model matches a model's
// name prices it, an entry naming the model exactly before any pattern.
//
// Call Provision before Lookup; a provisioned Pricing is read-only and safe
// for concurrent use.
type Pricing struct {
	Prices []ModelPrice `json:"prices,omitempty"`
	// Default prices any model no entry matches (its Model is ignored);
	// nil: such a model has no price.
	Default *ModelPrice `json:"default,omitempty"`

	exact      map[string]Rate
	patterns   []ratePattern
	defaultFor Rate
	hasDefault bool
}

// ratePattern is a provisioned entry whose Model holds a '*'.
type ratePattern struct {
	pattern string
	rate    Rate
}

// Provision parses every amount and validates the list: a Model must be
// non-empty and use only letters, digits, . - _ : / @ and *; no Model may
// appear twice; every entry needs Input and Output. Errors name the entry
// and the amount (`price gpt-4o: input "x": ...`).
func (p *Pricing) Provision() error {
	exact := make(map[string]Rate)
	var patterns []ratePattern
	seen := make(map[string]bool, len(p.Prices))
	for i, mp := range p.Prices {
		if err := validModelPattern(mp.Model); err != nil {
			return fmt.Errorf("price #%d: %w", i+1, err)
		}
		if seen[mp.Model] {
			return fmt.Errorf("price %s: listed twice", mp.Model)
		}
		seen[mp.Model] = true
		rate, err := mp.rate()
		if err != nil {
			return fmt.Errorf("price %s: %w", mp.Model, err)
		}
		if strings.Contains(mp.Model, "*") {
			patterns = append(patterns, ratePattern{pattern: mp.Model, rate: rate})
		} else {
			exact[mp.Model] = rate
		}
	}
	var def Rate
	if p.Default != nil {
		var err error
		if def, err = p.Default.rate(); err != nil {
			return fmt.Errorf("price default: %w", err)
		}
	}
	p.exact, p.patterns, p.defaultFor, p.hasDefault = exact, patterns, def, p.Default != nil
	return nil
}

// rate parses the entry's amounts.
func (mp ModelPrice) rate() (Rate, error) {
	parse := func(field, s string) (int64, error) {
		if s == "" {
			return 0, fmt.Errorf("%s: missing (the price of 1M %s tokens)", field, strings.ReplaceAll(field, "_", " "))
		}
		n, err := ParseAmount(s)
		if ae, ok := errors.AsType[*amountError](err); ok {
			return 0, fmt.Errorf("%s %q: %s", field, s, ae.reason)
		}
		return n, err
	}
	var r Rate
	var err error
	if r.Input, err = parse("input", mp.Input); err != nil {
		return Rate{}, err
	}
	if r.Output, err = parse("output", mp.Output); err != nil {
		return Rate{}, err
	}
	r.CachedInput, r.CacheWrite = r.Input, r.Input
	if mp.CachedInput != "" {
		if r.CachedInput, err = parse("cached_input", mp.CachedInput); err != nil {
			return Rate{}, err
		}
	}
	if mp.CacheWrite != "" {
		if r.CacheWrite, err = parse("cache_write", mp.CacheWrite); err != nil {
			return Rate{}, err
		}
	}
	return r, nil
}

// validModelPattern accepts a model name or pattern: non-empty, ASCII
// letters, digits, . - _ : / @ and *.
func validModelPattern(m string) error {
	if m == "" {
		return errors.New("model is empty")
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte(".-_:/@*", c) >= 0:
		default:
			return fmt.Errorf("model %q: %q is not allowed (letters, digits, . - _ : / @ and * only)", m, c)
		}
	}
	return nil
}

// Lookup returns the price of model: the entry naming it exactly, else the
// first pattern that matches it, else Default. ok is false when nothing
// prices it (or Provision was not called). It does not allocate.
func (p *Pricing) Lookup(model string) (rate Rate, ok bool) {
	if r, ok := p.exact[model]; ok {
		return r, true
	}
	for _, e := range p.patterns {
		if matchGlob(e.pattern, model) {
			return e.rate, true
		}
	}
	return p.defaultFor, p.hasDefault
}

// matchGlob reports whether name matches pattern, where '*' matches any
// run of bytes (empty included) and every other byte matches itself.
//
// Not path.Match: it stops '*' at '/', which model names contain
// ("accounts/fireworks/models/llama-*"), and gives '[', '\\' and '?'
// meanings a price list should not have. This is the classic greedy matcher
// that, on a mismatch, backtracks only to the last '*': O(len(pattern) ×
// len(name)) at worst, linear for the usual one or two stars, and no
// allocation.
func matchGlob(pattern, name string) bool {
	p, n := 0, 0
	star, retry := -1, 0 // the last '*' seen in pattern, and where in name it resumes
	for n < len(name) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, retry = p, n
			p++
		case p < len(pattern) && pattern[p] == name[n]:
			p++
			n++
		case star >= 0:
			// Let the last star swallow one more byte and try again.
			retry++
			p, n = star+1, retry
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
