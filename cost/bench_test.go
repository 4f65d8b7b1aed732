package cost

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// chatBody4KiB returns a realistic chat completion body of about 4 KiB: a
// system prompt and a few turns of conversation, one with a content array.
func chatBody4KiB() []byte {
	para := "The Pythagorean theorem states that in a right triangle, the square of the hypotenuse equals the sum of the squares of the other two sides. "
	msgs := []map[string]any{
		{"role": "system", "content": "You are a patient mathematics tutor. Explain step by step, use examples, and check understanding.\n" + strings.Repeat(para, 3)},
		{"role": "user", "content": "Can you explain the Pythagorean theorem with an example? " + strings.Repeat(para, 4)},
		{"role": "assistant", "content": strings.Repeat(para, 6)},
		{"role": "user", "content": []map[string]any{
			{"type": "text", "text": "And how does it generalise to three dimensions — café-style napkin proof, please? " + strings.Repeat(para, 3)},
		}},
	}
	b, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": msgs, "max_tokens": 512, "temperature": 0.2, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	for len(b) < 4096 {
		msgs[2]["content"] = msgs[2]["content"].(string) + "More. "
		b, _ = json.Marshal(map[string]any{"model": "gpt-4o", "messages": msgs, "max_tokens": 512})
	}
	return b
}

func BenchmarkLLMEstimate4KiB(b *testing.B) {
	l := &LLM{}
	if err := l.Provision(); err != nil {
		b.Fatal(err)
	}
	body := chatBody4KiB()
	req := &Request{HTTP: httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil), Body: body}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Estimate(req); err != nil {
			b.Fatal(err)
		}
	}
}

// graphQLBody2KiB returns a body of about 2 KiB: GitHub's complex node-limit
// example plus a fragment, variables and an operation name.
func graphQLBody2KiB() []byte {
	q := `query Dashboard($repos: Int = 50, $prs: Int!, $after: String) {
  viewer {
    login
    repositories(first: $repos, after: $after) {
      totalCount
      pageInfo { hasNextPage endCursor }
      edges {
        repository: node {
          ...RepoFields
          pullRequests(first: $prs, states: [OPEN]) {
            edges { pullRequest: node { title number author { login } comments(first: 10) { edges { comment: node { bodyHTML author { login } } } } } }
          }
          issues(first: 20, orderBy: {field: CREATED_AT, direction: DESC}) {
            totalCount
            edges { issue: node { title bodyHTML labels(first: 5) { nodes { name color } } comments(first: 10) { edges { comment: node { bodyHTML } } } } }
          }
        }
      }
    }
    followers(first: 10) { edges { follower: node { login name avatarUrl } } }
  }
  rateLimit { cost remaining resetAt }
}
fragment RepoFields on Repository {
  name
  nameWithOwner
  description
  stargazerCount
  forkCount
  primaryLanguage { name color }
  defaultBranchRef { name target { ... on Commit { oid committedDate history(first: 1) { totalCount } } } }
}`
	b, _ := json.Marshal(map[string]any{"query": q, "operationName": "Dashboard", "variables": map[string]any{"prs": 20, "after": nil}})
	return b
}

