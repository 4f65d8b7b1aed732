package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"

	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/alert"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// orgLeft is what organisation acme has left of its limit in tree llm
// (in micro-units, for money), as the admin API reads it.
func orgLeft(t *testing.T, api string) int64 {
	t.Helper()
	got, _ := remainingOf(t, api, "tree=llm&org=acme")
	return got["org"]
}

// settleOrg waits until acme has exactly want left: reconciliation runs
// after the response.
func settleOrg(t *testing.T, api, what string, want int64) {
	t.Helper()
	deadline := time.Now().Add(propagation)
	for got := orgLeft(t, api); got != want; got = orgLeft(t, api) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d micro-dollars left, want %d", what, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// chat is an OpenAI chat completion body asking model for at most 50
// tokens ("" names no model).
func chat(model string) string {
	if model == "" {
		return `{"max_tokens":50,"messages":[{"role":"user","content":"What is the Pythagorean theorem? Answer in one sentence."}]}`
	}
	return fmt.Sprintf(`{"model":%q,"max_tokens":50,"messages":[{"role":"user","content":"What is the Pythagorean theorem? Answer in one sentence."}]}`, model)
}

// TestModelAsKey: {http.rate_limit.model} keys a tier by the model the
// body asks for: gpt-4o's own limit refuses it while another model of the
// same organisation goes on; a body that names no model has no model (the
// tier's missing policy, deny, refuses it); bodies reach the upstream
// intact.
func TestModelAsKey(t *testing.T) {
	up := newFakeLLM(t, 10, 10)
	base, _ := proxiedSite(t, up.srv.URL, `
		tree llm {
			tier org {header.X-Org} {
				limit 100000 tokens/day
			}
			tier model {http.rate_limit.model} {
				limit 10000 tokens/day
				value gpt-4o {
					limit 120 tokens/day
				}
			}
		}
		cost tokens llm`)
	// Each request is estimated at 64 tokens (14 of input, 50 of output).
	if r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme"); r.status != 200 {
		t.Fatalf("first gpt-4o request: %d %s", r.status, r.body)
	}
	r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme")
	if r.status != 429 || !strings.Contains(r.body, "llm/model") {
		t.Fatalf("second gpt-4o request over its 120 tokens: %d %s", r.status, r.body)
	}
	for i := range 3 {
		if r := post(t, base+"/v1/chat/completions", chat("gpt-4o-mini"), "X-Org: acme"); r.status != 200 {
			t.Fatalf("gpt-4o-mini request %d: %d %s", i+1, r.status, r.body)
		}
	}
	if r := post(t, base+"/v1/chat/completions", chat(""), "X-Org: acme"); r.status != 400 || !strings.Contains(r.body, "model") {
		t.Fatalf("a body with no model: %d %s", r.status, r.body)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.bodies) != 4 {
		t.Fatalf("the upstream got %d requests, want the 4 admitted", len(up.bodies))
	}
	if got := string(up.bodies[0]); got != chat("gpt-4o") {
		t.Fatalf("the upstream got %q", got)
	}
}

