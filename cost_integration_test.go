package cascade

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeLLM is an upstream that answers like OpenAI or Anthropic, in JSON or
// SSE, reporting the usage it is told to, and remembers the bodies it got.
type fakeLLM struct {
	mu     sync.Mutex
	usage  [2]int // input, output tokens to report
	bodies [][]byte
	srv    *httptest.Server
}

func newFakeLLM(t *testing.T, in, out int) *fakeLLM {
	f := &fakeLLM{usage: [2]int{in, out}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeLLM) setUsage(in, out int) {
	f.mu.Lock()
	f.usage = [2]int{in, out}
	f.mu.Unlock()
}

func (f *fakeLLM) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	in, out := f.usage[0], f.usage[1]
	f.mu.Unlock()
	if r.Header.Get("X-Probe") != "" { // a probe reports no usage: its estimate stands
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[]}`)
		return
	}
	stream := bytes.Contains(body, []byte(`"stream":true`))
	fl, _ := w.(http.Flusher)
	switch {
	case strings.HasPrefix(r.URL.Path, "/v1/messages") && stream: // Anthropic SSE: cumulative usage, last wins
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":%d,\"output_tokens\":1}}}\n\n", in)
		fl.Flush()
		for i := 1; i <= 3; i++ {
			fmt.Fprintf(w, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":%d}}\n\n", out*i/3)
			fl.Flush()
		}
		fmt.Fprint(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	case strings.HasPrefix(r.URL.Path, "/v1/messages"): // Anthropic JSON
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","content":[{"type":"text","text":"a² + b² = c²"}],"usage":{"input_tokens":%d,"output_tokens":%d}}`, in, out)
	case stream: // OpenAI SSE with stream_options.include_usage
		w.Header().Set("Content-Type", "text/event-stream")
		for _, tok := range []string{"a²", " + b²", " = c²"} {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":%q}}],\"usage\":null}\n\n", tok)
			fl.Flush()
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", in, out, in+out)
	default: // OpenAI JSON
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","choices":[{"message":{"role":"assistant","content":"a² + b² = c²"}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`, in, out, in+out)
	}
}

const pythagoras = `{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"What is the Pythagorean theorem? Answer in one sentence."}]%s}`

func post(t *testing.T, url, body string, headers ...string) resp {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	res, err := httpClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, string(b)}
}

func llmSite(t *testing.T, upstream, storeBlock, reconcile string) string {
	t.Helper()
	return llmSiteLimit(t, upstream, storeBlock, reconcile, "limit 3000 tokens/min")
}