// BenchmarkGraphQLCost2KiB: "parse" parses the query on every call (cache
// disabled: the cost of a query never seen before); "cached" reuses the
// parsed document, as for the usual client that sends the same query text
// with different variables.
func BenchmarkGraphQLCost2KiB(b *testing.B) {
	for _, bc := range []struct {
		name  string
		cache int
	}{{"parse", -1}, {"cached", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			g := &GraphQL{CacheSize: bc.cache}
			if err := g.Provision(); err != nil {
				b.Fatal(err)
			}
			body := graphQLBody2KiB()
			req := &Request{HTTP: httptest.NewRequest(http.MethodPost, "/graphql", nil), Body: body}
			if _, err := g.Estimate(req); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := g.Estimate(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// sseEvents returns an OpenAI chat stream of about 1 MiB, one event per
// slice, ending with the usage chunk.
func sseEvents() [][]byte {
	words := []string{"The ", "hypotenuse ", "is ", "the ", "longest ", "side, ", "opposite ", "the ", "right ", "angle. ", "Squares ", "add ", "up: ", "a² + b² = c².\\n"}
	var evs [][]byte
	total := 0
	for i := 0; total < 1<<20; i++ {
		ev := fmt.Sprintf("data: {\"id\":\"chatcmpl-AXzq8\",\"object\":\"chat.completion.chunk\",\"created\":1732000000,\"model\":\"gpt-4o-2024-08-06\",\"system_fingerprint\":\"fp_45cf54deae\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%s\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n", words[i%len(words)])
		evs = append(evs, []byte(ev))
		total += len(ev)
	}
	evs = append(evs, []byte("data: {\"id\":\"chatcmpl-AXzq8\",\"object\":\"chat.completion.chunk\",\"created\":1732000000,\"model\":\"gpt-4o-2024-08-06\",\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":5000,\"total_tokens\":6200}}\n\ndata: [DONE]\n\n"))
	return evs
}

// discardWriter is the cheapest possible ResponseWriter: it isolates what
// the tap itself costs per byte.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Flush()                      {}

// BenchmarkTapSSE1MiB measures the tap on a 1 MiB SSE response, written one
// event at a time with a flush after each, as a reverse proxy does:
//
//   - memory/plain vs memory/tap: into a writer that does nothing, so the
//     difference is the tap's whole cost (parse + bookkeeping);
//   - http/plain vs http/tap: through a real net/http server over loopback
//     to a client reading the stream, the realistic baseline for "how much
//     CPU does streaming through the tap add".
func BenchmarkTapSSE1MiB(b *testing.B) {
	evs := sseEvents()
	size := 0
	for _, e := range evs {
		size += len(e)
	}
	write := func(w http.ResponseWriter, tapped bool) {
		w.Header().Set("Content-Type", "text/event-stream")
		var t *Tap
		if tapped {
			t = NewTap(w, TapConfig{})
			w = t
		}
		f := w.(http.Flusher)
		for _, e := range evs {
			_, _ = w.Write(e)
			f.Flush()
		}
		if tapped {
			if u := t.Usage(); u.Total != 6200 {
				b.Fatalf("usage %+v", u)
			}
		}
	}
	for _, tapped := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "tap"}[tapped]
		b.Run("memory/"+name, func(b *testing.B) {
			w := &discardWriter{h: http.Header{}}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				write(w, tapped)
			}
		})
	}
	for _, tapped := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "tap"}[tapped]
		b.Run("http/"+name, func(b *testing.B) {
			srv := newServer(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				write(w, tapped)
			}))
			client := testClient(b)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Get(srv.URL)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if n != int64(size) {
					b.Fatalf("read %d bytes", n)
				}
			}
		})
	}
}

// BenchmarkUsageJSON1MiB measures the scanner alone on a 1 MiB JSON body
// whose usage object comes last (Anthropic and OpenAI order).
func BenchmarkUsageJSON1MiB(b *testing.B) {
	body := []byte(`{"id":"msg_1","type":"message","content":[{"type":"text","text":"` + strings.Repeat(`Lorem ipsum dolor sit amet, \"consectetur\" adipiscing elit.\n`, 1<<20/62) + `"}],"usage":{"input_tokens":10,"output_tokens":20}}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		s := newUsageScanner(ProviderAuto)
		for p := body; len(p) > 0; p = p[min(len(p), 16<<10):] {
			s.write(p[:min(len(p), 16<<10)])
		}
		if u := s.usage(); u.Total != 30 {
			b.Fatalf("usage %+v", u)
		}
	}
}

// nestedParts is a hostile chat body of about size bytes: one message whose
// content nests `levels` content parts around a flat array of strings.
func nestedParts(levels, size int) []byte {
	var b strings.Builder
	b.WriteString(`{"max_tokens":1,"messages":[{"role":"user","content":`)
	for i := 0; i < levels; i++ {
		b.WriteString(`[{"content":`)
	}
	b.WriteString(`[`)
	for b.Len() < size {
		b.WriteString(`"\n\n\n\n",`)
	}
	b.WriteString(`"x"]`)
	for i := 0; i < levels; i++ {
		b.WriteString(`}]`)
	}
	b.WriteString(`}]}`)
	return []byte(b.String())
}

// BenchmarkLLMEstimateNested: a 1 MiB body costs about the same to
// estimate flat and with 60 levels of nested content parts (the nesting is
// read as parts only four deep), so a hostile body stays linear in size.
func BenchmarkLLMEstimateNested(b *testing.B) {
	for _, levels := range []int{0, 60} {
		b.Run(fmt.Sprintf("levels=%d", levels), func(b *testing.B) {
			body := nestedParts(levels, 1<<20)
			l := &LLM{}
			if err := l.Provision(); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, err := l.Estimate(&Request{Body: body}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
