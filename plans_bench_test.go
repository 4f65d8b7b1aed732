package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// BenchmarkHandlerPlans is BenchmarkHandler's tiers=4 with plans: the
// tree's plan from an entitlements file keyed by the top tier (every
// value cached before the clock starts), each tier with a free and a pro
// plan; "none" is the same tree without plans, in the same run.
func BenchmarkHandlerPlans(b *testing.B) {
	for _, kind := range []string{"none", "cached"} {
		b.Run(kind, func(b *testing.B) {
			h, done := plansHandler(b, kind == "cached")
			defer done()
			runHandler(b, h, planTiers, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }))
		})
	}
}

// BenchmarkHandlerPlansRatio serves BenchmarkHandlerPlans' two handlers
// in turns, 1,000 requests at a time, in one process, and reports the
// cost of a request with a cached entitlement over one without plans
// (cached/none). Taking turns, the two share whatever the machine does
// meanwhile; run one after the other (as the sub-benchmarks of
// BenchmarkHandlerPlans are), they differ by more than plans cost.
func BenchmarkHandlerPlansRatio(b *testing.B) {
	none, doneNone := plansHandler(b, false)
	defer doneNone()
	cached, doneCached := plansHandler(b, true)
	defer doneCached()
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
	bb := newBenchBatch(planTiers)
	// serve times one batch through h, its requests built beforehand.
	serve := func(h *Handler) time.Duration {
		bb.build(nil, 0)
		start := time.Now()
		for k := range bb.reqs {
			if err := h.ServeHTTP(&bb.ws[k], bb.reqs[k], next); err != nil || bb.ws[k].code == http.StatusTooManyRequests {
				b.Fatal(err, bb.ws[k].code)
			}
		}
		return time.Since(start)
	}
	var tNone, tCached time.Duration
	b.ResetTimer()
	for round := 0; round*len(bb.reqs) < b.N; round++ {
		if round%2 == 0 {
			tNone += serve(none)
			tCached += serve(cached)
		} else {
			tCached += serve(cached)
			tNone += serve(none)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(tCached)/float64(tNone), "cached/none")
	b.ReportMetric(0, "ns/op") // the loop serves both handlers and builds requests: its time per op means nothing
}

// planTiers is the tiers of the plans benchmarks' tree.
const planTiers = 4

// plansHandler provisions a handler for the plans benchmarks: with plans,
// every value's entitlement cached; without, the same tree's own limits.
func plansHandler(b *testing.B, plans bool) (*Handler, func()) {
	var withPlans func(map[string]any)
	if plans {
		withPlans = func(tier map[string]any) {
			tier["plans"] = map[string]any{
				"free": map[string]any{"limits": []map[string]any{{"count": int64(1) << 39, "per": "h"}}},
				"pro":  map[string]any{"limits": []map[string]any{{"count": int64(1) << 40, "per": "h"}}},
			}
		}
	}
	tree := benchTree(planTiers, withPlans)
	name := b.Name() + "/none"
	if plans {
		name = b.Name() + "/cached"
	}
	cfg := map[string]any{"store": map[string]any{"memory": map[string]any{"name": name}}}
	if plans {
		tree["plan"], tree["default_plan"] = "{http.rate_limit.entitlement.customers.plan}", "free"
		ents := map[string]any{}
		for v := range 1000 {
			ents[fmt.Sprintf("v%d", v)] = map[string]any{"plan": []string{"free", "pro"}[v%2]}
		}
		raw, _ := json.Marshal(ents)
		path := filepath.Join(b.TempDir(), "entitlements.json")
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			b.Fatal(err)
		}
		cfg["entitlements"] = []any{map[string]any{"name": "customers", "source": map[string]any{"file": path}, "key": "t0"}}
	}
	cfg["trees"] = []any{tree}
	h, done := provisionBench(b, cfg)
	for _, c := range h.Entitlements { // cached before the clock starts
		for v := range 1000 {
			c.cache.Get(context.Background(), fmt.Sprintf("v%d", v))
		}
	}
	return h, done
}
