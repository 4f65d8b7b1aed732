package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// benchHandler provisions a handler with one tree of the given number of
// tiers, each keyed by a header X-T<i> and limited far above the load.
func benchHandler(b *testing.B, tiers int) (*Handler, func()) {
	return benchHandlerOf(b, tiers, nil, nil)
}

// benchHandlerOf is benchHandler with each tier's JSON changed by tier
// (nil: as is) and the handler's JSON given more fields.
func benchHandlerOf(b *testing.B, tiers int, tier func(map[string]any), more map[string]any) (*Handler, func()) {
	cfg := map[string]any{"store": map[string]any{"memory": map[string]any{"name": b.Name()}}}
	if tiers > 0 { // else more has the limits (mholt's zones)
		cfg["trees"] = []any{benchTree(tiers, tier)}
	}
	for k, v := range more {
		cfg[k] = v
	}
	return provisionBench(b, cfg)
}

// benchTree is benchHandler's tree as JSON, each tier's changed by tier
// (nil: as is).
func benchTree(tiers int, tier func(map[string]any)) map[string]any {
	var ts []map[string]any
	for i := 0; i < tiers; i++ {
		ts = append(ts, map[string]any{
			"name": fmt.Sprintf("t%d", i), "key": fmt.Sprintf("{http.request.header.X-T%d}", i),
			"limits": []map[string]any{{"count": int64(1) << 40, "per": "h"}},
		})
		if tier != nil {
			tier(ts[i])
		}
	}
	return map[string]any{"name": "bench", "tiers": ts}
}

// provisionBench provisions a handler from its JSON config; the function
// returned cleans it up.
func provisionBench(b *testing.B, cfg map[string]any) (*Handler, func()) {
	raw, _ := json.Marshal(cfg)
	h := new(Handler)
	if err := json.Unmarshal(raw, h); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	if err := h.Provision(ctx); err != nil {
		cancel()
		b.Fatal(err)
	}
	return h, func() { h.Cleanup(); cancel() }
}

// headerWriter is the least a ResponseWriter can be.
type headerWriter struct {
	hdr  http.Header
	code int
}

func (w *headerWriter) Header() http.Header         { return w.hdr }
func (w *headerWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerWriter) WriteHeader(code int)        { w.code = code }

// BenchmarkHandler is the handler's own cost per admitted request on the
// memory store, on one goroutine, with the requests, replacers and response
// writers built outside the timer (as Caddy builds them before the handler
// runs): what remains is ours. The tiers' keys are read from headers, so
// a bare replacer does.
func BenchmarkHandler(b *testing.B) {
	for _, tiers := range []int{1, 4, 7} {
		b.Run(fmt.Sprintf("tiers=%d", tiers), func(b *testing.B) {
			h, done := benchHandler(b, tiers)
			defer done()
			runHandler(b, h, tiers, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }))
		})
	}
}

// runHandler serves b.N requests through h, each with tiers headers
// X-T<i> (1,000 values each), to next, building the requests, replacers
// and response writers outside the timer, 1,000 at a time: each value
// once a batch (a batch of 1,024 sent 24 values twice, which took them over
// BenchmarkHandlerZone's 1,000 a second).
func runHandler(b *testing.B, h *Handler, tiers int, next caddyhttp.Handler) {
	runHandlerWith(b, h, tiers, next, nil)
}

// runHandlerWith is runHandler with each request's headers changed by
// vary (given the request's number) before it is built, outside the timer.
func runHandlerWith(b *testing.B, h *Handler, tiers int, next caddyhttp.Handler, vary func(hdr http.Header, n int)) {
	bb := newBenchBatch(tiers)
	reqs, ws := bb.reqs, bb.ws // the timed loop reads no more than it did before benchBatch
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		k := n % len(reqs)
		if k == 0 {
			b.StopTimer()
			bb.build(vary, n)
			b.StartTimer()
		}
		if err := h.ServeHTTP(&ws[k], reqs[k], next); err != nil || ws[k].code == http.StatusTooManyRequests {
			b.Fatal(err, ws[k].code)
		}
	}
}

// benchBatch is a batch of 1,000 requests, each with tiers headers X-T<i>
// (1,000 values each, each value once a batch), and their response writers.
type benchBatch struct {
	hdrs  []http.Header
	reqs  []*http.Request
	ws    []headerWriter
	proto *http.Request
}

func newBenchBatch(tiers int) *benchBatch {
	const batch = 1000
	bb := &benchBatch{
		hdrs:  make([]http.Header, batch),
		reqs:  make([]*http.Request, batch),
		ws:    make([]headerWriter, batch),
		proto: httptest.NewRequest("GET", "/", nil),
	}
	for n := range bb.hdrs {
		bb.hdrs[n] = http.Header{}
		for i := 0; i < tiers; i++ {
			bb.hdrs[n].Set(fmt.Sprintf("X-T%d", i), fmt.Sprintf("v%d", (n+i)%1000))
		}
	}
	return bb
}

