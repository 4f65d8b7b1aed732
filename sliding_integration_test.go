package cascade

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-cascade/cascade/hierarchy"
)

// TestReconcileExactSlidingWindow: on an exact sliding window of tokens,
// reconciliation corrects the very charge of the request it reads usage
// for, on either store (on Redis, through the time Redis decided at): a
// refund returns what was not used, a debt is paid by the next requests,
// exactly, as a sliding window has no refill.
func TestReconcileExactSlidingWindow(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		up := newFakeLLM(t, 30, 870)
		url := llmSiteLimit(t, up.srv.URL, storeBlock, "reconcile {\n provider openai\n }", "limit 3000 tokens/min sliding") + "/v1/chat/completions"
		body := fmt.Sprintf(pythagoras, "")

		// bob: estimated 64, used 900: a debt of 836.
		r := post(t, url, body, "X-User: bob")
		if got := remainingTokens(t, r); got != 3000-64 {
			t.Fatalf("bob's first request: remaining %d, want %d", got, 3000-64)
		}
		waitExact(t, url, 3000-900, "X-User: bob")

		// carol: estimated 64, used 14: a refund of 50, off her charge.
		up.setUsage(10, 4)
		r = post(t, url, body, "X-User: carol")
		if got := remainingTokens(t, r); got != 3000-64 {
			t.Fatalf("carol's first request: remaining %d, want %d", got, 3000-64)
		}
		waitExact(t, url, 3000-14, "X-User: carol")
	})
}

// waitExact polls until the window shows want remaining, with probes that
// are refused and so charge nothing: each costs 2,994 tokens (max_tokens
// 2,980), more than the window has left but within the limit's 3,000.
func waitExact(t *testing.T, url string, want int, headers ...string) {
	t.Helper()
	probe := strings.Replace(fmt.Sprintf(pythagoras, ""), `"max_tokens":50`, `"max_tokens":2980`, 1)
	deadline := time.Now().Add(propagation)
	for {
		r := post(t, url, probe, headers...)
		if r.status != 429 {
			t.Fatalf("probe: %d %s, want a refusal that charges nothing", r.status, r.body)
		}
		got := remainingTokens(t, r)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("remaining %d %v after the request, want %d once reconciled", got, propagation, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSlidingApproxIsAskedForByName: `sliding` is the exact window; the
// two-counter estimate is `sliding approx` (JSON: sliding_approx).
func TestSlidingApproxIsAskedForByName(t *testing.T) {
	for _, tt := range []struct{ line, want, err string }{
		{"limit 100/30m sliding", `"algorithm":"sliding"}`, ""},
		{"limit 100/30m sliding approx", `"algorithm":"sliding_approx"}`, ""},
		{"limit 100/30m sliding_approx", `"algorithm":"sliding_approx"}`, ""},
		{"limit 100/30m sliding approx burst 5", "", "burst applies only to the gcra algorithm"},
		{"limit 100/30m approx", "", `unexpected "approx"`},
	} {
		h, err := parse(t, "rate_limit {\n tree t {\n  tier u {header.X-U} {\n   "+tt.line+"\n  }\n }\n}")
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) || !strings.Contains(err.Error(), "Testfile:4") {
				t.Errorf("%s: error %v, want %q at Testfile:4", tt.line, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.line, err)
		}
		got, _ := json.Marshal(h)
		if !strings.Contains(string(got), tt.want) {
			t.Errorf("%s: JSON %s lacks %s", tt.line, got, tt.want)
		}
	}
}

// TestCoarseSlidingWindowWarns: a sliding window above rate.MaxExact (a
// tree's limit, a value override's, or an mholt zone's events) draws a
// provision warning, which `caddy validate` prints, saying what to write
// instead; one within it does not.
func TestCoarseSlidingWindowWarns(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	h := &Handler{logger: zap.New(core)}
	tree := &Tree{Tree: hierarchy.Tree{Name: "t", Tiers: []*hierarchy.Tier{{
		Name: "u", Key: "{http.request.header.X-U}",
		Limits: []*hierarchy.Limit{{Count: 1000, Per: "min", Algorithm: "sliding"}, {Count: 50000, Per: "h", Algorithm: "sliding_approx"}},
		Values: map[string]*hierarchy.Override{"big": {Limits: []*hierarchy.Limit{{Count: 5000, Per: "min", Algorithm: "sliding"}}}},
	}}}}
	zone, err := (&Zone{Key: "{remote_host}", MaxEvents: 2000, Window: caddy.Duration(time.Minute)}).tree("z")
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range []*Tree{tree, zone} {
		if err := tr.Compile(); err != nil {
			t.Fatal(err)
		}
		h.warnCoarseWindows(tr)
	}
	var limits []string
	for _, e := range logs.All() {
		f := e.ContextMap()
		limits = append(limits, fmt.Sprint(f["tree"], " ", f["limit"], " ", f["tick"]))
		if !strings.Contains(fmt.Sprint(f["instead"]), "sliding approx") || !strings.Contains(e.Message, "never admits more than its count") {
			t.Errorf("warning %q %v does not say what it means and what to write instead", e.Message, f)
		}
	}
	if want := []string{"t 5000/min sliding 60ms", "z 2000/1m0s sliding 60ms"}; fmt.Sprint(limits) != fmt.Sprint(want) {
		t.Errorf("warned of %v, want %v", limits, want)
	}
}
