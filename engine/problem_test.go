package engine

import (
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/caddy-cascade/cascade/hierarchy"
)

// TestProblemBodies: each refusal body has the shape its readers expect:
// problem+json, OpenAI's error object, Anthropic's.
func TestProblemBodies(t *testing.T) {
	tokens := &hierarchy.Limit{Count: 10, Per: "min", Dimension: "tokens"}
	limited := &Decision{Closest: 0, Blocked: "api/user", Buckets: []hierarchy.Bucket{{Limit: tokens}}}
	for _, tc := range []struct {
		name, format, kind, contentType string
		status                          int
		d                               *Decision
		want                            string
	}{
		{"problem", BodyProblem, ReasonLimited, "application/problem+json", 429, limited,
			`{"type":"https://github.com/caddy-cascade/cascade#limited","title":"T","status":429,"detail":"D","blocked_by":"api/user","error":{"type":"rate_limit_error","code":"rate_limit_exceeded","message":"D"}}`},
		{"default", "", ReasonLimited, "application/problem+json", 429, limited,
			`{"type":"https://github.com/caddy-cascade/cascade#limited","title":"T","status":429,"detail":"D","blocked_by":"api/user","error":{"type":"rate_limit_error","code":"rate_limit_exceeded","message":"D"}}`},
		{"problem 400", "", "missing_key", "application/problem+json", 400, &Decision{Closest: -1},
			`{"type":"https://github.com/caddy-cascade/cascade#missing-key","title":"T","status":400,"detail":"D","error":{"type":"invalid_request_error","code":"missing_key","message":"D"}}`},
		{"openai 429 of tokens", BodyOpenAI, ReasonLimited, "application/json", 429, limited,
			`{"error":{"message":"T: D","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`},
		{"openai 429 of requests", BodyOpenAI, ReasonLimited, "application/json", 429, &Decision{Closest: -1},
			`{"error":{"message":"T: D","type":"requests","param":null,"code":"rate_limit_exceeded"}}`},
		{"openai 400", BodyOpenAI, "missing_key", "application/json", 400, &Decision{Closest: -1},
			`{"error":{"message":"T: D","type":"invalid_request_error","param":null,"code":"missing_key"}}`},
		{"openai 503", BodyOpenAI, "store_unavailable", "application/json", 503, &Decision{Closest: -1},
			`{"error":{"message":"T: D","type":"server_error","param":null,"code":"store_unavailable"}}`},
		{"anthropic 429", BodyAnthropic, ReasonLimited, "application/json", 429, limited,
			`{"type":"error","error":{"type":"rate_limit_error","message":"T: D"}}`},
		{"anthropic 413", BodyAnthropic, "body_too_large", "application/json", 413, &Decision{Closest: -1},
			`{"type":"error","error":{"type":"request_too_large","message":"T: D"}}`},
		{"anthropic 403", BodyAnthropic, "untrusted_proxy", "application/json", 403, &Decision{Closest: -1},
			`{"type":"error","error":{"type":"permission_error","message":"T: D"}}`},
		{"anthropic 503", BodyAnthropic, "store_unavailable", "application/json", 503, &Decision{Closest: -1},
			`{"type":"error","error":{"type":"api_error","message":"T: D"}}`},
		{"anthropic 400", BodyAnthropic, "missing_key", "application/json", 400, &Decision{Closest: -1},
			`{"type":"error","error":{"type":"invalid_request_error","message":"T: D"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			if err := NewProblem(tc.status, tc.kind, "T", "D", tc.d).WriteAs(w, tc.format); err != nil {
				t.Fatal(err)
			}
			if w.Code != tc.status || w.Header().Get("Content-Type") != tc.contentType {
				t.Fatalf("status %d, Content-Type %q", w.Code, w.Header().Get("Content-Type"))
			}
			if got, want := canonical(t, w.Body.String()), canonical(t, tc.want); got != want {
				t.Fatalf("body %s\nwant %s", got, want)
			}
			if got := w.Header().Get("Content-Length"); got != strconv.Itoa(w.Body.Len()) {
				t.Fatalf("Content-Length %q for %d bytes", got, w.Body.Len())
			}
		})
	}
}

// canonical is a JSON text with its objects' members in order.
func canonical(t *testing.T, s string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	out, _ := json.Marshal(v)
	return string(out)
}