// TestMoneyBudget: a budget in dollars, charged at each model's prices:
// the estimate up front, then the reported usage × the prices, exact to
// the micro-dollar; a model with no price is refused before the upstream;
// the budget stops spending once the reconciled charges reach it.
func TestMoneyBudget(t *testing.T) {
	up := newFakeLLM(t, 100, 300)
	base, api := proxiedSite(t, up.srv.URL, `
		tree llm {
			tier org {header.X-Org} {
				limit 0.05 usd/day calendar
			}
		}
		cost usd llm {
			price gpt-4o input 2.50 output 10
			price gpt-4o-mini* input 0.15 output 0.60 cached_input 0.075
			reconcile {
				provider openai
			}
		}`)
	remaining := func() int64 { return orgLeft(t, api) }
	settle := func(what string, want int64) { t.Helper(); settleOrg(t, api, what, want) }
	// 100 input tokens at $2.50/1M and 300 output at $10/1M: 250 + 3,000.
	if r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme"); r.status != 200 {
		t.Fatalf("gpt-4o: %d %s", r.status, r.body)
	}
	settle("after a gpt-4o call", 50_000-3_250)
	// At $0.15 and $0.60: 15 + 180.
	if r := post(t, base+"/v1/chat/completions", chat("gpt-4o-mini-2024-07-18"), "X-Org: acme"); r.status != 200 {
		t.Fatalf("gpt-4o-mini: %d %s", r.status, r.body)
	}
	settle("after a gpt-4o-mini call", 50_000-3_250-195)
	r := post(t, base+"/v1/chat/completions", chat("o1"), "X-Org: acme")
	if r.status != 400 || !strings.Contains(r.body, `\"o1\" has no price`) && !strings.Contains(r.body, `"o1" has no price`) {
		t.Fatalf("an unpriced model: %d %s", r.status, r.body)
	}
	if got := remaining(); got != 50_000-3_250-195 {
		t.Fatalf("an unpriced model was charged: %d left", got)
	}
	// 46,555 left: 14 more calls of 3,250 leave 1,055, which the 15th's
	// estimate (about 540) fits; its charge then overdraws the budget, and
	// the next is refused.
	left := int64(50_000 - 3_250 - 195)
	for i := range 15 {
		if r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme"); r.status != 200 {
			t.Fatalf("call %d with %d micro-dollars left: %d %s", i+1, left, r.status, r.body)
		}
		left -= 3_250
		settle(fmt.Sprintf("after call %d", i+1), max(left, 0))
	}
	if r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme"); r.status != 429 {
		t.Fatalf("a call over the budget: %d %s", r.status, r.body)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.bodies) != 17 {
		t.Fatalf("the upstream got %d calls, want the 17 admitted", len(up.bodies))
	}
}

// TestMoneyConfigErrors: a bad price or money limit is refused with its
// line and what to write instead.
func TestMoneyConfigErrors(t *testing.T) {
	rl := func(limit, costBody string) string {
		return "rate_limit {\n tree llm {\n  tier org {header.X-Org} {\n   " + limit + "\n  }\n }\n cost usd llm {\n" + costBody + "\n }\n}"
	}
	for _, tc := range []struct{ name, input, want string }{
		{"a decimal count of tokens", "rate_limit {\n tree llm {\n  tier org {header.X-Org} {\n   limit 0.5 tokens/h\n  }\n }\n cost tokens llm\n}",
			"only money takes a decimal count"},
		{"a price without output", rl("limit 1 usd/day", "  price gpt-4o input 2.50"), "give both input and output prices"},
		{"a price too fine", rl("limit 1 usd/day", "  price gpt-4o input 0.0000001 output 1"), "0.0000001"},
		{"a negative price", rl("limit 1 usd/day", "  price gpt-4o input -1 output 1"), "-1"},
		{"a bad pattern", rl("limit 1 usd/day", "  price gpt 4o input 1 output 1"), "unexpected"},
		{"a pattern of other characters", rl("limit 1 usd/day", "  price gpt-[4o] input 1 output 1"), "gpt-[4o]"},
		{"a price without input", rl("limit 1 usd/day", "  price gpt-4o output 10"), "give both input and output prices"},
		{"a price given twice", rl("limit 1 usd/day", "  price gpt-4o input 1 output 1\n  price gpt-4o input 2 output 2"), "given twice"},
		{"a price on a constant cost", "rate_limit {\n tree llm {\n  tier org {header.X-Org} {\n   limit 1 usd/day\n  }\n }\n cost usd 5 {\n  price gpt-4o input 1 output 1\n }\n}", `"price"`},
		{"a money limit with a burst", rl("limit 1 usd/day burst 2", "  price gpt-4o input 1 output 1"), ""},
		{"a threshold over 100%", rl("limit 1 usd/day alert 50% 120%", "  price gpt-4o input 1 output 1"), "from 1% to 100%"},
		{"thresholds out of order", rl("limit 1 usd/day alert 80% 50%", "  price gpt-4o input 1 output 1"), "ascending"},
		{"a threshold not a percentage", rl("limit 1 usd/day alert 50", "  price gpt-4o input 1 output 1"), "alert needs thresholds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parse(t, tc.input)
			if err == nil && tc.want == "" {
				// Checked when provisioned: a money limit takes no burst.
				h.trees = append(h.trees[:0], h.Trees...)
				if err = h.provisionMoney(); err == nil || !strings.Contains(err.Error(), "takes no burst") {
					t.Fatalf("provisioned: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Testfile:") {
				t.Fatalf("error %v\nwant it to contain %q and the line", err, tc.want)
			}
		})
	}
}

// TestRefusalBodies: with refusal_body openai or anthropic, a refusal
// through Caddy is the provider's error object, with Cascade's message and
// the rate-limit headers.
func TestRefusalBodies(t *testing.T) {
	up := newFakeLLM(t, 10, 10)
	for _, tc := range []struct{ format, want string }{
		{"openai", `{"error":{"code":"rate_limit_exceeded","message":"Too Many Requests: %s","param":null,"type":"tokens"}}`},
		{"anthropic", `{"error":{"message":"Too Many Requests: %s","type":"rate_limit_error"},"type":"error"}`},
	} {
		t.Run(tc.format, func(t *testing.T) {
			base, _ := proxiedSite(t, up.srv.URL, `
		tree llm {
			tier org {header.X-Org} {
				limit 100 tokens/day
			}
		}
		cost tokens llm
		refusal_body `+tc.format)
			if r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme"); r.status != 200 {
				t.Fatalf("first call: %d %s", r.status, r.body)
			}
			r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme")
			if r.status != 429 || r.header.Get("Content-Type") != "application/json" || r.header.Get("Retry-After") == "" {
				t.Fatalf("over the limit: %d %v %s", r.status, r.header, r.body)
			}
			var body map[string]any
			if err := json.Unmarshal([]byte(r.body), &body); err != nil {
				t.Fatal(err)
			}
			inner, _ := body["error"].(map[string]any)
			msg, _ := inner["message"].(string)
			detail, ok := strings.CutPrefix(msg, "Too Many Requests: ")
			if !ok || !strings.Contains(detail, "llm/org") {
				t.Fatalf("message %q", msg)
			}
			got, _ := json.Marshal(body)
			if want := fmt.Sprintf(tc.want, mustJSONString(detail)); string(got) != want {
				t.Fatalf("body %s\nwant %s", got, want)
			}
		})
	}
}

