package cost

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Realistic upstream payloads, shaped like the providers' documented
// responses.
const (
	openAIChatJSON = `{"id":"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT","object":"chat.completion","created":1741569952,"model":"gpt-4.1-2025-04-14","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! The \"usage\": {\"total_tokens\": 999} in this text is not a report.","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":19,"completion_tokens":10,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default"}`

	openAIChatSSE = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n" +
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello \\\"usage\\\":{\\\"prompt_tokens\\\":5}\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n" +
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n" +
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":7,\"total_tokens\":19,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n" +
		"data: [DONE]\n\n"

	openAIResponsesJSON = `{"id":"resp_67ccd2bed1ec8190","object":"response","created_at":1741476542,"status":"completed","error":null,"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67ccd2bf","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove beneath a silver moon...","annotations":[]}]}],"parallel_tool_calls":true,"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123},"user":null,"metadata":{}}`

	openAIResponsesSSE = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"In a peaceful grove\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"In a peaceful grove beneath a silver moon...\"}]}],\"usage\":{\"input_tokens\":36,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":87,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":123}}}\n\n"

	anthropicJSON = `{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":100,"cache_read_input_tokens":50,"output_tokens":503,"service_tier":"standard"}}`

	anthropicSSE = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null,\"stop_sequence\":null},\"usage\":{\"output_tokens\":10}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"!\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

	graphQLCostJSON = `{"data":{"shop":{"name":"Snowdevil","products":{"edges":[{"node":{"title":"Board"}}]}}},"extensions":{"cost":{"requestedQueryCost":101,"actualQueryCost":46,"throttleStatus":{"maximumAvailable":1000.0,"currentlyAvailable":954,"restoreRate":50.0}}}}`
)

