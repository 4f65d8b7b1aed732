package cost

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func llmReq(body string) *Request {
	return &Request{
		HTTP: httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)),
		Body: []byte(body),
	}
}

func TestLLMEstimate(t *testing.T) {
	tests := []struct {
		name     string
		provider string
		body     string
		in, out  int64
	}{
		{
			// Seed 003's demo: 56 characters → 14 tokens, plus max_tokens 50.
			name: "seed 003 demo",
			body: `{"model":"claude-haiku-4-5","max_tokens":50,"messages":[{"role":"user","content":"What is the Pythagorean theorem? Answer in one sentence."}]}`,
			in:   14, out: 50,
		},
		{
			// 28 + 22 characters → 13 tokens, one image → 1000, n=2 choices of 100.
			name: "openai chat with parts, image and n",
			body: `{"model":"gpt-4o","messages":[
				{"role":"system","content":"You are a helpful assistant."},
				{"role":"user","content":[
					{"type":"text","text":"Describe this picture."},
					{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"}}]}],
				"max_completion_tokens":100,"n":2}`,
			in: 1013, out: 200,
		},
		{
			// instructions 9 + "Hi" 2 + get_weather 11 + {"city":"Paris"} 16 + sunny 5 = 43 → 11, + image.
			name: "openai responses api",
			body: `{"model":"gpt-4.1","instructions":"Be brief.","max_output_tokens":500,"input":[
				{"role":"user","content":[{"type":"input_text","text":"Hi"},{"type":"input_image","image_url":"https://example.com/cat.png"}]},
				{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
				{"type":"function_call_output","call_id":"c1","output":"sunny"}]}`,
			in: 1011, out: 500,
		},
		{
			// 16 + 29 + 13 + 11 + 16 + 5 + 89 (tools JSON) = 179 → 45, + image.
			name: "anthropic messages with tools",
			body: `{"model":"claude-sonnet-4-5","max_tokens":1024,
				"system":[{"type":"text","text":"You are helpful.","cache_control":{"type":"ephemeral"}}],
				"tools":[{"name":"get_weather","description":"Weather by city","input_schema":{"type":"object"}}],
				"messages":[
					{"role":"user","content":"What is the weather in Paris?"},
					{"role":"assistant","content":[{"type":"text","text":"Let me check."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
					{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}]}`,
			in: 1045, out: 1024,
		},
		{
			// h é l l o ␠ 😀 \n: 8 code points (the emoji is a surrogate pair).
			name: "unicode escapes count code points",
			body: `{"messages":[{"role":"user","content":"h\u00e9llo \ud83d\ude00\n"}],"max_tokens":10}`,
			in:   2, out: 10,
		},
		{
			name: "raw utf-8 counts code points, not bytes",
			body: `{"messages":[{"role":"user","content":"日本語のテキスト"}],"max_tokens":0}`,
			in:   2, out: 0,
		},
		{
			name: "default max tokens",
			body: `{"messages":[{"role":"user","content":"hello"}]}`,
			in:   2, out: DefaultMaxOutputTokens,
		},
		{
			name: "null max tokens means absent",
			body: `{"messages":[{"role":"user","content":"hello"}],"max_tokens":null}`,
			in:   2, out: DefaultMaxOutputTokens,
		},
		{
			name: "escaped key is read as the upstream reads it",
			body: `{"messages":[{"role":"user","content":"hello"}],"m\u0061x_tokens":10}`,
			in:   2, out: 10,
		},
		{
			name: "largest output budget wins",
			body: `{"messages":[{"role":"user","content":"hello"}],"max_tokens":100,"max_completion_tokens":300}`,
			in:   2, out: 300,
		},
		{
			name:     "anthropic provider ignores openai members",
			provider: ProviderAnthropic,
			body:     `{"instructions":"xxxxxxxx","messages":[{"role":"user","content":"hello"}],"max_tokens":10,"max_output_tokens":99}`,
			in:       2, out: 10,
		},
		{
			name: "auto reads both",
			body: `{"instructions":"xxxxxxxx","messages":[{"role":"user","content":"hello"}],"max_tokens":10}`,
			in:   4, out: 10,
		},
		{
			// An unknown part counts by its JSON text: 28 characters → 7.
			name: "unknown part type",
			body: `{"messages":[{"role":"user","content":[{"type":"weird","foo":"bar"}]}],"max_tokens":1}`,
			in:   7, out: 1,
		},
		{
			name: "legacy completions prompt",
			body: `{"prompt":"hello world!","max_tokens":5}`,
			in:   3, out: 5,
		},
		{
			name: "openai tool calls in history",
			body: `{"messages":[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"a","content":"12345678"}],"max_tokens":1}`,
			// tool_calls JSON is 71 characters, content 8: 79 → 20.
			in: 20, out: 1,
		},
		{
			name: "empty body costs nothing",
			body: "  ",
			in:   0, out: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &LLM{Provider: tt.provider}
			if err := l.Provision(); err != nil {
				t.Fatal(err)
			}
			u, err := l.EstimateUsage(llmReq(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if u.Input != tt.in || u.Output != tt.out || u.Total != tt.in+tt.out || !u.Found {
				t.Fatalf("got in=%d out=%d total=%d, want in=%d out=%d", u.Input, u.Output, u.Total, tt.in, tt.out)
			}
			n, err := l.Estimate(llmReq(tt.body))
			if err != nil || n != tt.in+tt.out {
				t.Fatalf("Estimate = %d, %v", n, err)
			}
		})
	}
}

func TestLLMToolCallsLength(t *testing.T) {
	// Keeps the hand-computed number in the table above honest.
	if n := len(`[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]`); n != 71 {
		t.Fatalf("tool_calls JSON is %d characters", n)
	}
}

func TestLLMMalformed(t *testing.T) {
	bodies := []string{
		`{"messages":[`,
		`{"messages":[{"role":"user","content":"hi"}]} trailing`,
		`[{"messages":[]}]`,
		`{"max_tokens": 01}`,
		`{"a":"\x"}`,
		`{"a":tru}`,
		`not json`,
		strings.Repeat("[", 1000) + strings.Repeat("]", 1000),
		`{"messages":` + strings.Repeat(`[`, 500) + strings.Repeat(`]`, 500) + `}`,
	}
	for _, b := range bodies {
		l := &LLM{}
		_ = l.Provision()
		_, err := l.Estimate(llmReq(b))
		var ie *InputError
		if !errors.As(err, &ie) || ie.Status != 400 || ie.Type != TypeMalformedJSON {
			t.Errorf("%.40q: err = %v, want a malformed-json 400", b, err)
		}

		d := &LLM{OnMalformed: OnMalformedDefault, DefaultCost: 777}
		if err := d.Provision(); err != nil {
			t.Fatal(err)
		}
		if n, err := d.Estimate(llmReq(b)); n != 777 || err != nil {
			t.Errorf("%.40q with default: %d, %v", b, n, err)
		}
		if u, _ := d.EstimateUsage(llmReq(b)); u != (Usage{Input: 777, Output: 777, Total: 777, Found: true}) {
			t.Errorf("%.40q with default: usage %+v", b, u)
		}
	}
}

func TestLLMTruncatedIs413(t *testing.T) {
	l := &LLM{MaxBodyBytes: 10, OnMalformed: OnMalformedDefault, DefaultCost: 5}
	if err := l.Provision(); err != nil {
		t.Fatal(err)
	}
	r := llmReq(`{"messages":`)
	r.Truncated = true
	_, err := l.Estimate(r)
	var ie *InputError
	if !errors.As(err, &ie) || ie.Status != http.StatusRequestEntityTooLarge || ie.Type != TypeBodyTooLarge {
		t.Fatalf("err = %v, want 413 (a body over the bound is never charged the default)", err)
	}
}

type wordTokenizer struct{}

func (wordTokenizer) Count(s string) int64 { return int64(len(strings.Fields(s))) }

func TestLLMTokenizerIsPluggable(t *testing.T) {
	l := &LLM{Tokenizer: wordTokenizer{}}
	_ = l.Provision()
	n, err := l.Estimate(llmReq(`{"messages":[{"role":"user","content":"one two \"three\""},{"role":"user","content":[{"type":"text","text":"four five"}]}],"max_tokens":1}`))
	if err != nil || n != 6 {
		t.Fatalf("got %d %v, want 5 words + 1", n, err)
	}
	if got := (CharTokenizer{CharsPerToken: 4}).Count("héllo"); got != 2 {
		t.Fatalf("CharTokenizer = %d", got)
	}
}

func TestLLMCharsPerToken(t *testing.T) {
	l := &LLM{CharsPerToken: 2.5}
	_ = l.Provision()
	n, _ := l.Estimate(llmReq(`{"messages":[{"role":"user","content":"0123456789A"}],"max_tokens":0}`))
	if n != 5 { // ceil(11/2.5)
		t.Fatalf("got %d, want 5", n)
	}
}

func TestLLMValidate(t *testing.T) {
	bad := []LLM{
		{Provider: "gemini"},
		{CharsPerToken: -1},
		{DefaultMaxTokens: -1},
		{ImageTokens: -5},
		{OnMalformed: "ignore"},
		{OnMalformed: OnMalformedDefault}, // no default cost: a free pass
	}
	for _, l := range bad {
		if err := l.Provision(); err == nil {
			t.Errorf("%+v: Provision accepted it", l)
		}
	}
	l := &LLM{}
	if err := l.Provision(); err != nil || l.CharsPerToken != 4 || l.DefaultMaxTokens != 4096 || l.OnMalformed != "reject" {
		t.Fatalf("defaults: %+v %v", l, err)
	}
}

// TestLLMDeepContentStillCounts: content nested deeper than parts are read
// still counts (as its raw JSON text, an overestimate), never as nothing.
func TestLLMDeepContentStillCounts(t *testing.T) {
	l := &LLM{}
	if err := l.Provision(); err != nil {
		t.Fatal(err)
	}
	text := strings.Repeat("a", 4000)
	body := `{"max_tokens":1,"messages":[{"role":"user","content":` +
		strings.Repeat(`[{"type":"tool_result","content":`, 10) + `"` + text + `"` + strings.Repeat(`}]`, 10) + `}]}`
	got, err := l.Estimate(&Request{Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	if got < 1000+1 { // 4000 characters / 4, plus max_tokens
		t.Fatalf("estimate %d for 4000 characters nested ten parts deep", got)
	}
}