// build makes the batch's requests afresh, their headers first changed by
// vary (nil: as they are), given each request's number from n.
func (bb *benchBatch) build(vary func(hdr http.Header, n int), n int) {
	for j := range bb.reqs {
		if vary != nil {
			vary(bb.hdrs[j], n+j)
		}
		bb.proto.Header = bb.hdrs[j]
		// As Caddy's server does before any handler: its HTTP variables
		// in the replacer, its name in the response.
		repl := caddy.NewReplacer()
		repl.Map(func(string) (any, bool) { return nil, false })
		bb.reqs[j] = bb.proto.WithContext(context.WithValue(bb.proto.Context(), caddy.ReplacerCtxKey, repl))
		bb.ws[j] = headerWriter{hdr: http.Header{"Server": {"Caddy"}}}
	}
}

// BenchmarkHandlerChargeOn is BenchmarkHandler's tiers=4 with charge_on
// status 401: the upstream answers 401 (the request stays charged) or
// 200 (its charges are given back, one more store call).
func BenchmarkHandlerChargeOn(b *testing.B) {
	for _, status := range []int{401, 200} {
		b.Run(fmt.Sprintf("status=%d", status), func(b *testing.B) {
			h, done := benchHandler(b, 4)
			defer done()
			h.ChargeOn = &caddyhttp.ResponseMatcher{StatusCode: []int{401}}
			runHandler(b, h, 4, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				w.WriteHeader(status)
				return nil
			}))
		})
	}
}

// BenchmarkHandlerPenalty is BenchmarkHandler at 4 tiers with a penalty
// box on every tier: one more bucket per tier, charged nothing.
func BenchmarkHandlerPenalty(b *testing.B) {
	h, done := benchHandlerOf(b, 4, func(tier map[string]any) {
		tier["penalty"] = map[string]any{"for": "10m", "after": 5}
	}, nil)
	defer done()
	runHandler(b, h, 4, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }))
}

// BenchmarkHandlerMaxWait is BenchmarkHandler at 4 tiers with max_wait
// on, every request admitted without waiting.
func BenchmarkHandlerMaxWait(b *testing.B) {
	h, done := benchHandlerOf(b, 4, nil, map[string]any{"max_wait": "2s"})
	defer done()
	runHandler(b, h, 4, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }))
}

// BenchmarkHandlerConcurrent is BenchmarkHandler at 4 tiers with a
// concurrency limit on every tier beside its rate: a slot taken and given
// back per tier (one more store call per request, when its response ends).
func BenchmarkHandlerConcurrent(b *testing.B) {
	h, done := benchHandlerOf(b, 4, func(tier map[string]any) {
		tier["limits"] = append(tier["limits"].([]map[string]any), map[string]any{"count": 1000, "algorithm": "concurrent"})
	}, nil)
	defer done()
	runHandler(b, h, 4, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }))
}

// BenchmarkHandlerIdempotency is BenchmarkHandler at 4 tiers with
// idempotency on: new, each request a key of its own (a record written
// with the charge, and its flight ended when the response ends: one more
// store call), or replayed, every request a retry of one that has ended
// (nothing charged).
func BenchmarkHandlerIdempotency(b *testing.B) {
	for _, kind := range []string{"new", "replayed"} {
		b.Run(kind, func(b *testing.B) {
			h, done := benchHandlerOf(b, 4, nil, map[string]any{"idempotency": map[string]any{}})
			defer done()
			runHandlerWith(b, h, 4, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }),
				func(hdr http.Header, n int) {
					if kind == "replayed" {
						n %= 1024
						if n >= b.N { // every key is sent once first
							n = 0
						}
					}
					hdr.Set("Idempotency-Key", strconv.Itoa(n))
				})
		})
	}
}

