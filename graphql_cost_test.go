package cascade

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestGraphQLCostCaddyfile(t *testing.T) {
	h, err := parse(t, `rate_limit {
		tree gql {
			tier client {header.X-Client} {
				limit 600 points/min
			}
		}
		cost points graphql {
			list_fields *s all* *Connection
			depth_factor 1.5
			mutation 10
			subscription 50
			extensions_cost
			charged_header
		}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	c := h.Costs[0]
	g := c.GraphQL
	if strings.Join(g.ListFields, " ") != "*s all* *Connection" || g.DepthFactor != 1.5 || g.Mutation != 10 || g.Subscription != 50 ||
		!g.ExtensionsCost || !c.ChargedHeader {
		t.Fatalf("%+v, charged_header %v", g, c.ChargedHeader)
	}
	for _, tc := range []struct{ opt, want string }{
		{"depth_factor 0.5", "at least 1"},
		{"depth_factor x", `depth_factor "x": use a number of at least 1`},
		{"depth_factor", "needs a number of at least 1"},
		{"list_fields", "glob patterns"},
		{"list_fields [a-", "not a glob pattern"},
		{"mutation -1", "non-negative"},
		{"extensions_cost on", "takes no argument"},
		{"charged_header yes", "takes no argument"},
		{"extension_cost", "extensions_cost"}, // a typo: the suggestion names the option
	} {
		_, err := parse(t, "rate_limit {\n cost points graphql {\n  "+tc.opt+"\n }\n}")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.opt, err, tc.want)
		}
	}
	if h, err := parse(t, "rate_limit {\n cost tokens 5 {\n  charged_header\n }\n}"); err != nil || !h.Costs[0].ChargedHeader {
		t.Fatalf("charged_header on a constant cost: %v", err)
	}
}

// fakeGraphQL answers each path its own way: JSON of several lengths,
// chunked, gzip when asked, with its own extensions.cost, or not JSON.
type fakeGraphQL struct {
	small, large []byte
}

func newFakeGraphQL(t *testing.T) *httptest.Server {
	f := &fakeGraphQL{small: graphQLData(2 << 10), large: graphQLData(1 << 20)}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}

// graphQLData is a GraphQL response of about n bytes.
func graphQLData(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"data":{"allUsers":[`)
	for i := 0; b.Len() < n-40; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":%d,"name":"user \"%d\" {}"}`, i, i)
	}
	b.WriteString(`]}}`)
	return b.Bytes()
}

func (f *fakeGraphQL) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	body := f.small
	if strings.HasSuffix(r.URL.Path, "/large") {
		body = f.large
	}
	w.Header().Set("Content-Type", "application/json")
	switch path := r.URL.Path; {
	case strings.HasPrefix(path, "/gzip") && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip"):
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write(body)
		zw.Close()
	case strings.HasPrefix(path, "/chunked"):
		for len(body) > 0 { // in pieces, each flushed: no length
			n := min(len(body), 1000)
			w.Write(body[:n])
			w.(http.Flusher).Flush()
			body = body[n:]
		}
	case path == "/own-cost":
		// The server's own Shopify-shaped cost, which reconciles.
		io.WriteString(w, `{"data":{"viewer":{"id":1}},"extensions":{"cost":{"requestedQueryCost":4,"actualQueryCost":2},"tracing":{"v":1}}}`)
	case path == "/text":
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, `{"not":"graphql"}`)
	case path == "/error":
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"errors":[{"message":"boom"}]}`)
	case path == "/batch":
		io.WriteString(w, `[{"data":{}},{"data":{}}]`)
	default:
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	}
}

// graphqlGateway is a site with a GraphQL cost that shows itself, in front
// of upstream: 600 points a minute (10 a second) per X-Client.
func graphqlGateway(t *testing.T, upstream string, more string) string {
	t.Helper()
	site, _ := proxiedSite(t, upstream, `
		tree gql {
			tier client {header.X-Client} {
				limit 600 points/min
			}
		}
		cost points graphql {
			list_fields *s all*
			default_list_size 10
			depth_factor 1.5
			extensions_cost
			charged_header
			reconcile {
				provider graphql
			}
		}
		`+more)
	return site
}