// mustJSONString is s as it reads inside a JSON string.
func mustJSONString(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

// TestMoneyBudgetAcrossInstances: three Caddy processes on one Redis share
// a budget of 0.02 usd; callers on all three at once spend it, and never
// more: each call's estimate (its max output at the output price) bounds
// what it costs, so the reconciled charges stay within the budget, and
// the budget is spent to within the calls in flight.
func TestMoneyBudgetAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	up := newFakeLLM(t, 10, 50) // at most the 50 output tokens asked for: 25 + 500 micro-dollars a call
	const perCall, budget = 525, 20_000
	bin := buildCaddy(t)
	storeBlock := redisStore().block(t)
	var ps []*caddyProcess
	for range 3 {
		ps = append(ps, newCaddyProcess(t, bin, func(port, adminPort int) string {
			return fmt.Sprintf(`{
%s}
http://127.0.0.1:%d {
	handle /__health {
		respond "up"
	}
	handle {
		rate_limit {
			tree llm {
				tier org {header.X-Org} {
					limit 0.02 usd/day calendar
				}
			}
			cost usd llm {
				price gpt-4o input 2.50 output 10
				reconcile {
					provider openai
				}
			}
			%s
		}
		reverse_proxy %s
	}
}
`, globals(adminPort), port, storeBlock, strings.TrimPrefix(up.srv.URL, "http://"))
		}))
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, p := range ps {
		for range 2 {
			wg.Go(func() {
				for refused := 0; refused < 3; {
					r := post(t, p.site+"v1/chat/completions", chat("gpt-4o"), "X-Org: acme")
					switch r.status {
					case 200:
						admitted.Add(1)
					case 429:
						refused++
						time.Sleep(20 * time.Millisecond) // reconciliation may give some back
					default:
						t.Errorf("status %d %s", r.status, r.body)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	spent := admitted.Load() * perCall
	t.Logf("%d calls admitted, %d micro-dollars spent of %d", admitted.Load(), spent, budget)
	if spent > budget {
		t.Fatalf("%d calls admitted: %d micro-dollars spent of a budget of %d", admitted.Load(), spent, budget)
	}
	if spent < budget-6*535 { // six callers' estimates (535 each) in flight at the end, at most
		t.Fatalf("%d calls admitted: only %d micro-dollars spent of %d", admitted.Load(), spent, budget)
	}
}

// TestBudgetAlerts: two instances on one Redis share a limit of 10 a day
// with alerts at 50%, 80% and 100%: the webhook hears each threshold once,
// when the fifth, eighth and tenth requests cross it, whichever instance
// decided them, with the limit's numbers.
func TestBudgetAlerts(t *testing.T) {
	var mu sync.Mutex
	var events []alert.Event
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var e alert.Event
		if err := json.NewDecoder(r.Body).Decode(&e); err != nil || r.Header.Get("Authorization") != "Bearer s3cret" {
			t.Errorf("webhook: %v, Authorization %q", err, r.Header.Get("Authorization"))
		}
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	cf := fmt.Sprintf(`rate_limit {
	tree api {
		tier org {http.request.header.X-Org} {
			limit 10/day alert 50%% 80%% 100%%
		}
	}
	alerts {
		webhook %s/alerts
		header Authorization "Bearer s3cret"
	}
	%s
}`, hook.URL, redisStore().block(t))
	parsed, err := parse(t, cf)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(parsed)
	var instances []*Handler
	for range 2 {
		h := provisionJSON(t, string(raw))
		t.Cleanup(func() { _ = h.Cleanup() })
		instances = append(instances, h)
	}
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error { return nil })
	for i := range 12 {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Org", "acme")
		repl := caddyhttp.NewTestReplacer(r)
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
		w := httptest.NewRecorder()
		err := instances[i%2].ServeHTTP(w, r, next)
		if i < 10 && (err != nil || w.Code != 200) {
			t.Fatalf("request %d: %d %v %s", i+1, w.Code, err, w.Body)
		}
	}
	deadline := time.Now().Add(propagation)
	for {
		mu.Lock()
		n := len(events)
		mu.Unlock()
		if n >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a chance for a wrong fourth to show, not a wait for a right one
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 3 {
		t.Fatalf("%d alerts: %+v", len(events), events)
	}
	for k, want := range []struct{ threshold, used int }{{50, 5}, {80, 8}, {100, 10}} {
		e := events[k]
		if e.Threshold != want.threshold || e.Used != int64(want.used) || e.Capacity != 10 || e.Tree != "api" || e.Tier != "org" ||
			e.Value != "acme" || e.Limit != "10/day" || e.Dimension != "requests" || !e.PeriodEnd.After(time.Now()) {
			t.Errorf("alert %d: %+v, want threshold %d at %d used of 10", k+1, e, want.threshold, want.used)
		}
	}
}

// TestFallbackModel: gpt-4o refused by its own limit is served as
// gpt-4o-mini instead: the upstream gets the body with only its model
// changed, the client a 200 that says which model served it, and the
// refused model is charged nothing; a limit no model avoids still refuses.
func TestFallbackModel(t *testing.T) {
	up := newFakeLLM(t, 10, 10)
	base, api := proxiedSite(t, up.srv.URL, `
		tree llm {
			tier org {header.X-Org} {
				limit 200 tokens/day
			}
			tier model {http.rate_limit.model} {
				limit 10000 tokens/day
				value gpt-4o {
					limit 100 tokens/day
				}
			}
		}
		cost tokens llm
		fallback_model gpt-4o gpt-4o-mini`)
	// Each call is estimated at 64 tokens: gpt-4o's 100 take one.
	if r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme"); r.status != 200 || r.header.Get("Cascade-Fallback-Model") != "" {
		t.Fatalf("first call: %d %v %s", r.status, r.header, r.body)
	}
	r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme")
	if r.status != 200 || r.header.Get("Cascade-Fallback-Model") != "gpt-4o-mini" {
		t.Fatalf("second call: %d %v %s", r.status, r.header, r.body)
	}
	up.mu.Lock()
	got := string(up.bodies[len(up.bodies)-1])
	up.mu.Unlock()
	if got != chat("gpt-4o-mini") {
		t.Fatalf("the upstream got %s\nwant %s", got, chat("gpt-4o-mini"))
	}
	left, _ := remainingOf(t, api, "tree=llm&org=acme&model=gpt-4o")
	if left["model"] != 100-64 {
		t.Fatalf("gpt-4o has %d tokens left, want %d: the refused decision charged it", left["model"], 100-64)
	}
	left, _ = remainingOf(t, api, "tree=llm&org=acme&model=gpt-4o-mini")
	if left["model"] != 10000-64 || left["org"] != 200-128 {
		t.Fatalf("left: %v, want gpt-4o-mini and the organisation charged once more", left)
	}
	// The organisation's 200 tokens have 72 left: one more call, as
	// gpt-4o-mini; then the next is refused by a limit no fallback avoids.
	if r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme"); r.status != 200 || r.header.Get("Cascade-Fallback-Model") != "gpt-4o-mini" {
		t.Fatalf("third call: %d %v %s", r.status, r.header, r.body)
	}
	if r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme"); r.status != 429 || r.header.Get("Cascade-Fallback-Model") != "" ||
		!strings.Contains(r.body, "llm/org") {
		t.Fatalf("fourth call: %d %v %s", r.status, r.header, r.body)
	}
}

// TestFallbackConfigErrors: a cycle or a repeated model is refused with
// its line.
func TestFallbackConfigErrors(t *testing.T) {
	for _, tc := range []struct{ name, lines, want string }{
		{"a cycle", "fallback_model a b\n fallback_model b c a", "a cycle"},
		{"to itself", "fallback_model a a", "a cycle"},
		{"named twice", "fallback_model a b b", "named twice"},
		{"a model twice", "fallback_model a b\n fallback_model a c", "given twice"},
		{"no fallback", "fallback_model a", "usage"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, "rate_limit {\n zone z {\n  key {remote_host}\n  events 5\n  window 1m\n }\n "+tc.lines+"\n}")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "Testfile:") {
				t.Fatalf("error %v: want %q and the line", err, tc.want)
			}
		})
	}
}

// TestMoneyReconciledFromStreams: a call whose answer streams (SSE) is
// charged its reported usage at its model's price, exactly, for OpenAI and
// Anthropic alike.
func TestMoneyReconciledFromStreams(t *testing.T) {
	up := newFakeLLM(t, 100, 300)
	base, api := proxiedSite(t, up.srv.URL, `
		tree llm {
			tier org {header.X-Org} {
				limit 1 usd/day calendar
			}
		}
		cost usd llm {
			price gpt-4o input 2.50 output 10
			price claude-sonnet-4* input 3 output 15
			reconcile {
				provider auto
			}
		}`)
	settle := func(what string, want int64) { t.Helper(); settleOrg(t, api, what, want) }
	stream := strings.Replace(chat("gpt-4o"), `"max_tokens":50,`, `"max_tokens":50,"stream":true,"stream_options":{"include_usage":true},`, 1)
	if r := post(t, base+"/v1/chat/completions", stream, "X-Org: acme"); r.status != 200 || !strings.Contains(r.body, "data:") {
		t.Fatalf("OpenAI stream: %d %s", r.status, r.body)
	}
	settle("after an OpenAI stream", 1_000_000-3_250) // 100 × 2.50 + 300 × 10
	anthropic := strings.Replace(chat("claude-sonnet-4-5"), `"max_tokens":50,`, `"max_tokens":50,"stream":true,`, 1)
	if r := post(t, base+"/v1/messages", anthropic, "X-Org: acme"); r.status != 200 || !strings.Contains(r.body, "message_delta") {
		t.Fatalf("Anthropic stream: %d %s", r.status, r.body)
	}
	settle("after an Anthropic stream", 1_000_000-3_250-4_800) // 100 × 3 + 300 × 15
}

// TestFallbackNoPenalty: a refusal that a fallback avoids is no strike
// towards the model's penalty box: calls over gpt-4o's limit go on being
// served as gpt-4o-mini.
func TestFallbackNoPenalty(t *testing.T) {
	up := newFakeLLM(t, 10, 10)
	base, _ := proxiedSite(t, up.srv.URL, `
		tree llm {
			tier model {http.rate_limit.model} {
				limit 10000 tokens/day
				value gpt-4o {
					limit 100 tokens/day
				}
				penalty 10m after 2
			}
		}
		cost tokens llm
		fallback_model gpt-4o gpt-4o-mini`)
	for i := range 6 {
		r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme")
		if r.status != 200 || i > 0 && r.header.Get("Cascade-Fallback-Model") != "gpt-4o-mini" {
			t.Fatalf("call %d: %d %v %s", i+1, r.status, r.header, r.body)
		}
	}
}

// TestModelMatchReadsStrictly: a tree that applies by the model (match on
// {http.rate_limit.model}) cannot be stepped around with a body whose
// model cannot be read: too long, not JSON, or named in two cases; a model
// named in another case is read as Go's decoder reads it.
func TestModelMatchReadsStrictly(t *testing.T) {
	up := newFakeLLM(t, 10, 10)
	base, _ := proxiedSite(t, up.srv.URL, `
		tree premium {
			match {
				expression {http.rate_limit.model} == "gpt-4o"
			}
			tier org {header.X-Org} {
				limit 100 tokens/day
			}
		}
		tree all {
			tier org {header.X-Org} {
				limit 1000/min
			}
		}
		cost tokens llm {
			max_body_bytes 64KiB
		}`)
	if r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme"); r.status != 200 {
		t.Fatalf("first call: %d %s", r.status, r.body)
	}
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"over its limit", chat("gpt-4o"), 429},
		{"in another case", strings.Replace(chat("gpt-4o"), `"model"`, `"Model"`, 1), 429},
		{"named twice", strings.Replace(chat("gpt-4o"), `{`, `{"Model":"cheap",`, 1), 400},
		{"not JSON", strings.Replace(chat("gpt-4o"), `"max_tokens":50`, `"max_tokens":NaN`, 1), 400},
		{"too long", strings.Replace(chat("gpt-4o"), `"max_tokens":50`, `"max_tokens":50,"pad":"`+strings.Repeat("x", 70<<10)+`"`, 1), 413},
	} {
		if r := post(t, base+"/v1/chat/completions", tc.body, "X-Org: acme"); r.status != tc.status {
			t.Errorf("%s: %d, want %d: %.300s", tc.name, r.status, tc.status, r.body)
		}
	}
}

