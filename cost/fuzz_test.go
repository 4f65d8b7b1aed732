package cost

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// jsonDepth returns the bracket nesting of valid JSON.
func jsonDepth(b []byte) int {
	depth, max, inStr, esc := 0, 0, false, false
	for _, c := range b {
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
			max = max0(max, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return max
}

func max0(a, b int) int {
	if a > b {
		return a
	}
	return b
}

func FuzzLLMEstimate(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"hello"}],"max_tokens":10}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"instructions":"x","input":[{"type":"function_call","name":"f","arguments":"{}"},{"type":"function_call_output","output":"y"}],"max_output_tokens":5}`,
		`{"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"r"}]}]}],"max_tokens":1}`,
		`{"prompt":["a","b"],"n":3,"tools":[{"type":"function"}]}`,
		`{"messages":[{"content":"h\u00e9\ud83d\ude00\n"}],"m\u0061x_tokens":-1}`,
		`{"messages":`, `[]`, `{"a":"\x"}`, "", `{"max_tokens":1e400}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		l := &LLM{}
		if err := l.Provision(); err != nil {
			t.Fatal(err)
		}
		u, err := l.EstimateUsage(&Request{HTTP: httptest.NewRequest(http.MethodPost, "/", nil), Body: body})
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) || ie.Status != 400 {
				t.Fatalf("error is not a 400 InputError: %v", err)
			}
			// Whatever encoding/json accepts as an object, we must read
			// too (within our nesting bound).
			trimmed := strings.TrimSpace(string(body))
			if json.Valid(body) && strings.HasPrefix(trimmed, "{") && jsonDepth(body) < maxJSONDepth {
				t.Fatalf("valid JSON refused: %v", err)
			}
			return
		}
		if u.Input < 0 || u.Output < 0 || u.Total < 0 || !u.Found {
			t.Fatalf("bad usage %+v", u)
		}
	})
}

func FuzzGraphQLCost(f *testing.F) {
	f.Add(githubScoreExample, `{}`, "", []byte(`[{"query":"{a}"}]`))
	f.Add(`query Q($n: Int = 3) { a(first: $n) { ...F } } fragment F on A { b c(last: 2) { d } }`, `{"n": 10}`, "Q", []byte(`{"query":"{ a }","variables":"{\"x\":1}"}`))
	f.Add(`query { ...A } fragment A on Q { ...B } fragment B on Q { ...A }`, `null`, "", []byte(`{"query": 5}`))
	f.Add(`{ a1: a a2: a @d @d }`, `[]`, "", []byte(`not json`))
	f.Add(`{ a(first: 99999999999999999999) { b(first: -1) { c } } }`, `{"n": "x"}`, "Nope", []byte(`{`))
	f.Add("{"+strings.Repeat("a{", 30)+strings.Repeat("}", 31), ``, "", []byte{})
	g := &GraphQL{MaxCost: 1 << 40}
	if err := g.Provision(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, query, vars, opName string, raw []byte) {
		m := map[string]any{"query": query, "operationName": opName}
		if json.Valid([]byte(vars)) {
			m["variables"] = json.RawMessage(vars)
		}
		body, err := json.Marshal(m)
		if err != nil {
			return
		}
		for _, b := range [][]byte{body, raw} {
			c, err := g.Analyze(&Request{HTTP: httptest.NewRequest(http.MethodPost, "/graphql", nil), Body: b})
			if err != nil {
				var ie *InputError
				if !errors.As(err, &ie) || ie.Status < 400 || ie.Status > 499 || ie.Type == "" {
					t.Fatalf("error is not a client InputError: %v", err)
				}
				continue
			}
			if c.Cost < 1 || c.Cost > g.MaxCost || c.Fields < 1 || c.Points < 1 || c.Requests < 0 || c.Nodes < 0 {
				t.Fatalf("bad complexity %+v", c)
			}
		}
	})
}

// usageChunked scans data through a Tap in writes of the given size.
func usageChunked(format string, data []byte, chunk int) Usage {
	if chunk <= 0 {
		chunk = len(data) + 1
	}
	return scanBody(format, "", string(data), chunk)
}

func FuzzUsageSSE(f *testing.F) {
	for _, s := range []string{openAIChatSSE, openAIResponsesSSE, anthropicSSE, "data: {\"usage\":\ndata: {\"input_tokens\":3}}\n\n", "data:[DONE]\r\n\r\n", ":comment\nevent: x\ndata: {\"a\\\"\":\"\\\\\"}\n\n"} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		whole := usageChunked(FormatSSE, data, 0)
		// The report must not depend on how the stream was cut.
		if got := usageChunked(FormatSSE, data, int(chunk)); got != whole {
			t.Fatalf("chunk %d: %+v, whole: %+v", chunk, got, whole)
		}
		if whole.Input < 0 || whole.Output < 0 || whole.Total < 0 {
			t.Fatalf("negative usage %+v", whole)
		}
	})
}

func FuzzUsageJSON(f *testing.F) {
	for _, s := range []string{openAIChatJSON, openAIResponsesJSON, anthropicJSON, graphQLCostJSON,
		`{"usage":{"input_tokens":1.5,"output_tokens":-2}}`, `{"a\"":[{"b":"}"}],"usage":{"prompt_tokens":1}}`, `[1,{"usage":{}}]`} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		whole := usageChunked(FormatJSON, data, 0)
		if got := usageChunked(FormatJSON, data, int(chunk)); got != whole {
			t.Fatalf("chunk %d: %+v, whole: %+v", chunk, got, whole)
		}
		// Differential check against encoding/json for the plain shape.
		var doc struct {
			Usage *struct {
				Input  *int64 `json:"input_tokens"`
				Output *int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		var keys map[string]json.RawMessage
		if json.Unmarshal(data, &keys) != nil || json.Unmarshal(data, &doc) != nil || doc.Usage == nil ||
			doc.Usage.Input == nil || doc.Usage.Output == nil || *doc.Usage.Input < 0 || *doc.Usage.Output < 0 {
			return
		}
		var uk map[string]json.RawMessage
		if json.Unmarshal(keys["usage"], &uk) != nil || len(uk) != 2 || len(keys) != 1 || strings.Contains(string(data), `\`) {
			return // other members or escapes: out of scope of this check
		}
		want := Usage{Input: *doc.Usage.Input, Output: *doc.Usage.Output, Found: true}
		want.Total = want.Input + want.Output
		if whole != want {
			t.Fatalf("got %+v, encoding/json reads %+v", whole, want)
		}
	})
}
