package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// BenchmarkServeHTTP is the handler's whole cost per admitted request on
// the memory store, without the network: placeholders, plan, decision,
// headers. tiers=4 is the load script's tree.
func BenchmarkServeHTTP(b *testing.B) {
	for _, tiers := range []int{1, 4, 7} {
		b.Run(fmt.Sprintf("tiers=%d", tiers), func(b *testing.B) {
			tree := map[string]any{"name": "bench"}
			var ts []map[string]any
			for i := 0; i < tiers; i++ {
				ts = append(ts, map[string]any{
					"name": fmt.Sprintf("t%d", i), "key": fmt.Sprintf("{http.request.header.X-T%d}", i),
					"limits": []map[string]any{{"count": int64(1) << 40, "per": "h"}},
				})
			}
			tree["tiers"] = ts
			raw, _ := json.Marshal(map[string]any{"trees": []any{tree}, "store": map[string]any{"memory": map[string]any{"name": b.Name()}}})
			var h Handler
			if err := json.Unmarshal(raw, &h); err != nil {
				b.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			if err := h.Provision(ctx); err != nil {
				b.Fatal(err)
			}
			defer h.Cleanup()
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				n := 0
				for pb.Next() {
					r := httptest.NewRequest("GET", "/", nil)
					for i := 0; i < tiers; i++ {
						r.Header.Set(fmt.Sprintf("X-T%d", i), fmt.Sprintf("v%d", (n+i)%1000))
					}
					repl := caddyhttp.NewTestReplacer(r)
					r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
					w := httptest.NewRecorder()
					if err := h.ServeHTTP(w, r, next); err != nil || w.Code != 200 {
						b.Fatal(err, w.Code)
					}
					n++
				}
			})
		})
	}
}
