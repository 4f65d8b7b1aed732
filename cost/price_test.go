package cost

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestParseAmount(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string // a substring of the error; "" for success
	}{
		{"20", 20_000_000, ""},
		{"0.50", 500_000, ""},
		{"2.5", 2_500_000, ""},
		{"0.075", 75_000, ""},
		{"1000000", 1_000_000_000_000, ""},
		{"0", 0, ""},
		{"0.000001", 1, ""},
		{"0.000000", 0, ""},
		{"007.10", 7_100_000, ""},
		{"9223372036854.775807", math.MaxInt64, ""},
		{"9223372036854.775808", 0, "too large"},
		{"9223372036855", 0, "too large"},
		{"99999999999999999999999", 0, "too large"},
		{"", 0, "empty"},
		{"-1", 0, "sign"},
		{"+1", 0, "sign"},
		{"1e6", 0, "exponent"},
		{"2.5E1", 0, "exponent"},
		{"0.0000001", 0, "finer than a micro-unit"},
		{"1.", 0, "both sides"},
		{".5", 0, "both sides"},
		{".", 0, "both sides"},
		{"1.2.3", 0, `unexpected '.'`},
		{" 1", 0, `unexpected ' '`},
		{"1,000", 0, `unexpected ','`},
		{"1_000", 0, `unexpected '_'`},
		{"0x10", 0, `unexpected 'x'`},
		{"١", 0, "unexpected"}, // an Arabic-Indic digit is not an ASCII digit
		{"NaN", 0, "unexpected"},
		{"free", 0, `unexpected 'f'`},
		{"1e", 0, "exponent"},
	}
	for _, tt := range tests {
		got, err := ParseAmount(tt.in)
		if tt.wantErr == "" {
			if err != nil || got != tt.want {
				t.Errorf("ParseAmount(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("ParseAmount(%q) = %d, want an error", tt.in, got)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tt.wantErr) || !strings.Contains(msg, fmt.Sprintf("%q", tt.in)) {
			t.Errorf("ParseAmount(%q): error %q should name the input and say %q", tt.in, msg, tt.wantErr)
		}
	}
}

func FuzzParseAmount(f *testing.F) {
	for _, s := range []string{"20", "0.50", "0.075", "9223372036854.775807", "1e6", "-1", ".5", "0.0000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseAmount(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("%q: negative %d", s, n)
		}
		// Accepted amounts round-trip through their canonical form.
		canon := fmt.Sprintf("%d.%06d", n/microsPerUnit, n%microsPerUnit)
		if m, err := ParseAmount(canon); err != nil || m != n {
			t.Fatalf("%q → %d → %q → %d, %v", s, n, canon, m, err)
		}
	})
}

func TestRateCost(t *testing.T) {
	const maxCost = math.MaxInt64
	r := Rate{Input: 2_500_000, Output: 10_000_000, CachedInput: 1_250_000} // 2.50, 10.00, 1.25 per 1M
	tests := []struct {
		name string
		rate Rate
		u    Usage
		want int64
	}{
		{"zero usage", r, Usage{}, 0},
		{"zero usage, found", r, Usage{Found: true, Total: 99}, 0},
		{"2502.5 rounds up", r, Usage{Input: 1001}, 2503},
		{"exact", r, Usage{Input: 1_000_000, Output: 1_000_000}, 12_500_000},
		// Anthropic's cache writes at 3.75, reads at 0.30, the rest at 3.00:
		// 2,000 read, 1,000 written, 500 plain, and 100 out at 15.
		{"cache reads and writes", Rate{Input: 3_000_000, Output: 15_000_000, CachedInput: 300_000, CacheWrite: 3_750_000},
			Usage{Input: 3500, CachedInput: 2000, CacheWrite: 1000, Output: 100}, 1500 + 600 + 3750 + 1500},
		{"writes capped at what reads leave", Rate{Input: 1_000_000, CachedInput: 1_000_000, CacheWrite: 2_000_000},
			Usage{Input: 10, CachedInput: 8, CacheWrite: 5}, 8 + 2*2}, // 2 written, not 5
		{"one token rounds up to a micro-unit", r, Usage{Output: 1}, 10},
		{"one token at the smallest price", Rate{Input: 1}, Usage{Input: 1}, 1},
		{"cached part priced lower", r, Usage{Input: 1_000_000, CachedInput: 600_000, Output: 0}, 400_000*5/2 + 600_000*5/4},
		{"cached capped at input", r, Usage{Input: 100, CachedInput: 1000}, 125},
		{"negative counts are zero", r, Usage{Input: -5, Output: -1, CachedInput: -3}, 0},
		{"negative cached is zero", r, Usage{Input: 1000, CachedInput: -3}, 2500},
		{"negative rates are zero", Rate{Input: -1, Output: -1, CachedInput: -1}, Usage{Input: 5, Output: 5}, 0},
		{"total is ignored", r, Usage{Input: 1000, Total: 1 << 40}, 2500},
		{"saturates", Rate{Input: maxCost, Output: maxCost, CachedInput: maxCost}, Usage{Input: maxCost, Output: maxCost, CachedInput: 1}, maxCost},
		{"just below saturation", Rate{Input: 1_000_000}, Usage{Input: maxCost}, maxCost},
		{"large but fits", Rate{Output: 1_000_000}, Usage{Output: 1 << 62}, 1 << 62},
	}
	for _, tt := range tests {
		if got := tt.rate.Cost(tt.u); got != tt.want {
			t.Errorf("%s: %+v at %+v = %d, want %d", tt.name, tt.u, tt.rate, got, tt.want)
		}
	}
}

