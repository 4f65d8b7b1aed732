package cascade

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// reportEndpoint is a provisioned decision endpoint charging each org the
// tokens of its chat completions, reconciled from reports of at most
// 4096 bytes, and its caller: serve hands it a request as Caddy would
// from a trusted proxy.
func reportEndpoint(t testing.TB) (h *Handler, serve func(r *http.Request) *httptest.ResponseRecorder) {
	h, err := parse(t, `rate_limit {
		forwarded {
			report /report
			max_report_bytes 4096
		}
		tree llm {
			tier org {http.request.header.X-Org} {
				limit 1000000000 tokens/h
			}
		}
		cost tokens llm {
			reconcile
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Cleanup() })
	return h, func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, nil)
		caddyhttp.SetVar(r.Context(), caddyhttp.TrustedProxyVarKey, true)
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "203.0.113.7")
		if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			t.Error("a decision endpoint called its next handler")
			return nil
		})); err != nil {
			t.Error(err)
		}
		return w
	}
}

// decideChat has such an endpoint decide a chat completion of org, and
// returns the decision's id, under which it is reported.
func decideChat(tb testing.TB, serve func(r *http.Request) *httptest.ResponseRecorder, org string) string {
	tb.Helper()
	r := httptest.NewRequest("POST", "http://endpoint/", strings.NewReader(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`))
	r.Header.Set("X-Forwarded-Method", "POST")
	r.Header.Set("X-Forwarded-Uri", "/v1/chat/completions")
	r.Header.Set("X-Org", org)
	r.Header.Set("Content-Type", "application/json")
	w := serve(r)
	id := w.Header().Get(decisionHeader)
	if w.Code != 200 || id == "" {
		tb.Fatalf("decision: %d %q %s", w.Code, id, w.Body)
	}
	return id
}

// FuzzServeReport: whatever body a front end reports (JSON, an event
// stream, gzip or not, truncated, too long), the report endpoint answers
// without panicking, and the usage readers read it without panicking. A
// decision is held once, and reported with the first input (204); the
// others report a decision no longer held (404) or too long a body (413),
// and their usage is read as a held decision's would be.
func FuzzServeReport(f *testing.F) {
	h, serve := reportEndpoint(f)
	id := decideChat(f, serve, "fuzz")
	held := &pendingDecision{costs: []int{0}}
	var reported bool
	f.Add("application/json", "", []byte(`{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`))
	f.Add("text/event-stream", "", []byte("data: {\"usage\":{\"input_tokens\":5}}\n\ndata: [DONE]\n\n"))
	f.Add("application/json", "gzip", []byte("\x1f\x8b\x08\x00\x00\x00\x00\x00"))
	f.Add("application/json", "", []byte(`{"usage":{"total_tokens":-99999999999999999999}}`))
	f.Add("", "br", []byte(`nope`))
	f.Fuzz(func(t *testing.T, contentType, encoding string, body []byte) {
		r := httptest.NewRequest("POST", "http://endpoint/report", bytes.NewReader(body))
		r.Header.Set(decisionHeader, id)
		r.Header.Set("Content-Type", contentType)
		r.Header.Set("Content-Encoding", encoding)
		w := serve(r)
		switch {
		case len(body) > 4096:
			if w.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("a report too long: %d %s", w.Code, w.Body)
			}
		case !reported:
			reported = true
			if w.Code != http.StatusNoContent {
				t.Fatalf("the report of the held decision: %d %s", w.Code, w.Body)
			}
		case w.Code != http.StatusNotFound:
			t.Fatalf("a report of a decision no longer held: %d %s", w.Code, w.Body)
		}
		for _, u := range h.reportedUsage(held, r.Header, body) {
			if u.Dimension != "tokens" {
				t.Fatalf("usage of %q", u.Dimension)
			}
		}
	})
}