func TestUsageFromBodies(t *testing.T) {
	tests := []struct {
		name     string
		format   string // content type's format
		provider string
		body     string
		want     Usage
	}{
		{"openai chat json", FormatJSON, "", openAIChatJSON, Usage{Input: 19, Output: 10, Total: 29, Found: true}},
		{"openai chat sse", FormatSSE, "", openAIChatSSE, Usage{Input: 12, Output: 7, Total: 19, Found: true}},
		{"openai responses json", FormatJSON, "", openAIResponsesJSON, Usage{Input: 36, Output: 87, Total: 123, Found: true}},
		{"openai responses sse", FormatSSE, "", openAIResponsesSSE, Usage{Input: 36, Output: 87, Total: 123, Found: true}},
		{"anthropic json (cache counted as input)", FormatJSON, "", anthropicJSON, Usage{Input: 2245, Output: 503, CachedInput: 50, CacheWrite: 100, Total: 2748, Found: true}},
		{"anthropic sse (last cumulative value wins)", FormatSSE, "", anthropicSSE, Usage{Input: 25, Output: 15, Total: 40, Found: true}},
		{"anthropic sse, provider set", FormatSSE, ProviderAnthropic, anthropicSSE, Usage{Input: 25, Output: 15, Total: 40, Found: true}},
		{"anthropic delta repeating input", FormatSSE, "", strings.Replace(anthropicSSE, `"usage":{"output_tokens":15}`,
			`"usage":{"input_tokens":30,"cache_creation_input_tokens":0,"cache_read_input_tokens":4,"output_tokens":15}`, 1), Usage{Input: 34, Output: 15, CachedInput: 4, Total: 49, Found: true}},
		{"graphql extensions.cost", FormatJSON, "", graphQLCostJSON, Usage{Input: 0, Output: 0, Total: 46, Found: true}},
		{"graphql requested only", FormatJSON, ProviderGraphQL, `{"data":{},"extensions":{"cost":{"requestedQueryCost":12}}}`, Usage{Input: 0, Output: 0, Total: 12, Found: true}},
		{"graphql bare cost", FormatJSON, ProviderGraphQL, `{"extensions":{"cost":7},"data":null}`, Usage{Input: 0, Output: 0, Total: 7, Found: true}},
		{"provider filter ignores other shapes", FormatJSON, ProviderGraphQL, openAIChatJSON, Usage{}},
		{"openai provider ignores anthropic message_start", FormatSSE, ProviderOpenAI, anthropicSSE, Usage{Input: 0, Output: 15, Total: 15, Found: true}},
		{"crlf line endings", FormatSSE, "", strings.ReplaceAll(anthropicSSE, "\n", "\r\n"), Usage{Input: 25, Output: 15, Total: 40, Found: true}},
		{"cr line endings", FormatSSE, "", strings.ReplaceAll(openAIChatSSE, "\n", "\r"), Usage{Input: 12, Output: 7, Total: 19, Found: true}},
		{"multi-line data", FormatSSE, "", "data: {\"usage\":\ndata: {\"input_tokens\":3,\ndata: \"output_tokens\":4}}\n\n", Usage{Input: 3, Output: 4, Total: 7, Found: true}},
		{"usage first in the object", FormatJSON, "", `{"usage":{"prompt_tokens":1,"completion_tokens":2},"choices":[{"message":{"content":"x"}}]}`, Usage{Input: 1, Output: 2, Total: 3, Found: true}},
		{"ndjson: last document wins", FormatJSON, "", `{"usage":{"input_tokens":1,"output_tokens":1}}` + "\n" + `{"usage":{"input_tokens":5,"output_tokens":6}}`, Usage{Input: 5, Output: 6, Total: 11, Found: true}},
		{"nested usage is not a report", FormatJSON, "", `{"choices":[{"usage":{"prompt_tokens":9}}],"data":{"usage":{"input_tokens":9}}}`, Usage{}},
		{"error body", FormatJSON, "", `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`, Usage{}},
		{"not json", FormatJSON, "", `<html>Bad gateway</html>`, Usage{}},
		{"stream without usage", FormatSSE, "", strings.Split(openAIChatSSE, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[],")[0] + "data: [DONE]\n\n", Usage{}},
		{"anthropic stream cut after message_start", FormatSSE, "", anthropicSSE[:strings.Index(anthropicSSE, "event: message_delta")], Usage{}},
		{"cut in the middle of the usage event", FormatSSE, "", openAIChatSSE[:strings.Index(openAIChatSSE, "\"total_tokens\":19")+16], Usage{}},
		{"cut in the middle of a json body", FormatJSON, "", openAIChatJSON[:len(openAIChatJSON)-30], Usage{}},
		{"fractions truncate, negatives are zero", FormatJSON, "", `{"usage":{"input_tokens":12.7,"output_tokens":-3}}`, Usage{Input: 12, Output: 0, Total: 12, Found: true}},
		{"exponents are ignored", FormatJSON, "", `{"usage":{"input_tokens":1e3,"output_tokens":2}}`, Usage{Input: 0, Output: 2, Total: 2, Found: true}},
		{"escaped keys are never usage keys", FormatJSON, "", `{"us\u0061ge":{"input_tokens":5,"output_tokens":1}}`, Usage{}},
		{"escapes everywhere", FormatJSON, "", `{"a\"b":"\\","c":{"d\\":"x\"y"},"usage":{"input_tokens":5,"output_tokens":1}}`, Usage{Input: 5, Output: 1, Total: 6, Found: true}},
		{"escape-heavy content (linear time)", FormatJSON, "", `{"choices":[{"message":{"content":"` + strings.Repeat(`line\n`, 40000) + `"}}],"usage":{"input_tokens":1,"output_tokens":2}}`, Usage{Input: 1, Output: 2, Total: 3, Found: true}},
		{"huge numbers saturate", FormatJSON, "", `{"usage":{"input_tokens":99999999999999999999999,"output_tokens":1}}`, Usage{Input: 1<<63 - 1, Output: 1, Total: 1<<63 - 1, Found: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Whole, then in every chunk size: a report must not depend on
			// where the writes were cut.
			for _, chunk := range []int{len(tt.body) + 1, 1, 2, 3, 7, 64, 1000} {
				got := scanBody(tt.format, tt.provider, tt.body, chunk)
				if got != tt.want {
					t.Fatalf("chunk %d: got %+v, want %+v", chunk, got, tt.want)
				}
			}
		})
	}
}

func scanBody(format, provider, body string, chunk int) Usage {
	ct := "application/json"
	if format == FormatSSE {
		ct = "text/event-stream"
	}
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", ct)
	tap := NewTap(rec, TapConfig{Provider: provider})
	for b := []byte(body); len(b) > 0; {
		n := min(chunk, len(b))
		_, _ = tap.Write(b[:n])
		b = b[n:]
	}
	return tap.Usage()
}

// writeLog records each Write it receives.
type writeLog struct {
	http.ResponseWriter
	writes []string
}

func (w *writeLog) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *writeLog) Write(p []byte) (int, error) {
	w.writes = append(w.writes, string(p))
	return w.ResponseWriter.Write(p)
}

// inner hides everything but the ResponseWriter methods and Unwrap, like a
// middleware wrapper would; Flush must reach the recorder through Unwrap.
type inner struct{ w *httptest.ResponseRecorder }

func (i inner) Header() http.Header         { return i.w.Header() }
func (i inner) Write(p []byte) (int, error) { return i.w.Write(p) }
func (i inner) WriteHeader(c int)           { i.w.WriteHeader(c) }
func (i inner) Unwrap() http.ResponseWriter { return i.w }

func TestTapPassesThroughUnbuffered(t *testing.T) {
	rec := httptest.NewRecorder()
	log := &writeLog{ResponseWriter: inner{rec}}
	log.Header().Set("Content-Type", "text/event-stream")
	tap := NewTap(log, TapConfig{})
	events := strings.SplitAfter(anthropicSSE, "\n\n")
	for i, ev := range events {
		if _, err := tap.Write([]byte(ev)); err != nil {
			t.Fatal(err)
		}
		// The write reached the underlying writer now, whole and unchanged.
		if len(log.writes) != i+1 || log.writes[i] != ev {
			t.Fatalf("write %d not passed through at once", i)
		}
		if err := http.NewResponseController(tap).Flush(); err != nil {
			t.Fatalf("flush: %v", err)
		}
		if !rec.Flushed {
			t.Fatal("flush did not reach the recorder")
		}
	}
	if rec.Body.String() != anthropicSSE {
		t.Fatal("client body differs")
	}
	if u := tap.Usage(); u != (Usage{Input: 25, Output: 15, Total: 40, Found: true}) {
		t.Fatalf("usage %+v", u)
	}
	if tap.Status() != 200 || tap.Written() != int64(len(anthropicSSE)) || tap.Unwrap() != log {
		t.Fatalf("status %d written %d", tap.Status(), tap.Written())
	}
}

func TestTapHeader(t *testing.T) {
	rec := httptest.NewRecorder()
	tap := NewTap(rec, TapConfig{Header: "X-Actual-Cost"})
	tap.Header().Set("X-Actual-Cost", "17")
	tap.WriteHeader(200)
	_, _ = tap.Write([]byte(graphQLCostJSON)) // not parsed: the header rules
	if u := tap.Usage(); u != (Usage{Total: 17, Found: true}) {
		t.Fatalf("header: %+v", u)
	}

	// A trailer, set after the body, is read when Usage is called.
	rec = httptest.NewRecorder()
	tap = NewTap(rec, TapConfig{Header: "X-Actual-Cost"})
	tap.Header().Set("Trailer", "X-Actual-Cost")
	_, _ = tap.Write([]byte("{}"))
	tap.Header().Set("X-Actual-Cost", "2.5")
	if u := tap.Usage(); u != (Usage{Total: 3, Found: true}) {
		t.Fatalf("trailer: %+v", u)
	}

	rec = httptest.NewRecorder()
	tap = NewTap(rec, TapConfig{Header: "X-Actual-Cost"})
	tap.Header().Set("X-Actual-Cost", "lots")
	tap.WriteHeader(200)
	if u := tap.Usage(); u.Found {
		t.Fatalf("bad header value: %+v", u)
	}
}

func gzipped(s string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return b.Bytes()
}

func TestTapGzip(t *testing.T) {
	for _, tt := range []struct {
		ct, body string
		want     Usage
	}{
		{"application/json", openAIChatJSON, Usage{Input: 19, Output: 10, Total: 29, Found: true}},
		{"text/event-stream", anthropicSSE, Usage{Input: 25, Output: 15, Total: 40, Found: true}},
	} {
		z := gzipped(tt.body)
		for _, chunk := range []int{1, 13, len(z)} {
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", tt.ct)
			rec.Header().Set("Content-Encoding", "gzip")
			tap := NewTap(rec, TapConfig{})
			for b := z; len(b) > 0; {
				n := min(chunk, len(b))
				_, _ = tap.Write(b[:n])
				b = b[n:]
			}
			if u := tap.Usage(); u != tt.want {
				t.Fatalf("%s chunk %d: %+v", tt.ct, chunk, u)
			}
			if !bytes.Equal(rec.Body.Bytes(), z) {
				t.Fatal("the client must receive the gzip bytes unchanged")
			}
		}
	}

	// Corrupt gzip: no report, no hang, every byte still passed through.
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Encoding", "gzip")
	tap := NewTap(rec, TapConfig{})
	junk := bytes.Repeat([]byte("not gzip at all "), 10000)
	_, _ = tap.Write(junk)
	_, _ = tap.Write(junk)
	if u := tap.Usage(); u.Found || rec.Body.Len() != 2*len(junk) {
		t.Fatalf("corrupt gzip: %+v, %d bytes", u, rec.Body.Len())
	}

	// Past the decode bound the parser stops; the client gets everything.
	big := `{"pad":"` + strings.Repeat("x", 1<<20) + `","usage":{"input_tokens":1,"output_tokens":1}}`
	rec = httptest.NewRecorder()
	rec.Header().Set("Content-Encoding", "gzip")
	tap = NewTap(rec, TapConfig{MaxDecodedBytes: 64 << 10})
	_, _ = tap.Write(gzipped(big))
	if u := tap.Usage(); u.Found {
		t.Fatalf("decoded past the bound: %+v", u)
	}

	// Other encodings are not parsed.
	rec = httptest.NewRecorder()
	rec.Header().Set("Content-Encoding", "br")
	tap = NewTap(rec, TapConfig{})
	_, _ = tap.Write([]byte(openAIChatJSON))
	if u := tap.Usage(); u.Found {
		t.Fatalf("br body parsed: %+v", u)
	}
}

func TestTapConfigValidate(t *testing.T) {
	for _, c := range []TapConfig{{Format: "xml"}, {Provider: "cohere"}, {MaxDecodedBytes: -1}, {Header: "Bad Header"}} {
		if err := c.Provision(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	c := TapConfig{}
	if err := c.Provision(); err != nil || c.Format != FormatAuto || c.Provider != ProviderAuto {
		t.Fatalf("%+v %v", c, err)
	}
}

// TestTapThroughReverseProxy runs fake OpenAI, Anthropic and GraphQL
// upstreams behind a gateway that taps the response of a real reverse
// proxy, and checks what the client receives and what the tap reports.
func TestTapThroughReverseProxy(t *testing.T) {
	tests := []struct {
		name, ct, body string
		gzip           bool
		want           Usage
	}{
		{"openai json", "application/json", openAIChatJSON, false, Usage{Input: 19, Output: 10, Total: 29, Found: true}},
		{"openai sse", "text/event-stream", openAIChatSSE, false, Usage{Input: 12, Output: 7, Total: 19, Found: true}},
		{"openai responses sse", "text/event-stream; charset=utf-8", openAIResponsesSSE, false, Usage{Input: 36, Output: 87, Total: 123, Found: true}},
		{"anthropic json gzip", "application/json", anthropicJSON, true, Usage{Input: 2245, Output: 503, CachedInput: 50, CacheWrite: 100, Total: 2748, Found: true}},
		{"anthropic sse", "text/event-stream", anthropicSSE, false, Usage{Input: 25, Output: 15, Total: 40, Found: true}},
		{"graphql", "application/json", graphQLCostJSON, false, Usage{Input: 0, Output: 0, Total: 46, Found: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wire := []byte(tt.body)
			if tt.gzip {
				wire = gzipped(tt.body)
			}
			upstream := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.ct)
				if tt.gzip {
					w.Header().Set("Content-Encoding", "gzip")
				}
				if !strings.HasPrefix(tt.ct, "text/event-stream") {
					_, _ = w.Write(wire)
					return
				}
				for _, ev := range strings.SplitAfter(tt.body, "\n\n") {
					_, _ = io.WriteString(w, ev)
					w.(http.Flusher).Flush()
				}
			}))
			gw := newGateway(t, upstream.URL)

			req, _ := http.NewRequest(http.MethodPost, gw.srv.URL, strings.NewReader(`{}`))
			req.Header.Set("Accept-Encoding", "gzip") // keep the client from decoding
			resp, err := testClient(t).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !bytes.Equal(got, wire) {
				t.Fatalf("client received %d bytes (%v), upstream sent %d", len(got), err, len(wire))
			}
			if u := <-gw.usage; u != tt.want {
				t.Fatalf("usage %+v, want %+v", u, tt.want)
			}
		})
	}
}

