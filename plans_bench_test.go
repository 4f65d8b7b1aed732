package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// BenchmarkHandlerPlans is BenchmarkHandler's tiers=4 with plans: the
// tree's plan from an entitlements file keyed by the top tier (every
// value cached before the clock starts), each tier with a free and a pro
// plan; "none" is the same tree without plans, in the same run.
func BenchmarkHandlerPlans(b *testing.B) {
	for _, kind := range []string{"none", "cached"} {
		b.Run(kind, func(b *testing.B) {
			const tiers = 4
			tree := map[string]any{"name": "bench"}
			var ts []map[string]any
			for i := range tiers {
				tier := map[string]any{
					"name": fmt.Sprintf("t%d", i), "key": fmt.Sprintf("{http.request.header.X-T%d}", i),
					"limits": []map[string]any{{"count": int64(1) << 40, "per": "h"}},
				}
				if kind != "none" {
					tier["plans"] = map[string]any{
						"free": map[string]any{"limits": []map[string]any{{"count": int64(1) << 39, "per": "h"}}},
						"pro":  map[string]any{"limits": []map[string]any{{"count": int64(1) << 40, "per": "h"}}},
					}
				}
				ts = append(ts, tier)
			}
			tree["tiers"] = ts
			cfg := map[string]any{"store": map[string]any{"memory": map[string]any{"name": b.Name()}}}
			if kind != "none" {
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
			raw, _ := json.Marshal(cfg)
			h := new(Handler)
			if err := json.Unmarshal(raw, h); err != nil {
				b.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			if err := h.Provision(ctx); err != nil {
				b.Fatal(err)
			}
			defer h.Cleanup()
			for _, c := range h.Entitlements { // cached before the clock starts
				for v := range 1000 {
					c.cache.Get(context.Background(), fmt.Sprintf("v%d", v))
				}
			}
			runHandler(b, h, tiers, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }))
		})
	}
}
