package cost

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestModel(t *testing.T) {
	long := strings.Repeat("m", maxModelName)
	tests := []struct {
		name, body, want string
	}{
		{"openai chat", `{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}],"max_tokens":64}`, "gpt-4o"},
		{"openai responses, model last", `{"instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]}],"max_output_tokens":100,"model":"gpt-4.1"}`, "gpt-4.1"},
		{"anthropic messages", `{"max_tokens":1024,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"Hello"}],"model":"claude-sonnet-4-5","metadata":{"user_id":"u1"}}`, "claude-sonnet-4-5"},
		{"legacy completions", `{"model":"gpt-3.5-turbo-instruct","prompt":"Say this is a test","max_tokens":7}`, "gpt-3.5-turbo-instruct"},
		{"whitespace around", " \n\t{ \"model\" : \"gpt-4o\" } \r\n", "gpt-4o"},
		{"escapes decoded", `{"model":"gpt\u002d4o"}`, "gpt-4o"},
		{"escaped key", `{"m\u006fdel":"gpt-4o"}`, "gpt-4o"},
		{"slash escape", `{"model":"accounts\/fireworks\/models\/llama"}`, "accounts/fireworks/models/llama"},
		{"unicode", `{"model":"modèle-\ud83d\ude00"}`, "modèle-😀"},
		{"nested model does not count", `{"messages":[{"role":"user","model":"evil","content":"x"}],"metadata":{"model":"evil"},"tools":[{"model":"evil"}]}`, ""},
		{"nested before top-level", `{"metadata":{"model":"evil"},"model":"gpt-4o"}`, "gpt-4o"},
		{"model text in a string does not count", `{"messages":[{"content":"\"model\":\"evil\""}]}`, ""},
		{"last duplicate counts, as upstream decoders read it", `{"model":"cheap","messages":[],"model":"expensive"}`, "expensive"},
		{"last duplicate not a string", `{"model":"cheap","model":null}`, ""},
		{"not a string", `{"model":42}`, ""},
		{"null", `{"model":null}`, ""},
		{"object", `{"model":{"name":"gpt-4o"}}`, ""},
		{"empty string", `{"model":""}`, ""},
		{"another case, as Go's decoder reads it", `{"Model":"gpt-4o"}`, "gpt-4o"},
		{"two cases: ambiguous", `{"model":"cheap","Model":"gpt-4o"}`, ""},
		{"no model", `{"messages":[]}`, ""},
		{"empty object", `{}`, ""},
		{"array body", `[{"model":"gpt-4o"}]`, ""},
		{"string body", `"model"`, ""},
		{"empty body", ``, ""},
		{"malformed after the model", `{"model":"gpt-4o","messages":[}`, ""},
		{"truncated", `{"model":"gpt-4o","messages":[{"content":"hi"`, ""},
		{"trailing data", `{"model":"gpt-4o"} {}`, ""},
		{"bad escape", `{"model":"gpt\x-4o"}`, ""},
		{"256 bytes is a name", `{"model":"` + long + `"}`, long},
		{"257 bytes is not", `{"model":"` + long + `m"}`, ""},
		{"257 bytes through escapes is not", `{"model":"` + long + `\u006d"}`, ""},
		{"invalid UTF-8", "{\"model\":\"gpt-\xff\"}", ""},
		{"raw control character", "{\"model\":\"gpt-\x01\"}", ""},
		{"escaped control character", `{"model":"gpt-\u0001"}`, "gpt-\x01"},
		{"lone surrogate becomes U+FFFD", `{"model":"a\ud800"}`, "a\uFFFD"},
	}
	for _, tt := range tests {
		if got := modelName([]byte(tt.body)); got != tt.want {
			t.Errorf("%s: modelName(%.60q) = %q, want %q", tt.name, tt.body, got, tt.want)
		}
	}
}