type gateway struct {
	srv   *httptest.Server
	usage chan Usage
}

// newGateway runs a reverse proxy to upstream whose responses are tapped,
// each response's usage sent on the gateway's channel. It proxies through a
// transport of its own: http.DefaultTransport is shared by the whole test
// binary, and every httptest.Server's Close closes its idle connections.
func newGateway(t *testing.T, upstream string) *gateway {
	u, _ := url.Parse(upstream)
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.Transport = testTransport(t)
	g := &gateway{usage: make(chan Usage, 1)}
	g.srv = newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tap := NewTap(w, TapConfig{})
		proxy.ServeHTTP(tap, r)
		g.usage <- tap.Usage()
	}))
	return g
}

// newServer starts an httptest server that is closed when t ends.
func newServer(t testing.TB, h http.Handler) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// testTransport is a transport for t alone, its idle connections closed
// when t ends.
func testTransport(t testing.TB) *http.Transport {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// testClient is an HTTP client for t alone.
func testClient(t testing.TB) *http.Client {
	return &http.Client{Timeout: 20 * time.Second, Transport: testTransport(t)}
}

// TestTapStreamsEventByEvent proves the gateway does not hold events back:
// the upstream sends the next event only after the client has read the
// previous one through the tapped proxy. A buffering tap would deadlock and
// hit the deadline.
func TestTapStreamsEventByEvent(t *testing.T) {
	events := strings.SplitAfter(strings.TrimSuffix(anthropicSSE, "\n\n"), "\n\n")
	read := make(chan struct{})
	upstream := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i, ev := range events {
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
			if i < len(events)-1 {
				select {
				case <-read:
				case <-r.Context().Done():
					return
				}
			}
		}
	}))
	gw := newGateway(t, upstream.URL)

	resp, err := testClient(t).Get(gw.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i, ev := range events {
		got := make([]byte, len(ev))
		if _, err := io.ReadFull(br, got); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if string(got) != ev {
			t.Fatalf("event %d differs", i)
		}
		if i < len(events)-1 {
			read <- struct{}{}
		}
	}
	if u := <-gw.usage; u != (Usage{Input: 25, Output: 15, Total: 40, Found: true}) {
		t.Fatalf("usage %+v", u)
	}
}

