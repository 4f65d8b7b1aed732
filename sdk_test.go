package cascade

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The official SDKs of OpenAI (npm openai) and Anthropic (npm
// @anthropic-ai/sdk), run by Node.js against a real Caddy with Cascade in
// front of a fake provider: what their users' code sees of Cascade's
// refusals, retries and fallbacks. internal/sdktest pins their versions.

// sdkResult is what internal/sdktest/sdk.mjs printed: each call's outcome,
// and when (ms from the start) each HTTP attempt was made.
type sdkResult struct {
	Results []struct {
		OK             bool    `json:"ok"`
		Fallback       *string `json:"fallback"`
		Class          string  `json:"class"`
		RateLimitError bool    `json:"rateLimitError"`
		Status         int     `json:"status"`
		RequestID      *string `json:"requestID"`
		Message        string  `json:"message"`
		Code           *string `json:"code"`
		Type           *string `json:"type"`
	} `json:"results"`
	Attempts []int `json:"attempts"`
}

var sdkInstall sync.Once

// runSDK runs sdk.mjs with opts, installing the SDKs first (npm ci) if
// they are not.
func runSDK(t *testing.T, opts map[string]any) sdkResult {
	t.Helper()
	var r sdkResult
	runNode(t, "sdk.mjs", opts, &r)
	return r
}

// runNode runs a script of internal/sdktest with opts (as JSON, its
// argument), installing its packages first, and reads what it printed
// (one JSON value) into out.
func runNode(t *testing.T, script string, opts map[string]any, out any) {
	t.Helper()
	dir := filepath.Join("internal", "sdktest")
	sdkInstall.Do(func() {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil && !staleModules(dir) {
			return
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s (scripts/test.sh installs Node.js and npm): %v\n%s", dir, err, out)
		}
	})
	arg, _ := json.Marshal(opts)
	cmd := exec.Command("node", script, string(arg))
	cmd.Dir = dir
	printed, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node %s %s: %v\n%s\n%s", script, arg, err, printed, stderr)
	}
	if err := json.Unmarshal(printed, out); err != nil {
		t.Fatalf("%s printed %s: %v", script, printed, err)
	}
}

// staleModules reports whether dir's node_modules were installed from
// another package-lock.json than dir's (a package added since).
func staleModules(dir string) bool {
	want, err1 := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	got, err2 := os.ReadFile(filepath.Join(dir, "node_modules", ".package-lock.json"))
	if err1 != nil || err2 != nil {
		return true
	}
	var w, g struct {
		Packages map[string]struct{ Version string } `json:"packages"`
	}
	if json.Unmarshal(want, &w) != nil || json.Unmarshal(got, &g) != nil {
		return true
	}
	for name, p := range w.Packages {
		if name != "" && g.Packages[name].Version != p.Version {
			return true
		}
	}
	return false
}