func FuzzModel(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}`,
		`{"messages":[{"model":"x"}],"model":"gpt\u002d4o"}`,
		`{"model":"a","model":"b"}`,
		`{"m\u006fdel":1}`,
		`{"model":"a\ud800\udc00"}`,
		"{\"model\":\"\xff\"}",
		`[{"model":"x"}]`, `{"model":`, `{"model":"x"`, ``, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"Model":"a","model":"b"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got := modelName(body) // must not panic, whatever the input
		var members map[string]json.RawMessage
		if json.Unmarshal(body, &members) != nil || members == nil || jsonDepth(body) > maxJSONDepth {
			// Not a JSON object (or nested past the package's bound).
			if got != "" && json.Valid(body) && jsonDepth(body) <= maxJSONDepth {
				t.Fatalf("modelName(%q) = %q for a body that is not an object", body, got)
			}
			return
		}
		// The member's name in any case counts, unless two spellings are
		// there (ambiguous: no model).
		var spellings []string
		for k := range members {
			if strings.EqualFold(k, "model") {
				spellings = append(spellings, k)
			}
		}
		var want string
		if len(spellings) == 1 {
			if raw := members[spellings[0]]; len(raw) > 0 && raw[0] == '"' {
				if err := json.Unmarshal(raw, &want); err != nil {
					t.Fatalf("decoding %s: %v", raw, err)
				}
				// encoding/json turns invalid UTF-8 into U+FFFD; Model says
				// such a member is no name.
				if len(want) > maxModelName || !utf8.Valid(raw) {
					want = ""
				}
			}
		}
		if got != want {
			t.Fatalf("modelName(%q) = %q, encoding/json says %q", body, got, want)
		}
	})
}

// chatBody100KiB returns a chat completion body of about 100 KiB with the
// model as its first or its last member.
func chatBody100KiB(modelFirst bool) []byte {
	para := "The Pythagorean theorem states that in a right triangle, the square of the hypotenuse equals the sum of the squares of the other two sides.\nIt has \"many\" proofs. "
	var msgs []string
	for size := 0; size < 100<<10; {
		m, _ := json.Marshal(map[string]any{"role": "user", "content": strings.Repeat(para, 20)})
		msgs = append(msgs, string(m))
		size += len(m)
	}
	rest := `"messages":[` + strings.Join(msgs, ",") + `],"max_tokens":512,"temperature":0.2,"stream":true,"stream_options":{"include_usage":true},"metadata":{"model":"not-this-one"}`
	if modelFirst {
		return []byte(`{"model":"gpt-4o-mini",` + rest + `}`)
	}
	return []byte(`{` + rest + `,"model":"gpt-4o-mini"}`)
}

func BenchmarkModel100KiB(b *testing.B) {
	for _, tt := range []struct {
		name  string
		first bool
	}{{"model first", true}, {"model last", false}} {
		body := chatBody100KiB(tt.first)
		if got := modelName(body); got != "gpt-4o-mini" {
			b.Fatalf("Model = %q", got)
		}
		b.Run(tt.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				modelName(body)
			}
		})
	}
}

// TestReplaceModel: the model member's value is replaced, every other
// byte kept; a body with no model is left as it is.
func TestReplaceModel(t *testing.T) {
	for _, tc := range []struct{ body, name, want string }{
		{`{"model":"gpt-4o","messages":[]}`, "gpt-4o-mini", `{"model":"gpt-4o-mini","messages":[]}`},
		{`{ "messages": [{"model":"x"}],  "model" : "gpt\u002d4o" ,"n":1}`, "m", `{ "messages": [{"model":"x"}],  "model" : "m" ,"n":1}`},
		{`{"model":"a","model":"b"}`, "c", `{"model":"a","model":"c"}`}, // the one ModelOf reads: the last
		{`{"model":"a"}`, "quote\"d", `{"model":"quote\"d"}`},
		{`{"messages":[]}`, "m", `{"messages":[]}`},
		{`not json`, "m", `not json`},
	} {
		got, ok := ReplaceModel([]byte(tc.body), tc.name)
		if string(got) != tc.want || ok != (tc.body != tc.want) {
			t.Errorf("ReplaceModel(%s, %q) = %s, %v; want %s", tc.body, tc.name, got, ok, tc.want)
		}
		if ok && modelName(got) != tc.name {
			t.Errorf("the replaced body's model is %q, want %q", modelName(got), tc.name)
		}
	}
}

// TestModelOf: a body that is not a JSON object, or names its model in two
// cases, cannot be read; an empty one, or one without a model, names none.
func TestModelOf(t *testing.T) {
	for _, tc := range []struct {
		body, want string
		err        bool
	}{
		{``, "", false},
		{`  `, "", false},
		{`{"messages":[]}`, "", false},
		{`{"model":"gpt-4o"}`, "gpt-4o", false},
		{`{"model":"gpt-4o","temperature":NaN}`, "", true},
		{`{"model":"gpt-4o"`, "", true},
		{`["model"]`, "", true},
		{`{"model":"a","MODEL":"b"}`, "", true},
		{`{"model":"a","model":"b"}`, "b", false},
	} {
		got, err := ModelOf([]byte(tc.body))
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("ModelOf(%s) = %q, %v; want %q, error %v", tc.body, got, err, tc.want, tc.err)
		}
	}
}

// modelName is the model ModelOf reads in body ("" when none, or when it
// cannot read body).
func modelName(body []byte) string {
	name, _ := ModelOf(body)
	return name
}