// TestBudgetAlertAtFull: the 100% alert of a money budget is sent, though
// the charge that spends it is reconciled after its response: the next
// call, refused, sees it.
func TestBudgetAlertAtFull(t *testing.T) {
	var mu sync.Mutex
	var thresholds []int
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var e alert.Event
		_ = json.NewDecoder(r.Body).Decode(&e)
		mu.Lock()
		thresholds = append(thresholds, e.Threshold)
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	up := newFakeLLM(t, 100, 300)
	base, _ := proxiedSite(t, up.srv.URL, fmt.Sprintf(`
		tree llm {
			tier org {header.X-Org} {
				limit 0.0103 usd/day calendar alert 50%% 100%%
			}
		}
		cost usd llm {
			price gpt-4o input 2.50 output 10
			reconcile {
				provider openai
			}
		}
		alerts {
			webhook %s
		}`, hook.URL))
	// 3,250 micro-dollars a call, of 10,300: the fourth call (its estimate,
	// about 540, fits the 550 left) overdraws.
	deadline := time.Now().Add(propagation)
	for {
		post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme")
		mu.Lock()
		got := slices.Clone(thresholds)
		mu.Unlock()
		if slices.Equal(got, []int{50, 100}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts at %v, want 50%% then 100%%", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOwnHeadersWin: an upstream that writes its own x-ratelimit-* (as
// OpenAI's API does) does not double Cascade's: the client reads one
// value per header, Cascade's, and the upstream's other headers pass.
func TestOwnHeadersWin(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ratelimit-limit-requests", "500")
		w.Header().Set("x-ratelimit-remaining-requests", "499")
		w.Header().Set("x-ratelimit-reset-requests", "120ms")
		w.Header().Set("openai-processing-ms", "12")
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","choices":[]}`)
	}))
	t.Cleanup(upstream.Close)
	base, _ := proxiedSite(t, upstream.URL, `
		tree llm {
			tier org {header.X-Org} {
				limit 2/min
			}
		}
		headers ietf openai`)
	r := post(t, base+"/v1/chat/completions", chat("gpt-4o"), "X-Org: acme")
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	for name, want := range map[string]string{"x-ratelimit-limit-requests": "2", "x-ratelimit-remaining-requests": "1", "openai-processing-ms": "12"} {
		if got := r.header.Values(name); len(got) != 1 || got[0] != want {
			t.Errorf("%s: %q, want %q alone", name, got, want)
		}
	}
}