// TestSDKs: the SDKs raise their own rate-limit error with Cascade's
// message, wait Cascade's Retry-After before retrying, and are served a
// fallback model without noticing.
func TestSDKs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Node.js")
	}
	up := newFakeLLM(t, 10, 10)
	limits := `
		tree llm {
			tier org {header.X-Org} {
				%s
			}
			tier model {http.rate_limit.model} {
				limit 10000 tokens/day
				value gpt-4o {
					limit 100 tokens/day
				}
			}
		}
		cost tokens llm
		%s`
	gateway := func(t *testing.T, orgLimit, more string) string {
		base, _ := proxiedSite(t, up.srv.URL, strings.Replace(strings.Replace(limits, "%s", orgLimit, 1), "%s", more, 1))
		return base
	}
	// Each call is estimated at 64 tokens (14 of input, 50 of output).
	t.Run("openai refusal", func(t *testing.T) {
		base := gateway(t, "limit 100 tokens/day", "refusal_body openai")
		r := runSDK(t, map[string]any{"sdk": "openai", "base": base, "model": "gpt-4o-mini", "calls": 2})
		got := r.Results[1]
		if !r.Results[0].OK || got.OK || !got.RateLimitError || got.Class != "RateLimitError" || got.Status != 429 ||
			got.Code == nil || *got.Code != "rate_limit_exceeded" || !strings.Contains(got.Message, "llm/org") {
			t.Fatalf("the OpenAI SDK saw %+v", r.Results)
		}
	})
	t.Run("anthropic refusal", func(t *testing.T) {
		base := gateway(t, "limit 100 tokens/day", "refusal_body anthropic")
		r := runSDK(t, map[string]any{"sdk": "anthropic", "base": base, "model": "claude-sonnet-4", "calls": 2})
		got := r.Results[1]
		if !r.Results[0].OK || got.OK || !got.RateLimitError || got.Class != "RateLimitError" || got.Status != 429 ||
			got.Type == nil || *got.Type != "rate_limit_error" || !strings.Contains(got.Message, "llm/org") {
			t.Fatalf("the Anthropic SDK saw %+v", r.Results)
		}
	})
	t.Run("default body", func(t *testing.T) {
		// problem+json, whose error member the SDKs read.
		base := gateway(t, "limit 100 tokens/day", "")
		o := runSDK(t, map[string]any{"sdk": "openai", "base": base, "model": "gpt-4o-mini", "calls": 2})
		a := runSDK(t, map[string]any{"sdk": "anthropic", "base": base, "model": "claude-sonnet-4", "calls": 1})
		got, ga := o.Results[1], a.Results[0]
		if !got.RateLimitError || got.Code == nil || *got.Code != "rate_limit_exceeded" || !strings.Contains(got.Message, "llm/org") ||
			got.RequestID == nil || len(*got.RequestID) != 36 {
			t.Fatalf("the OpenAI SDK saw %+v", o.Results)
		}
		if !ga.RateLimitError || ga.Type == nil || *ga.Type != "rate_limit_error" || !strings.Contains(ga.Message, "llm/org") ||
			ga.RequestID == nil || len(*ga.RequestID) != 36 {
			t.Fatalf("the Anthropic SDK saw %+v", a.Results)
		}
	})
	t.Run("impossible is not retried", func(t *testing.T) {
		// 64 tokens a call, 10 allowed: waiting will not help.
		base := gateway(t, "limit 10 tokens/day", "")
		for _, sdk := range []string{"openai", "anthropic"} {
			r := runSDK(t, map[string]any{"sdk": sdk, "base": base, "model": "gpt-4o-mini", "calls": 1, "maxRetries": 2})
			if r.Results[0].OK || !r.Results[0].RateLimitError || len(r.Attempts) != 1 {
				t.Fatalf("%s: %+v after %d attempts, want one refused attempt", sdk, r.Results, len(r.Attempts))
			}
		}
	})
	t.Run("a long wait is not slept through", func(t *testing.T) {
		// 64 tokens every 15 minutes: the second call would wait 15 min.
		base := gateway(t, "limit 64 tokens/15m", "")
		r := runSDK(t, map[string]any{"sdk": "openai", "base": base, "model": "gpt-4o-mini", "calls": 2, "maxRetries": 2})
		if !r.Results[0].OK || r.Results[1].OK || !r.Results[1].RateLimitError || len(r.Attempts) != 2 {
			t.Fatalf("%+v after %d attempts, want the second refused at once", r.Results, len(r.Attempts))
		}
	})
	t.Run("retry after", func(t *testing.T) {
		// 64 tokens every 4 s: the second call is refused with
		// Retry-After: 4, and the SDK's retry waits it out.
		base := gateway(t, "limit 64 tokens/4s", "refusal_body openai")
		r := runSDK(t, map[string]any{"sdk": "openai", "base": base, "model": "gpt-4o-mini", "calls": 2, "maxRetries": 2})
		if !r.Results[0].OK || !r.Results[1].OK || len(r.Attempts) != 3 {
			t.Fatalf("results %+v, attempts at %v ms: want both served, the second after one retry", r.Results, r.Attempts)
		}
		if wait := r.Attempts[2] - r.Attempts[1]; wait < 3000 {
			t.Fatalf("the SDK retried after %d ms, before the Retry-After of 4 s", wait)
		}
	})
	t.Run("fallback", func(t *testing.T) {
		base := gateway(t, "limit 10000 tokens/day", "fallback_model gpt-4o gpt-4o-mini")
		r := runSDK(t, map[string]any{"sdk": "openai", "base": base, "model": "gpt-4o", "calls": 2})
		if !r.Results[0].OK || r.Results[0].Fallback != nil || !r.Results[1].OK || r.Results[1].Fallback == nil ||
			*r.Results[1].Fallback != "gpt-4o-mini" || len(r.Attempts) != 2 {
			t.Fatalf("the OpenAI SDK saw %+v, attempts %v", r.Results, r.Attempts)
		}
	})
}
