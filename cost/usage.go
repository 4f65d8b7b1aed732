package cost

import (
	"fmt"
	"math"
)

// Usage is what a request consumed, as the upstream reported it (or, from
// [LLM.EstimateUsage], as estimated).
type Usage struct {
	// Input and Output are input (prompt) and output (completion) tokens.
	// Anthropic's cache_creation_input_tokens and cache_read_input_tokens
	// are included in Input: they are input the model processed, and they
	// count against Anthropic's input-token rate limits.
	Input, Output int64
	// CacheWrite is the part of Input written to the provider's prompt
	// cache (Anthropic's cache_creation_input_tokens), priced higher.
	CacheWrite int64
	// CachedInput is the part of Input the provider read from its prompt
	// cache, which it prices lower: OpenAI's cached_tokens (under
	// prompt_tokens_details or input_tokens_details) and Anthropic's
	// cache_read_input_tokens. It is never more than Input. Actual ignores
	// it; [Rate.Cost] prices it.
	CachedInput int64
	// Total is the upstream's total when it reports one, else Input+Output.
	// For GraphQL it is the query's actual cost.
	Total int64
	// Found reports that a final usage report was seen. When false the
	// caller keeps its estimate (a cut stream, an error body, no report).
	Found bool
}

// Modes of [Actual].
const (
	ActualTotal    = "total"
	ActualInput    = "input"
	ActualOutput   = "output"
	ActualWeighted = "weighted"
)

// Actual turns a [Usage] into the amount charged in a dimension.
//
// "weighted" prices output differently from input, as providers do: with
// InputWeight 1 and OutputWeight 4 (typical price ratios), a call of 1,000
// input and 200 output tokens costs 1,800 units. Apply the same Actual to
// the estimate ([LLM.EstimateUsage]) so that both sides count alike.
type Actual struct {
	// Mode is "total" (default), "input", "output" or "weighted".
	Mode string `json:"mode,omitempty"`
	// InputWeight and OutputWeight are the weights of "weighted" mode:
	// ceil(InputWeight×Input + OutputWeight×Output).
	InputWeight  float64 `json:"input_weight,omitempty"`
	OutputWeight float64 `json:"output_weight,omitempty"`
}

// Provision applies defaults and validates.
func (a *Actual) Provision() error {
	if a.Mode == "" {
		a.Mode = ActualTotal
	}
	return a.Validate()
}

// Validate rejects an unknown mode and unusable weights.
func (a Actual) Validate() error {
	switch a.Mode {
	case "", ActualTotal, ActualInput, ActualOutput:
		if a.InputWeight != 0 || a.OutputWeight != 0 {
			return fmt.Errorf(`actual: input_weight and output_weight need mode "weighted"`)
		}
	case ActualWeighted:
		for _, w := range []float64{a.InputWeight, a.OutputWeight} {
			if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
				return fmt.Errorf("actual: weights must be finite and non-negative, got input %v output %v", a.InputWeight, a.OutputWeight)
			}
		}
		if a.InputWeight == 0 && a.OutputWeight == 0 {
			return fmt.Errorf(`actual: mode "weighted" needs input_weight or output_weight`)
		}
	default:
		return fmt.Errorf(`actual: mode must be "total", "input", "output" or "weighted", got %q`, a.Mode)
	}
	return nil
}

// Cost returns the charged amount for u. It is meaningful only when
// u.Found; callers keep their estimate otherwise. Negative counts are
// treated as zero.
func (a Actual) Cost(u Usage) int64 {
	in, out := max(u.Input, 0), max(u.Output, 0)
	switch a.Mode {
	case ActualInput:
		return in
	case ActualOutput:
		return out
	case ActualWeighted:
		v := math.Ceil(a.InputWeight*float64(in) + a.OutputWeight*float64(out))
		if v >= math.MaxInt64 {
			return math.MaxInt64
		}
		return int64(v)
	}
	if u.Total > 0 {
		return u.Total
	}
	return satAdd(in, out)
}