// costObject is extensions.cost as Cascade writes it.
func costObject(requested, actual, available int64) string {
	a := strconv.FormatInt(actual, 10)
	if actual < 0 {
		a = "null"
	}
	return fmt.Sprintf(`{"requestedQueryCost":%d,"actualQueryCost":%s,"throttleStatus":{"maximumAvailable":600,"currentlyAvailable":%d,"restoreRate":10}}`,
		requested, a, available)
}

// TestGraphQLExtensionsCost: Cascade adds extensions.cost to GraphQL
// responses, plain, chunked and gzip, with the length right and every
// other byte as the upstream sent it; leaves other responses untouched;
// puts the same object in a refusal; and says the charge in Cascade-Cost.
func TestGraphQLExtensionsCost(t *testing.T) {
	up := newFakeGraphQL(t)
	f := up.Config.Handler.(*fakeGraphQL)
	base := graphqlGateway(t, up.URL, "")
	// allUsers(first: 2) { id }: 1 + 2 × 1.5 = 4 points.
	query := `{"query":"{ allUsers(first: 2) { id } }"}`
	withCost := func(body []byte, obj string) string {
		return string(body[:len(body)-1]) + `,"extensions":{"cost":` + obj + `}}`
	}
	send := func(t *testing.T, path, client string, gzipOK bool) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(query))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Client", client)
		// Set, so that the transport neither asks for gzip nor decodes it.
		req.Header.Set("Accept-Encoding", "identity")
		if gzipOK {
			req.Header.Set("Accept-Encoding", "gzip")
		}
		res, err := httpClient(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res, b
	}
	for _, tc := range []struct {
		name, path string
		gzip       bool
		body       []byte
		length     bool // a Content-Length, exact
	}{
		{"plain, 2 KiB with a length", "/", false, f.small, true},
		{"plain, 1 MiB with a length", "/large", false, f.large, false},
		{"chunked", "/chunked", false, f.small, false},
		{"chunked, 1 MiB", "/chunked/large", false, f.large, false},
		{"gzip, 2 KiB", "/gzip", true, f.small, true}, // the upstream's server gave it a length
		{"gzip, 1 MiB", "/gzip/large", true, f.large, false},
		{"gzip not accepted", "/gzip", false, f.small, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := send(t, tc.path, tc.name, tc.gzip)
			if res.StatusCode != 200 {
				t.Fatalf("%d %s", res.StatusCode, body)
			}
			if tc.length != (res.ContentLength >= 0) || tc.length && res.ContentLength != int64(len(body)) {
				t.Fatalf("Content-Length %d for %d bytes (want one: %v)", res.ContentLength, len(body), tc.length)
			}
			if tc.gzip {
				if res.Header.Get("Content-Encoding") != "gzip" {
					t.Fatalf("Content-Encoding %q", res.Header.Get("Content-Encoding"))
				}
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			// A fresh bucket of 600, charged 4, and nothing reconciled
			// (the upstream reports no cost): 596 left.
			if want := withCost(tc.body, costObject(4, 4, 596)); string(body) != want {
				t.Fatalf("body …%s\nwant …%s", tail(body), tail([]byte(want)))
			}
			if got := res.Header.Get("Cascade-Cost"); got != "points=4" {
				t.Fatalf("Cascade-Cost %q", got)
			}
		})
	}
	t.Run("upstream's own cost", func(t *testing.T) {
		// Replaced by Cascade's, whose actual cost is the upstream's (2),
		// and whose available points count the 2 given back.
		_, body := send(t, "/own-cost", "own", false)
		want := `{"data":{"viewer":{"id":1}},"extensions":{"cost":` + costObject(4, 2, 598) + `,"tracing":{"v":1}}}`
		if string(body) != want {
			t.Fatalf("body %s\nwant %s", body, want)
		}
	})
	for _, path := range []string{"/text", "/error", "/batch"} {
		t.Run("untouched "+path, func(t *testing.T) {
			direct, err := http.Post(up.URL+path, "application/json", strings.NewReader(query))
			if err != nil {
				t.Fatal(err)
			}
			want, _ := io.ReadAll(direct.Body)
			direct.Body.Close()
			res, body := send(t, path, "u"+path, false)
			if !bytes.Equal(body, want) || res.StatusCode != direct.StatusCode {
				t.Fatalf("%d %s, want %d %s", res.StatusCode, body, direct.StatusCode, want)
			}
			if res.ContentLength != int64(len(want)) {
				t.Fatalf("Content-Length %d, want %d", res.ContentLength, len(want))
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		// allUsers(first: 500) { id }: 1 + 500 × 1.5 = 751 points, more
		// than 600 can ever admit.
		req, _ := http.NewRequest("POST", base+"/", strings.NewReader(`{"query":"{ allUsers(first: 500) { id } }"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Client", "refused")
		res, err := httpClient(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		r := resp{res.StatusCode, res.Header, string(b)}
		r.problem(t) // problem+json, and JSON
		if want := `,"extensions":{"cost":` + costObject(751, -1, 600) + `}}`; r.status != 429 || !strings.HasSuffix(r.body, want) {
			t.Fatalf("%d %s\nwant it to end %s", r.status, r.body, want)
		}
		if res.ContentLength != int64(len(b)) {
			t.Fatalf("Content-Length %d for %d bytes", res.ContentLength, len(b))
		}
		if res.Header.Get("Cascade-Cost") != "" {
			t.Fatalf("a refusal, charged nothing, says Cascade-Cost %q", res.Header.Get("Cascade-Cost"))
		}
	})
}

// tail is the end of a long body, for a failure's message.
func tail(b []byte) []byte {
	return b[max(0, len(b)-300):]
}

// TestGraphQLCostOffByDefault: without the options, responses are the
// upstream's, byte for byte, with their length, and no Cascade-Cost.
func TestGraphQLCostOffByDefault(t *testing.T) {
	up := newFakeGraphQL(t)
	f := up.Config.Handler.(*fakeGraphQL)
	base, _ := proxiedSite(t, up.URL, `
		tree gql {
			tier client {header.X-Client} {
				limit 600 points/min
			}
		}
		cost points graphql`)
	r := post(t, base+"/", `{"query":"{ allUsers(first: 2) { id } }"}`, "X-Client: off")
	if r.status != 200 || r.body != string(f.small) || r.header.Get("Content-Length") != strconv.Itoa(len(f.small)) || r.header.Get("Cascade-Cost") != "" {
		t.Fatalf("%d, Content-Length %s, Cascade-Cost %q, body changed: %v", r.status, r.header.Get("Content-Length"),
			r.header.Get("Cascade-Cost"), r.body != string(f.small))
	}
	// The old price, too: allUsers 1 + 2 × id 1 = 3.
	if rem := r.header.Get("RateLimit"); !strings.Contains(rem, "r=597") {
		t.Fatalf("RateLimit %s, want 597 left", rem)
	}
}

// graphqlClientResult is what internal/sdktest/graphql.mjs printed.
type graphqlClientResult struct {
	Results []struct {
		OK         bool   `json:"ok"`
		Status     int    `json:"status"`
		Charged    string `json:"charged"`
		Extensions struct {
			Cost json.RawMessage `json:"cost"`
		} `json:"extensions"`
	} `json:"results"`
}

// TestGraphQLClientSeesCost: graphql-request, a GraphQL client that reads
// extensions (through Node's fetch, which takes gzip), sees Cascade's cost
// object on an admitted query and on a refused one.
func TestGraphQLClientSeesCost(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Node.js")
	}
	up := newFakeGraphQL(t)
	base := graphqlGateway(t, up.URL, "")
	var r graphqlClientResult
	runNode(t, "graphql.mjs", map[string]any{"url": base + "/gzip", "queries": []map[string]string{
		{"client": "node-1", "query": `{ allUsers(first: 2) { id } }`},
		{"client": "node-2", "query": `{ allUsers(first: 500) { id } }`}}}, &r)
	if len(r.Results) != 2 {
		t.Fatalf("%+v", r)
	}
	ok, refused := r.Results[0], r.Results[1]
	if !ok.OK || ok.Status != 200 || string(ok.Extensions.Cost) != costObject(4, 4, 596) || ok.Charged != "points=4" {
		t.Fatalf("admitted: %+v (cost %s)", ok, ok.Extensions.Cost)
	}
	if refused.OK || refused.Status != 429 || string(refused.Extensions.Cost) != costObject(751, -1, 600) {
		t.Fatalf("refused: %+v (cost %s)", refused, refused.Extensions.Cost)
	}
}

// BenchmarkHandlerGraphQL is the handler's own cost per admitted GraphQL
// query whose upstream answers 2 KiB or 1 MiB of JSON (in 32 KiB writes,
// with a Content-Length), with the cost shown (extensions_cost and
// charged_header) and without (the options off): what showing it adds.
func BenchmarkHandlerGraphQL(b *testing.B) {
	tier := map[string]any{"name": "client", "key": "{http.request.header.X-T0}", "limits": []map[string]any{
		{"count": int64(1) << 40, "per": "h", "dimension": "points"}}}
	query := `{"query":"{ viewer { repositories(first: 10) { nodes { name } } } }"}`
	for _, size := range []int{2 << 10, 1 << 20} {
		data := graphQLData(size)
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
			w.WriteHeader(200)
			for p := data; len(p) > 0; {
				n := min(len(p), 32<<10)
				w.Write(p[:n])
				p = p[n:]
			}
			return nil
		})
		for _, shown := range []bool{false, true} {
			name := fmt.Sprintf("%dKiB/off", size>>10)
			cost := map[string]any{"dimension": "points", "graphql": map[string]any{}}
			if shown {
				name = fmt.Sprintf("%dKiB/shown", size>>10)
				cost = map[string]any{"dimension": "points", "graphql": map[string]any{"extensions_cost": true}, "charged_header": true}
			}
			b.Run(name, func(b *testing.B) {
				h, done := benchHandlerOf(b, 0, nil, map[string]any{
					"trees": []any{map[string]any{"name": "bench", "tiers": []any{tier}}}, "costs": []any{cost}})
				defer done()
				const batch = 100
				reqs := make([]*http.Request, batch)
				ws := make([]headerWriter, batch)
				b.SetBytes(int64(len(data)))
				b.ReportAllocs()
				b.ResetTimer()
				for n := 0; n < b.N; n++ {
					k := n % batch
					if k == 0 {
						b.StopTimer()
						for j := range reqs {
							r := httptest.NewRequest("POST", "/graphql", strings.NewReader(query))
							r.Header.Set("Content-Type", "application/json")
							r.Header.Set("X-T0", fmt.Sprintf("v%d", j))
							repl := caddy.NewReplacer()
							repl.Map(func(string) (any, bool) { return nil, false })
							reqs[j] = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
							ws[j] = headerWriter{hdr: http.Header{}}
						}
						b.StartTimer()
					}
					if err := h.ServeHTTP(&ws[k], reqs[k], next); err != nil || ws[k].code != 200 {
						b.Fatal(err, ws[k].code)
					}
				}
			})
		}
	}
}

// TestShownCostObject: actualQueryCost is the upstream's usage when the
// cost reconciles with it (from its own extensions.cost or the reconcile
// header), else the charge, null on a refusal; currentlyAvailable counts
// what reconciliation will give back or charge, within the capacity.
func TestShownCostObject(t *testing.T) {
	graphqlRec := &Reconcile{TapConfig: cost.TapConfig{Provider: cost.ProviderGraphQL}}
	headerRec := &Reconcile{TapConfig: cost.TapConfig{Header: "X-Cost"}}
	obj := func(actual, available string) string {
		return `{"requestedQueryCost":10,"actualQueryCost":` + actual + `,"throttleStatus":{"maximumAvailable":100,"currentlyAvailable":` +
			available + `,"restoreRate":1.5}}`
	}
	for _, tc := range []struct {
		name      string
		rec       *Reconcile
		refused   bool
		available int64
		upstream  string
		header    string
		want      string
	}{
		{"not reconciled", nil, false, 90, `{"actualQueryCost":4}`, "", obj("10", "90")},
		{"upstream's actual", graphqlRec, false, 90, `{"requestedQueryCost":12,"actualQueryCost":4}`, "", obj("4", "96")},
		{"upstream's, over", graphqlRec, false, 90, `{"actualQueryCost":200}`, "", obj("200", "0")},
		{"given back, up to the capacity", graphqlRec, false, 95, `{"actualQueryCost":0}`, "", obj("0", "100")},
		{"no upstream cost", graphqlRec, false, 90, "", "", obj("10", "90")},
		{"header", headerRec, false, 90, `{"actualQueryCost":4}`, "3", obj("3", "97")},
		{"header absent", headerRec, false, 90, "", "", obj("10", "90")},
		{"refused", graphqlRec, true, 90, "", "", obj("null", "90")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Cost{Dimension: "points", GraphQL: &cost.GraphQL{}, Reconcile: tc.rec}
			if tc.rec != nil {
				if err := c.Reconcile.Actual.Provision(); err != nil {
					t.Fatal(err)
				}
			}
			s := &shownCost{requested: 10, charged: 10, refused: tc.refused, status: true, maximum: 100, available: tc.available, restore: 1.5,
				c: c, hdr: http.Header{}, reconciles: tc.rec != nil && !tc.refused}
			if tc.header != "" {
				s.hdr.Set("X-Cost", tc.header)
			}
			var up []byte
			if tc.upstream != "" {
				up = []byte(tc.upstream)
			}
			if got := string(s.object(up)); got != tc.want {
				t.Fatalf("%s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestShownCostReplayed: a retry admitted without a charge, which
// reconciliation then charges its whole actual cost, shows what will be
// left after that, not what a charged request would leave.
func TestShownCostReplayed(t *testing.T) {
	c := &Cost{Dimension: "points", GraphQL: &cost.GraphQL{}, Reconcile: &Reconcile{TapConfig: cost.TapConfig{Provider: cost.ProviderGraphQL}}}
	if err := c.Reconcile.Actual.Provision(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		replayed bool
		want     string // currentlyAvailable
	}{
		{false, "96"}, // 90 left, charged 10, actually 4: 6 given back
		{true, "86"},  // 90 left, charged nothing, actually 4: 4 charged
	} {
		d := &decision{Decision: engine.Decision{
			Buckets: []hierarchy.Bucket{{Limit: &hierarchy.Limit{Dimension: "points"}}},
			Request: engine.Request{Estimates: []int64{10}},
			Limits:  []store.Bucket{{Limit: rate.Limit{Algorithm: rate.GCRA, Count: 100, Period: time.Minute}}},
		}}
		d.Results = []rate.Result{{Allowed: true, Remaining: 90}}
		d.Replayed = tc.replayed
		got := string(shownCostOf(d, c, 0, false).object([]byte(`{"actualQueryCost":4}`)))
		if !strings.Contains(got, `"currentlyAvailable":`+tc.want+`,`) {
			t.Errorf("replayed %v: %s, want %s available", tc.replayed, got, tc.want)
		}
	}
}
