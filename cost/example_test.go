package cost_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/caddy-cascade/cascade/cost"
)

// An LLM request is charged its estimate before it goes upstream, then
// reconciled with the usage the upstream reports.
func Example() {
	est := &cost.LLM{}
	if err := est.Provision(); err != nil {
		panic(err)
	}
	actual := cost.Actual{}

	body := `{"model":"claude-haiku-4-5","max_tokens":50,"messages":[{"role":"user","content":"What is the Pythagorean theorem? Answer in one sentence."}]}`
	r := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(body))
	req, err := cost.NewRequest(r, est, cost.BodyLimit(est, 1<<20))
	if err != nil {
		panic(err)
	}
	n, err := est.Estimate(req)
	if err != nil {
		panic(err)
	}
	fmt.Println("estimate:", n)

	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ := io.ReadAll(r.Body)
		fmt.Println("upstream got the whole body:", string(got) == body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"type":"message","content":[{"type":"text","text":"a² + b² = c²."}],"usage":{"input_tokens":21,"output_tokens":18}}`)
	})
	tap := cost.NewTap(httptest.NewRecorder(), cost.TapConfig{})
	upstream.ServeHTTP(tap, r)
	if u := tap.Usage(); u.Found {
		fmt.Println("actual:", actual.Cost(u), "adjust by:", actual.Cost(u)-n)
	}
	// Output:
	// estimate: 64
	// upstream got the whole body: true
	// actual: 39 adjust by: -25
}

// A GraphQL query is costed from its text; GitHub's model reproduces
// GitHub's published rate-limit points.
func ExampleGraphQL() {
	g := &cost.GraphQL{Model: cost.ModelGitHub}
	if err := g.Provision(); err != nil {
		panic(err)
	}
	q := `{"query":"{ viewer { repositories(first: 100) { nodes { issues(first: 50) { nodes { labels(first: 60) { nodes { name } } } } } } } }"}`
	r := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(q))
	r.Header.Set("Content-Type", "application/json")
	c, err := g.Analyze(&cost.Request{HTTP: r, Body: []byte(q)})
	if err != nil {
		panic(err)
	}
	fmt.Println("requests:", c.Requests, "points:", c.Points)
	// Output:
	// requests: 5101 points: 51
}