func TestActualCost(t *testing.T) {
	u := Usage{Input: 1000, Output: 200, Total: 1200, Found: true}
	tests := []struct {
		a    Actual
		u    Usage
		want int64
	}{
		{Actual{}, u, 1200},
		{Actual{Mode: ActualTotal}, Usage{Input: 3, Output: 4, Found: true}, 7},
		{Actual{Mode: ActualInput}, u, 1000},
		{Actual{Mode: ActualOutput}, u, 200},
		{Actual{Mode: ActualWeighted, InputWeight: 1, OutputWeight: 4}, u, 1800},
		{Actual{Mode: ActualWeighted, InputWeight: 0.25, OutputWeight: 1}, Usage{Input: 3, Output: 1, Found: true}, 2}, // ceil(1.75)
		{Actual{Mode: ActualWeighted, OutputWeight: 1e300}, Usage{Output: 1e18, Found: true}, 1<<63 - 1},
		{Actual{Mode: ActualInput}, Usage{Input: -5, Found: true}, 0},
	}
	for _, tt := range tests {
		if err := tt.a.Validate(); err != nil {
			t.Fatalf("%+v: %v", tt.a, err)
		}
		if got := tt.a.Cost(tt.u); got != tt.want {
			t.Errorf("%+v on %+v = %d, want %d", tt.a, tt.u, got, tt.want)
		}
	}
	for _, bad := range []Actual{
		{Mode: "median"},
		{Mode: ActualWeighted},
		{Mode: ActualWeighted, InputWeight: -1, OutputWeight: 1},
		{Mode: ActualTotal, InputWeight: 2},
	} {
		if err := bad.Provision(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestEstimateAndActualAgree checks that one Actual weighs the LLM estimate
// and the reported usage the same way.
func TestEstimateAndActualAgree(t *testing.T) {
	l := &LLM{}
	_ = l.Provision()
	est, err := l.EstimateUsage(llmReq(`{"max_tokens":50,"messages":[{"role":"user","content":"What is the Pythagorean theorem? Answer in one sentence."}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a := Actual{Mode: ActualWeighted, InputWeight: 1, OutputWeight: 3}
	if got := a.Cost(est); got != 14+150 {
		t.Fatalf("weighted estimate %d", got)
	}
	actual := scanBody(FormatSSE, "", anthropicSSE, 5)
	if got := a.Cost(actual); got != 25+45 {
		t.Fatalf("weighted actual %d", got)
	}
}

func TestSSEFilter(t *testing.T) {
	tests := []struct {
		provider string
		data     string
		want     bool
	}{
		{"", `{"choices":[{"delta":{"content":"x"}}],"usage":null}`, false},
		{"", `{"choices":[],"usage":{"prompt_tokens":1}}`, true},
		{"", `{"usage" :  {"output_tokens":1}}`, true},
		{"", `{"type":"message_start","message":{"usage":{"input_tokens":1}}}`, true},
		{"", `{"delta":{"content":"the \"usage\":{ here"}}`, false},
		{"", `{"nousage":{"a":1}}`, false},
		{"", `{"extensions":{"cost":{"actualQueryCost":1}}}`, true},
		{ProviderOpenAI, `{"extensions":{"cost":1}}`, false},
		{ProviderGraphQL, `{"usage":{"input_tokens":1}}`, false},
		{"", `{`, false},
	}
	for _, tt := range tests {
		js := newUsageScanner(tt.provider)
		s := newSSEScanner(js)
		if got := s.mayReport([]byte(tt.data)); got != tt.want {
			t.Errorf("%s %s: %v", tt.provider, tt.data, got)
		}
	}
}

// TestSSELargeEventStreams checks that an event larger than the filter's
// buffer is streamed through the scanner and still read.
func TestSSELargeEventStreams(t *testing.T) {
	text := strings.Repeat("All work and no play. ", 2000)
	ev := `data: {"type":"response.completed","response":{"output":[{"type":"message","content":[{"type":"output_text","text":"` + text + `"}]}],"usage":{"input_tokens":7,"output_tokens":11000,"total_tokens":11007}}}` + "\n\n"
	for _, chunk := range []int{1, 100, len(ev)} {
		if got := scanBody(FormatSSE, "", ev, chunk); got != (Usage{Input: 7, Output: 11000, Total: 11007, Found: true}) {
			t.Fatalf("chunk %d: %+v", chunk, got)
		}
	}
	// No blank line at the end: the complete document is still read.
	if got := scanBody(FormatSSE, "", strings.TrimSuffix(openAIChatSSE, "\n\ndata: [DONE]\n\n"), 10); got != (Usage{Input: 12, Output: 7, Total: 19, Found: true}) {
		t.Fatalf("unterminated last event: %+v", got)
	}
}

// Payloads of calls that hit the providers' prompt caches.
const (
	openAIChatCachedJSON = `{"id":"chatcmpl-BQ4Zq1","object":"chat.completion","created":1745840000,"model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":{"role":"assistant","content":"Sure.","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_f5bdcc3276"}`

	openAIChatCachedSSE = "data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"created\":1745840000,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n" +
		"data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"created\":1745840000,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Sure.\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n" +
		"data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"created\":1745840000,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n" +
		"data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"created\":1745840000,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":2,\"total_tokens\":1202,\"prompt_tokens_details\":{\"cached_tokens\":1024,\"audio_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0,\"audio_tokens\":0,\"accepted_prediction_tokens\":0,\"rejected_prediction_tokens\":0}}}\n\n" +
		"data: [DONE]\n\n"

	openAIResponsesCachedJSON = `{"id":"resp_6810a1","object":"response","created_at":1745840000,"status":"completed","error":null,"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_6810a1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Sure.","annotations":[]}]}],"parallel_tool_calls":true,"usage":{"input_tokens":1536,"input_tokens_details":{"cached_tokens":1280},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1623},"user":null,"metadata":{}}`

	openAIResponsesCachedSSE = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_2\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_2\",\"output_index\":0,\"content_index\":0,\"delta\":\"Sure.\"}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":5,\"response\":{\"id\":\"resp_2\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Sure.\"}]}],\"usage\":{\"input_tokens\":1536,\"input_tokens_details\":{\"cached_tokens\":1280},\"output_tokens\":87,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":1623}}}\n\n"

	anthropicCachedJSON = `{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Sure."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"cache_creation":{"ephemeral_5m_input_tokens":100,"ephemeral_1h_input_tokens":0},"output_tokens":20,"service_tier":"standard"}}`

	anthropicCachedSSE = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":1800,\"output_tokens\":1}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Sure.\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
)

func TestUsageCachedInput(t *testing.T) {
	large := strings.Repeat("All work and no play. ", 400) // > the SSE filter's buffer
	tests := []struct {
		name     string
		format   string
		provider string
		body     string
		want     Usage
	}{
		{"openai chat json", FormatJSON, "", openAIChatCachedJSON, Usage{Input: 2006, Output: 300, CachedInput: 1920, Total: 2306, Found: true}},
		{"openai chat json, provider set", FormatJSON, ProviderOpenAI, openAIChatCachedJSON, Usage{Input: 2006, Output: 300, CachedInput: 1920, Total: 2306, Found: true}},
		{"openai chat sse", FormatSSE, "", openAIChatCachedSSE, Usage{Input: 1200, Output: 2, CachedInput: 1024, Total: 1202, Found: true}},
		{"openai responses json", FormatJSON, "", openAIResponsesCachedJSON, Usage{Input: 1536, Output: 87, CachedInput: 1280, Total: 1623, Found: true}},
		{"openai responses sse", FormatSSE, "", openAIResponsesCachedSSE, Usage{Input: 1536, Output: 87, CachedInput: 1280, Total: 1623, Found: true}},
		{"openai responses sse, event larger than the filter buffer", FormatSSE, "",
			strings.Replace(openAIResponsesCachedSSE, `\"text\":\"Sure.\"}]}]`, `\"text\":\"`+large+`\"}]}]`, 1),
			Usage{Input: 1536, Output: 87, CachedInput: 1280, Total: 1623, Found: true}},
		{"anthropic json: creation is written to the cache, reads are cached", FormatJSON, "", anthropicCachedJSON, Usage{Input: 2110, Output: 20, CachedInput: 2000, CacheWrite: 100, Total: 2130, Found: true}},
		{"anthropic sse: message_start's cache reads stand", FormatSSE, "", anthropicCachedSSE, Usage{Input: 1825, Output: 15, CachedInput: 1800, Total: 1840, Found: true}},
		{"anthropic sse: message_delta repeats the cumulative counts", FormatSSE, ProviderAnthropic,
			strings.Replace(anthropicCachedSSE, `\"usage\":{\"output_tokens\":15}`,
				`\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":1800,\"output_tokens\":15}`, 1),
			Usage{Input: 1825, Output: 15, CachedInput: 1800, Total: 1840, Found: true}},
		{"no cache hit", FormatJSON, "", openAIChatJSON, Usage{Input: 19, Output: 10, Total: 29, Found: true}},
		{"details before the counts", FormatJSON, "", `{"usage":{"prompt_tokens_details":{"cached_tokens":64},"prompt_tokens":100,"completion_tokens":5}}`, Usage{Input: 100, Output: 5, CachedInput: 64, Total: 105, Found: true}},
		{"cached tokens elsewhere do not count", FormatJSON, "",
			`{"choices":[{"usage":{"prompt_tokens_details":{"cached_tokens":9}}}],"cached_tokens":9,"usage":{"prompt_tokens":10,"completion_tokens":1,"completion_tokens_details":{"cached_tokens":9},"cached_tokens":9}}`,
			Usage{Input: 10, Output: 1, Total: 11, Found: true}},
		{"null details", FormatJSON, "", `{"usage":{"input_tokens":10,"input_tokens_details":null,"output_tokens":1}}`, Usage{Input: 10, Output: 1, Total: 11, Found: true}},
		{"escaped key is never read", FormatJSON, "", `{"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached\u005ftokens":8}}}`, Usage{Input: 10, Output: 1, Total: 11, Found: true}},
		{"cached capped at input", FormatJSON, "", `{"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":50}}}`, Usage{Input: 10, Output: 1, CachedInput: 10, Total: 11, Found: true}},
		{"negative cached is zero", FormatJSON, "", `{"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":-5}}}`, Usage{Input: 10, Output: 1, Total: 11, Found: true}},
		{"anthropic provider ignores openai details", FormatJSON, ProviderAnthropic, openAIResponsesCachedJSON, Usage{Input: 1536, Output: 87, Total: 1623, Found: true}},
		{"openai provider ignores anthropic cache fields", FormatJSON, ProviderOpenAI, anthropicCachedJSON, Usage{Input: 10, Output: 20, Total: 30, Found: true}},
		{"cut inside the details: no report", FormatJSON, "", openAIChatCachedJSON[:strings.Index(openAIChatCachedJSON, `"cached_tokens":1920`)+18], Usage{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, chunk := range []int{len(tt.body) + 1, 1, 2, 3, 7, 64, 1000} {
				got := scanBody(tt.format, tt.provider, tt.body, chunk)
				if got != tt.want {
					t.Fatalf("chunk %d: got %+v, want %+v", chunk, got, tt.want)
				}
			}
			// The reconciled amount does not depend on the cached split.
			noCache := tt.want
			noCache.CachedInput = 0
			if a := (Actual{}); a.Cost(tt.want) != a.Cost(noCache) {
				t.Fatal("Actual.Cost must ignore CachedInput")
			}
		})
	}
}

func TestTapGzipCachedInput(t *testing.T) {
	z := gzipped(openAIResponsesCachedJSON)
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "application/json")
	rec.Header().Set("Content-Encoding", "gzip")
	tap := NewTap(rec, TapConfig{})
	_, _ = tap.Write(z)
	if u := tap.Usage(); u != (Usage{Input: 1536, Output: 87, CachedInput: 1280, Total: 1623, Found: true}) {
		t.Fatalf("usage %+v", u)
	}
}