func TestRateCostBeyondInt64(t *testing.T) {
	// 2^40 × 2^40 / 1e6 = 2^80 / 1e6: check against big arithmetic done by hand,
	// 1208925819614629174706176 / 1000000 = 1208925819614629174.706176 → …175.
	if got := (Rate{Input: 1 << 40}).Cost(Usage{Input: 1 << 40}); got != 1208925819614629175 {
		t.Fatalf("got %d", got)
	}
}

func pricing(t testing.TB, p Pricing) *Pricing {
	t.Helper()
	if err := p.Provision(); err != nil {
		t.Fatal(err)
	}
	return &p
}

func TestPricingLookup(t *testing.T) {
	p := pricing(t, Pricing{
		Prices: []ModelPrice{
			{Model: "gpt-4o*", Input: "2.50", Output: "10", CachedInput: "1.25"},
			{Model: "gpt-4o-mini", Input: "0.15", Output: "0.60"},
			{Model: "claude-*-sonnet*", Input: "3", Output: "15", CachedInput: "0.30"},
			{Model: "claude-sonnet-4*", Input: "3", Output: "15", CachedInput: "0.30"},
			{Model: "*-haiku-*", Input: "0.80", Output: "4"},
			{Model: "accounts/fireworks/models/*", Input: "0.90", Output: "0.90"},
			{Model: "o*", Input: "15", Output: "60"},
		},
	})
	tests := []struct {
		model string
		want  Rate
		ok    bool
	}{
		{"gpt-4o-mini", Rate{150_000, 600_000, 150_000, 150_000}, true}, // exact before the earlier pattern
		{"gpt-4o", Rate{2_500_000, 10_000_000, 1_250_000, 2_500_000}, true},
		{"gpt-4o-2024-08-06", Rate{2_500_000, 10_000_000, 1_250_000, 2_500_000}, true},
		{"gpt-4o-mini-2024-07-18", Rate{2_500_000, 10_000_000, 1_250_000, 2_500_000}, true}, // the first pattern wins
		{"claude-3-5-sonnet-20241022", Rate{3_000_000, 15_000_000, 300_000, 3_000_000}, true},
		{"claude-sonnet-4-5", Rate{3_000_000, 15_000_000, 300_000, 3_000_000}, true},
		{"claude-3-5-haiku-latest", Rate{800_000, 4_000_000, 800_000, 800_000}, true}, // cached defaults to input
		{"accounts/fireworks/models/llama-v3p1-8b", Rate{900_000, 900_000, 900_000, 900_000}, true},
		{"o3-mini", Rate{15_000_000, 60_000_000, 15_000_000, 15_000_000}, true},
		{"GPT-4O", Rate{}, false}, // names are case-sensitive
		{"gpt-4", Rate{}, false},
		{"", Rate{}, false},
		{"xgpt-4o", Rate{}, false},
	}
	for _, tt := range tests {
		got, ok := p.Lookup(tt.model)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Lookup(%q) = %+v, %v; want %+v, %v", tt.model, got, ok, tt.want, tt.ok)
		}
	}

	withDefault := pricing(t, Pricing{
		Prices:  []ModelPrice{{Model: "gpt-4o", Input: "2.5", Output: "10"}},
		Default: &ModelPrice{Model: "ignored", Input: "1", Output: "2"},
	})
	if got, ok := withDefault.Lookup("mystery-model"); !ok || got != (Rate{1_000_000, 2_000_000, 1_000_000, 1_000_000}) {
		t.Errorf("default: %+v, %v", got, ok)
	}
	if got, ok := withDefault.Lookup("gpt-4o"); !ok || got.Input != 2_500_000 {
		t.Errorf("an entry before the default: %+v, %v", got, ok)
	}
	if _, ok := (&Pricing{Prices: []ModelPrice{{Model: "a", Input: "1", Output: "1"}}}).Lookup("a"); ok {
		t.Error("an unprovisioned Pricing prices nothing")
	}
}