// llmSiteLimit is llmSite with another limit line for its user tier.
func llmSiteLimit(t *testing.T, upstream, storeBlock, reconcile, limit string) string {
	t.Helper()
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree llm {
			tier user {header.X-User} {
				%s
			}
		}
		cost tokens llm {
			%s
		}
		headers ietf x_ratelimit retry_after openai
		%s
	}
	reverse_proxy %s {
		flush_interval -1
	}
}
`, port, limit, reconcile, storeBlock, strings.TrimPrefix(upstream, "http://")))
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

func remainingTokens(t *testing.T, r resp) int {
	t.Helper()
	n, err := strconv.Atoi(r.header.Get("x-ratelimit-remaining-tokens"))
	if err != nil {
		t.Fatalf("x-ratelimit-remaining-tokens %q (status %d %s)", r.header.Get("x-ratelimit-remaining-tokens"), r.status, r.body)
	}
	return n
}

// within checks a remaining count against its arithmetic, allowing for the
// bucket's refill (50 tokens/s) over the time the test has taken.
func within(t *testing.T, what string, got, want int, since time.Time) {
	t.Helper()
	slack := int(time.Since(since).Seconds()*50) + 1
	if got < want || got > want+slack {
		t.Fatalf("%s: remaining %d, want %d (+%d refill)", what, got, want, slack)
	}
}

// waitRemaining polls until reconciliation (asynchronous, off the request
// path) shows in the next decision.
func waitRemaining(t *testing.T, url, body string, cost int, want int, since time.Time, headers ...string) {
	t.Helper()
	deadline := time.Now().Add(propagation)
	for {
		r := post(t, url, body, append(headers, "X-Probe: 1")...)
		got := remainingTokens(t, r)
		slack := int(time.Since(since).Seconds()*50) + 1
		if got >= want-cost && got <= want-cost+slack {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("remaining %d, want %d after reconciliation", got, want-cost)
		}
		want -= cost // that probe was charged too
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSeed003LLMGateway: a 3,000-token bucket refilling 50 tokens/s, six
// requests of "What is the Pythagorean theorem? Answer in one sentence."
// with max_tokens 50. Each is estimated at ceil(56/4) + 50 = 64 tokens, so
// all six pass and 3,000 − 384 = 2,616 remain. Then the fake upstream's real
// usage (30 in + 870 out = 900) replaces the estimate: a debt of 836 per
// request that the next decisions see.
func TestSeed003LLMGateway(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		up := newFakeLLM(t, 30, 870)
		url := llmSite(t, up.srv.URL, storeBlock, "") + "/v1/chat/completions"
		start := time.Now()
		body := fmt.Sprintf(pythagoras, "")
		var last resp
		for i := 0; i < 6; i++ {
			last = post(t, url, body, "X-User: alice")
			if last.status != 200 {
				t.Fatalf("request %d: %d %s", i, last.status, last.body)
			}
		}
		within(t, "after six estimated requests", remainingTokens(t, last), 3000-6*64, start)
		if !bytes.Equal(up.bodies[0], []byte(body)) {
			t.Fatalf("upstream got %q, want the body byte for byte", up.bodies[0])
		}

		// Same again with reconciliation from the upstream's usage.
		url = llmSite(t, up.srv.URL, storeBlock, "reconcile {\n provider openai\n }") + "/v1/chat/completions"
		start = time.Now()
		r := post(t, url, body, "X-User: bob")
		within(t, "bob's first request", remainingTokens(t, r), 3000-64, start)
		// actual 900 − estimate 64: a debt of 836
		waitRemaining(t, url, body, 64, 3000-900, start, "X-User: bob")

		// A refund: the upstream used fewer tokens than estimated.
		up.setUsage(10, 4)
		start = time.Now()
		r = post(t, url, body, "X-User: carol")
		within(t, "carol's first request", remainingTokens(t, r), 3000-64, start)
		waitRemaining(t, url, body, 64, 3000-14, start, "X-User: carol")
	})
}

// TestReconcileStreamsAndProviders: usage read from OpenAI and Anthropic,
// JSON and SSE, passed through unbuffered; the last cumulative Anthropic
// value wins (not the sum).
func TestReconcileStreamsAndProviders(t *testing.T) {
	up := newFakeLLM(t, 100, 300)
	tests := []struct {
		name, path, stream string
	}{
		{"openai json", "/v1/chat/completions", ""},
		{"openai sse", "/v1/chat/completions", `,"stream":true,"stream_options":{"include_usage":true}`},
		{"anthropic json", "/v1/messages", ""},
		{"anthropic sse", "/v1/messages", `,"stream":true`},
	}
	eachStore(t, func(t *testing.T, storeBlock string) {
		base := llmSite(t, up.srv.URL, storeBlock, "reconcile {\n provider auto\n }")
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				user := fmt.Sprintf("X-User: u%d", i)
				body := fmt.Sprintf(pythagoras, tt.stream)
				start := time.Now()
				r := post(t, base+tt.path, body, user)
				if r.status != 200 {
					t.Fatalf("%d %s", r.status, r.body)
				}
				if tt.stream != "" && !strings.Contains(r.body, "data:") {
					t.Fatalf("stream body not passed through: %q", r.body)
				}
				waitRemaining(t, base+tt.path, body, 64, 3000-400, start, user)
			})
		}
	})
}

// TestLLMBadInput: malformed bodies get a clear 400 and never reach the
// upstream; large bodies that fit reach it byte for byte.
func TestLLMBadInput(t *testing.T) {
	up := newFakeLLM(t, 1, 1)
	url := llmSite(t, up.srv.URL, memoryStore().block(t), "max_body_bytes 64KiB") + "/v1/chat/completions"
	r := post(t, url, `{"messages":[{"role":"user","content":"unterminated`, "X-User: a")
	if r.status != http.StatusBadRequest || !strings.Contains(r.header.Get("Content-Type"), "problem+json") {
		t.Fatalf("malformed JSON: %d %s", r.status, r.body)
	}
	r = post(t, url, `{"messages":[{"role":"user","content":"`+strings.Repeat("x", 70<<10)+`"}]}`, "X-User: a")
	if r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d %s", r.status, r.body)
	}
	if len(up.bodies) != 0 {
		t.Fatalf("refused requests reached the upstream: %d", len(up.bodies))
	}
	big := `{"max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("y", 8000) + `"}]}`
	if r := post(t, url, big, "X-User: b"); r.status != 200 {
		t.Fatalf("8 KB body: %d %s", r.status, r.body)
	}
	if sha256.Sum256(up.bodies[0]) != sha256.Sum256([]byte(big)) {
		t.Fatal("the upstream did not get the body byte for byte")
	}
}

// TestGraphQLCost: GraphQL queries are charged their complexity; hostile
// queries are refused with a 400 problem before the upstream sees them;
// extensions.cost in the response reconciles.
func TestGraphQLCost(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		var hits int
		var mu sync.Mutex
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits++
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			body, _ := io.ReadAll(r.Body)
			if !bytes.Contains(body, []byte("repositories")) { // a probe: it costs what it was estimated
				io.WriteString(w, `{"data":{},"extensions":{"cost":{"requestedQueryCost":2,"actualQueryCost":2}}}`)
				return
			}
			io.WriteString(w, `{"data":{},"extensions":{"cost":{"requestedQueryCost":301,"actualQueryCost":41}}}`)
		}))
		defer upstream.Close()
		port := freePort(t)
		startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree gql {
			tier client {header.X-Client} {
				limit 1000 points/h
			}
		}
		cost points graphql {
			max_depth 7
			max_aliases 3
			reconcile {
				provider graphql
			}
		}
		headers ietf x_ratelimit retry_after
		%s
	}
	reverse_proxy %s
}
`, port, storeBlock, strings.TrimPrefix(upstream.URL, "http://")))
		url := fmt.Sprintf("http://127.0.0.1:%d/graphql", port)
		q := func(query string) string { b, _ := json.Marshal(map[string]string{"query": query}); return string(b) }

		query := `{ viewer { repositories(first: 100) { nodes { name issues(first: 2) { nodes { title } } } } } }`
		r := post(t, url, q(query), "X-Client: c1")
		if r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
		// fields model: viewer 1 + repositories 1 + 100 × (nodes 1 + name 1 + issues 1 + 2 × (nodes 1 + title 1)) = 702
		if est := 1000 - atoi(t, r.header.Get("X-RateLimit-Remaining")); est != 702 {
			t.Fatalf("estimated %d points, want 702", est)
		}
		// the upstream said the query cost 41: a later decision sees the
		// refund (each probe costs its 2 points, however many it takes)
		deadline := time.Now().Add(propagation)
		for probes := 1; ; probes++ {
			r = post(t, url, q(`{ viewer { login } }`), "X-Client: c1")
			if rem := atoi(t, r.header.Get("X-RateLimit-Remaining")); rem >= 1000-41-2*probes {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("refund from extensions.cost not seen: remaining %s", r.header.Get("X-RateLimit-Remaining"))
			}
			time.Sleep(20 * time.Millisecond)
		}

		mu.Lock()
		before := hits
		mu.Unlock()
		for name, bad := range map[string]string{
			"alias bomb":     `{ a: viewer { login } b: viewer { login } c: viewer { login } d: viewer { login } }`,
			"too deep":       `{ a { b { c { d { e { f { g { h } } } } } } } }`,
			"fragment cycle": `query { ...A } fragment A on Query { ...B } fragment B on Query { ...A }`,
			"syntax":         `{ viewer { login `,
		} {
			r := post(t, url, q(bad), "X-Client: c2")
			if r.status != http.StatusBadRequest {
				t.Errorf("%s: status %d %s", name, r.status, r.body)
				continue
			}
			r.problem(t)
		}
		mu.Lock()
		defer mu.Unlock()
		if hits != before {
			t.Errorf("hostile queries reached the upstream")
		}
	})
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return n
}

// TestStreamIsNotBuffered: with reconciliation on, an SSE stream reaches
// the client event by event. The upstream holds its last event (with the
// usage) until the client has read the first one: a tap that buffered the
// stream would deadlock here.
func TestStreamIsNotBuffered(t *testing.T) {
	firstSeen := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a²\"}}],\"usage\":null}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-firstSeen:
		case <-time.After(5 * time.Second):
			return // the client never saw the first event: it was buffered
		}
		io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":30,\"total_tokens\":50}}\n\ndata: [DONE]\n\n")
	}))
	defer upstream.Close()
	url := llmSite(t, upstream.URL, memoryStore().block(t), "reconcile {\n provider openai\n }") + "/v1/chat/completions"
	req, _ := http.NewRequest("POST", url, strings.NewReader(fmt.Sprintf(pythagoras, `,"stream":true`)))
	req.Header.Set("X-User", "s")
	res, err := httpClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	buf := make([]byte, 4096)
	n, err := res.Body.Read(buf)
	if err != nil || !strings.Contains(string(buf[:n]), "a²") {
		t.Fatalf("first event: %q, %v", buf[:n], err)
	}
	close(firstSeen)
	rest, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream ended early: %q", rest)
	}
}

// TestRequestsOutsideACostsTree: a tree counts tokens under /v1 only, a
// requests-only tree counts /upload. A request no limit applies to is passed
// through untouched, its usage report included (reconciling it panicked:
// nothing was charged); one whose limits count no tokens never has its body
// read as a chat request, nor refused for not being one; /v1 still is.
func TestRequestsOutsideACostsTree(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`)
	}))
	defer upstream.Close()
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree llm {
			match {
				path /v1/*
			}
			tier user {header.X-User} {
				limit 100000 tokens/min
			}
		}
		tree uploads {
			match {
				path /upload*
			}
			tier all k {
				limit 1000/min
			}
		}
		cost tokens llm {
			reconcile {
				provider auto
			}
		}
		%s
	}
	reverse_proxy %s
}`, port, memoryStore().block(t), strings.TrimPrefix(upstream.URL, "http://")))
	post := func(path string, body []byte) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", fmt.Sprintf("http://127.0.0.1:%d%s", port, path), bytes.NewReader(body))
		req.Header.Set("X-User", "u")
		res, err := httpClient(t).Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	if code, body := post("/health", []byte(`{}`)); code != 200 || !strings.Contains(body, `"total_tokens":30`) {
		t.Errorf("/health (no limit applies): %d %s", code, body)
	}
	if code, _ := post("/upload", []byte("a=1&b=2")); code != http.StatusOK {
		t.Errorf("a form to /upload (no tokens counted there): %d", code)
	}
	if code, _ := post("/upload", bytes.Repeat([]byte{0xff}, 9<<20)); code != http.StatusOK {
		t.Errorf("a 9 MiB file to /upload: %d", code)
	}
	if code, _ := post("/v1/chat/completions", []byte("a=1&b=2")); code != http.StatusBadRequest {
		t.Errorf("a form to /v1/chat/completions (tokens counted): %d, want 400", code)
	}
}

// TestLLMBodyLimits: the llm estimator's max_body_bytes (default 8 MiB)
// holds even when another cost makes the handler read the body further.
func TestLLMBodyLimits(t *testing.T) {
	for _, tc := range []struct {
		name, costs, extra string
		size               int
		want               int
	}{
		{"default 8 MiB, 9 MiB body", "cost tokens llm", "", 9 << 20, http.StatusRequestEntityTooLarge},
		{"default 8 MiB, 2 MiB body", "cost tokens llm", "", 2 << 20, http.StatusOK},
		{"max_body_bytes 64KiB beside body_size, 200 KiB body", "cost tokens llm {\n max_body_bytes 64KiB\n }\n cost bytes body_size", "limit 100000000 bytes/min", 200 << 10, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := site(t, `
	tree t {
		tier all k {
			limit 100000000 tokens/min
			`+tc.extra+`
		}
	}
	`+tc.costs+"\n"+memoryStore().block(t))
			body := `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("a", tc.size) + `"}]}`
			res, err := httpClient(t).Post(url, "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tc.want {
				t.Fatalf("LLM body of %d bytes: status %d, want %d", len(body), res.StatusCode, tc.want)
			}
		})
	}
}

// TestReconcileNarrowsAcceptEncoding: on a route that reconciles, the
// upstream is asked only for encodings the usage tap reads (gzip when the
// client takes it, else identity), so that asking for br or zstd is no way
// around paying for what was used; other routes forward it untouched.
func TestReconcileNarrowsAcceptEncoding(t *testing.T) {
	var seen atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("Accept-Encoding"))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	defer up.Close()
	url := llmSite(t, up.URL, memoryStore().block(t), "reconcile {\n provider openai\n }") + "/v1/chat/completions"
	body := fmt.Sprintf(pythagoras, "")
	for _, tc := range []struct{ client, upstream string }{
		{"zstd, br, gzip;q=0.5", "gzip"},
		{"br", "identity"},
		{"zstd, gzip;q=0", "identity"},
		{"gzip;Q=0, br", "identity"},
		{"gzip;level=1; q=0, br", "identity"},
		{"gzip", "gzip"},
	} {
		post(t, url, body, "X-User: u", "Accept-Encoding: "+tc.client)
		if got := seen.Load(); got != tc.upstream {
			t.Errorf("client Accept-Encoding %q: upstream asked for %q, want %q", tc.client, got, tc.upstream)
		}
	}
}