// BenchmarkServeHTTP is the handler's whole cost per admitted request on
// the memory store, without the network: placeholders, plan, decision,
// headers. tiers=4 is the load script's tree.
func BenchmarkServeHTTP(b *testing.B) {
	for _, tiers := range []int{1, 4, 7} {
		b.Run(fmt.Sprintf("tiers=%d", tiers), func(b *testing.B) {
			h, done := benchHandler(b, tiers)
			defer done()
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

// BenchmarkHandlerOverrides is BenchmarkHandler's tiers=4 with runtime
// overrides in force on the leaf tier: none, 10 (1% of the requests' values
// have one) and 10,000 (every value has one). A request reads them through
// one atomic pointer and one map lookup per tier.
func BenchmarkHandlerOverrides(b *testing.B) {
	for _, n := range []int{0, 10, 10000} {
		b.Run(fmt.Sprintf("overrides=%d", n), func(b *testing.B) {
			h, done := benchHandler(b, 4)
			defer done()
			var os []*control.Override
			for i := 0; i < n; i++ {
				os = append(os, &control.Override{Tree: "bench", Tier: "t3", Value: fmt.Sprintf("v%d", i),
					Limits: []*hierarchy.Limit{{Count: int64(1) << 41, Per: "h"}}})
			}
			h.engine.Apply(control.NewSnapshot(os, nil, time.Now()))
			runHandler(b, h, 4, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }))
		})
	}
}

// BenchmarkHandlerZone is the handler's own cost per admitted request of
// a mholt/caddy-ratelimit zone (1,000 events per 100 ms per key of header
// X-T0, 1,000 keys: an exact sliding window on the memory store; each key
// is sent about 900 times a second here, which reached a limit of 1,000 a
// second on a fast machine and failed the benchmark with a 429), with
// headers none, with headers none and placeholders refused (mholt's
// output on an admitted request: no header, no placeholder), and with the
// default headers: load.sh's MHOLT=1 workload without the network, decided
// on the engine's single-bucket path (engine.BenchmarkDecide compares it
// with the general one).
func BenchmarkHandlerZone(b *testing.B) {
	off := false
	none := map[string]any{"ietf": &off, "retry_after": &off}
	for _, tt := range []struct {
		name         string
		headers      any
		placeholders string
	}{{"headers=none", none, ""}, {"headers=none,placeholders=refused", none, "refused"}, {"headers=default", nil, ""}} {
		b.Run(tt.name, func(b *testing.B) {
			more := map[string]any{"rate_limits": map[string]any{"users": map[string]any{
				"key": "{http.request.header.X-T0}", "window": int64(100 * time.Millisecond), "max_events": 1000}}}
			if tt.headers != nil {
				more["headers"] = tt.headers
			}
			if tt.placeholders != "" {
				more["placeholders"] = tt.placeholders
			}
			h, done := benchHandlerOf(b, 0, nil, more)
			defer done()
			runHandler(b, h, 1, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil }))
		})
	}
}

// BenchmarkHandlerLLM is the handler's own cost per admitted LLM call (a
// 150-byte chat body) counted in tokens by the llm estimator; with the
// model as a second tier's key ({http.rate_limit.model}); and in money at
// the model's price (cost usd llm { price … }).
func BenchmarkHandlerLLM(b *testing.B) {
	user := map[string]any{"name": "user", "key": "{http.request.header.X-T0}", "limits": []map[string]any{
		{"count": int64(1) << 40, "per": "h", "dimension": "tokens"}}}
	model := map[string]any{"name": "model", "key": "{http.rate_limit.model}", "limits": []map[string]any{
		{"count": int64(1) << 40, "per": "h", "dimension": "tokens"}}}
	usd := map[string]any{"name": "user", "key": "{http.request.header.X-T0}", "limits": []map[string]any{
		{"amount": "1000000", "per": "h", "dimension": "usd"}}}
	tokens := map[string]any{"dimension": "tokens", "llm": map[string]any{}}
	priced := map[string]any{"dimension": "usd", "llm": map[string]any{}, "pricing": map[string]any{
		"prices": []map[string]any{{"model": "gpt-4o-mini*", "input": "0.15", "output": "0.60"}, {"model": "gpt-4o", "input": "2.50", "output": "10"}}}}
	for _, tc := range []struct {
		name  string
		tiers []map[string]any
		cost  map[string]any
	}{
		{"tokens", []map[string]any{user}, tokens},
		{"tokens,model_key", []map[string]any{user, model}, tokens},
		{"usd", []map[string]any{usd}, priced},
	} {
		b.Run(tc.name, func(b *testing.B) {
			h, done := benchHandlerOf(b, 0, nil, map[string]any{
				"trees": []any{map[string]any{"name": "bench", "tiers": tc.tiers}}, "costs": []any{tc.cost}})
			defer done()
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
			body := `{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"What is the Pythagorean theorem? Answer in one sentence."}]}`
			const batch = 1000
			reqs := make([]*http.Request, batch)
			ws := make([]headerWriter, batch)
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				k := n % batch
				if k == 0 {
					b.StopTimer()
					for j := range reqs {
						r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
						r.Header.Set("X-T0", fmt.Sprintf("v%d", j))
						repl := caddy.NewReplacer()
						repl.Map(func(string) (any, bool) { return nil, false })
						reqs[j] = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
						ws[j] = headerWriter{hdr: http.Header{}}
					}
					b.StartTimer()
				}
				if err := h.ServeHTTP(&ws[k], reqs[k], next); err != nil || ws[k].code == http.StatusTooManyRequests {
					b.Fatal(err, ws[k].code)
				}
			}
		})
	}
}