func TestPricingProvisionErrors(t *testing.T) {
	tests := []struct {
		name    string
		p       Pricing
		wantErr string
	}{
		{"bad input", Pricing{Prices: []ModelPrice{{Model: "gpt-4o", Input: "x", Output: "1"}}}, `price gpt-4o: input "x": unexpected 'x'`},
		{"bad output", Pricing{Prices: []ModelPrice{{Model: "gpt-4o", Input: "1", Output: "-1"}}}, `price gpt-4o: output "-1": a sign is not allowed`},
		{"bad cached", Pricing{Prices: []ModelPrice{{Model: "gpt-4o", Input: "1", Output: "1", CachedInput: "0.0000001"}}}, `price gpt-4o: cached_input "0.0000001": finer than a micro-unit`},
		{"missing input", Pricing{Prices: []ModelPrice{{Model: "gpt-4o", Output: "1"}}}, `price gpt-4o: input: missing`},
		{"missing output", Pricing{Prices: []ModelPrice{{Model: "gpt-4o", Input: "1"}}}, `price gpt-4o: output: missing`},
		{"empty model", Pricing{Prices: []ModelPrice{{Input: "1", Output: "1"}}}, `price #1: model is empty`},
		{"bad character", Pricing{Prices: []ModelPrice{{Model: "ok", Input: "1", Output: "1"}, {Model: "gpt 4o", Input: "1", Output: "1"}}}, `price #2: model "gpt 4o": ' ' is not allowed`},
		{"bracket", Pricing{Prices: []ModelPrice{{Model: "gpt-[45]o", Input: "1", Output: "1"}}}, `'[' is not allowed`},
		{"question mark", Pricing{Prices: []ModelPrice{{Model: "gpt-4?", Input: "1", Output: "1"}}}, `'?' is not allowed`},
		{"duplicate", Pricing{Prices: []ModelPrice{{Model: "gpt-4o*", Input: "1", Output: "1"}, {Model: "gpt-4o*", Input: "2", Output: "2"}}}, `price gpt-4o*: listed twice`},
		{"bad default", Pricing{Default: &ModelPrice{Input: "1"}}, `price default: output: missing`},
	}
	for _, tt := range tests {
		err := tt.p.Provision()
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: got %v, want an error containing %q", tt.name, err, tt.wantErr)
		}
	}
	ok := Pricing{Prices: []ModelPrice{{Model: "Mistral.Large_2:latest/x@v1-*", Input: "0", Output: "0"}}}
	if err := ok.Provision(); err != nil {
		t.Errorf("every allowed character: %v", err)
	}
}

func TestMatchGlob(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"gpt-4o", "gpt-4o", true},
		{"gpt-4o", "gpt-4o-mini", false},
		{"gpt-4o*", "gpt-4o", true},
		{"gpt-4o*", "gpt-4o-mini", true},
		{"gpt-4o*", "gpt-4", false},
		{"*", "", true},
		{"*", "anything/at/all", true},
		{"", "", true},
		{"", "a", false},
		{"*-mini", "o4-mini", true},
		{"*-mini", "o4-mini-high", false},
		{"claude-*-sonnet*", "claude-3-5-sonnet-20241022", true},
		{"claude-*-sonnet*", "claude-sonnet-4", false},
		{"a*b*c", "abc", true},
		{"a*b*c", "aXbYbZc", true},
		{"a*b*c", "aXbYcZ", false},
		{"a*a*a*a*b", strings.Repeat("a", 60), false}, // backtracking stays bounded
		{"**x**", "x", true},
		{"models/*", "models/llama/3", true}, // '*' crosses '/'
		{"gpt-4o", "GPT-4O", false},
	}
	for _, tt := range tests {
		if got := matchGlob(tt.pattern, tt.name); got != tt.want {
			t.Errorf("matchGlob(%q, %q) = %v", tt.pattern, tt.name, got)
		}
	}
}

// benchPricing is a list of about twenty entries, like a real deployment's.
func benchPricing(b *testing.B) *Pricing {
	return pricing(b, Pricing{
		Prices: []ModelPrice{
			{Model: "gpt-4o", Input: "2.50", Output: "10", CachedInput: "1.25"},
			{Model: "gpt-4o-mini", Input: "0.15", Output: "0.60", CachedInput: "0.075"},
			{Model: "gpt-4.1", Input: "2", Output: "8", CachedInput: "0.50"},
			{Model: "gpt-4.1-mini", Input: "0.40", Output: "1.60", CachedInput: "0.10"},
			{Model: "gpt-4.1-nano", Input: "0.10", Output: "0.40", CachedInput: "0.025"},
			{Model: "o3", Input: "2", Output: "8", CachedInput: "0.50"},
			{Model: "o4-mini", Input: "1.10", Output: "4.40", CachedInput: "0.275"},
			{Model: "gpt-4o-2024-*", Input: "2.50", Output: "10", CachedInput: "1.25"},
			{Model: "gpt-4o-mini-*", Input: "0.15", Output: "0.60", CachedInput: "0.075"},
			{Model: "gpt-4.1-*", Input: "2", Output: "8", CachedInput: "0.50"},
			{Model: "o3-*", Input: "2", Output: "8", CachedInput: "0.50"},
			{Model: "o4-mini-*", Input: "1.10", Output: "4.40", CachedInput: "0.275"},
			{Model: "claude-opus-4*", Input: "15", Output: "75", CachedInput: "1.50"},
			{Model: "claude-sonnet-4*", Input: "3", Output: "15", CachedInput: "0.30"},
			{Model: "claude-3-7-sonnet*", Input: "3", Output: "15", CachedInput: "0.30"},
			{Model: "claude-3-5-sonnet*", Input: "3", Output: "15", CachedInput: "0.30"},
			{Model: "claude-3-5-haiku*", Input: "0.80", Output: "4", CachedInput: "0.08"},
			{Model: "claude-haiku-4*", Input: "1", Output: "5", CachedInput: "0.10"},
			{Model: "gemini-2.5-pro*", Input: "1.25", Output: "10"},
			{Model: "gemini-2.5-flash*", Input: "0.30", Output: "2.50"},
		},
		Default: &ModelPrice{Input: "10", Output: "40"},
	})
}

func BenchmarkLookup(b *testing.B) {
	p := benchPricing(b)
	for _, model := range []string{"gpt-4o-mini", "claude-3-5-haiku-20241022", "gemini-2.5-flash-preview-05-20", "unknown-model-v9"} {
		b.Run(model, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := p.Lookup(model); !ok {
					b.Fatal("no price")
				}
			}
		})
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	p := pricing(t, Pricing{
		Prices:  []ModelPrice{{Model: "gpt-4o", Input: "1", Output: "1"}, {Model: "claude-*", Input: "1", Output: "1"}},
		Default: &ModelPrice{Input: "1", Output: "1"},
	})
	for _, model := range []string{"gpt-4o", "claude-sonnet-4-5", "other"} {
		if n := testing.AllocsPerRun(100, func() { p.Lookup(model) }); n != 0 {
			t.Errorf("Lookup(%q): %v allocations", model, n)
		}
	}
}
