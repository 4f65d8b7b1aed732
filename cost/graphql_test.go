package cost

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/vektah/gqlparser/v2/ast"
)

func gqlBody(query string, vars map[string]any, opName string) string {
	m := map[string]any{"query": query}
	if vars != nil {
		m["variables"] = vars
	}
	if opName != "" {
		m["operationName"] = opName
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func gqlPost(body string) *Request {
	r := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return &Request{HTTP: r, Body: []byte(body)}
}

func provisioned(t testing.TB, g *GraphQL) *GraphQL {
	t.Helper()
	if err := g.Provision(); err != nil {
		t.Fatal(err)
	}
	return g
}

// GitHub's documented examples: docs.github.com/graphql/overview/rate-limits-and-query-limits-for-the-graphql-api
// ("Predicting the point value of a query" and "Calculating nodes in a call").
const (
	githubScoreExample = `query {
  viewer {
    login
    repositories(first: 100) {
      edges {
        node {
          id
          issues(first: 50) {
            edges {
              node {
                id
                labels(first: 60) {
                  edges {
                    node {
                      id
                      name
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}`
	githubSimpleNodes = `query {
  viewer {
    repositories(first: 50) {
      edges {
        repository:node {
          name
          issues(first: 10) {
            totalCount
            edges {
              node {
                title
                bodyHTML
              }
            }
          }
        }
      }
    }
  }
}`
	githubComplexNodes = `query {
  viewer {
    repositories(first: 50) {
      edges {
        repository:node {
          name
          pullRequests(first: 20) {
            edges {
              pullRequest:node {
                title
                comments(first: 10) {
                  edges {
                    comment:node {
                      bodyHTML
                    }
                  }
                }
              }
            }
          }
          issues(first: 20) {
            totalCount
            edges {
              issue:node {
                title
                bodyHTML
                comments(first: 10) {
                  edges {
                    comment:node {
                      bodyHTML
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
    followers(first: 10) {
      edges {
        follower:node {
          login
        }
      }
    }
  }
}`
)

func TestGitHubModelReproducesPublishedNumbers(t *testing.T) {
	g := provisioned(t, &GraphQL{Model: ModelGitHub})
	tests := []struct {
		name             string
		query            string
		requests, points int64
		nodes            int64
	}{
		// "This query requires 5,101 requests … final score of the query: 51".
		{"rate limit score", githubScoreExample, 5101, 51, 100 + 100*50 + 100*50*60},
		// The same query without labels: 1 + 100 requests, 1 point.
		{"101 requests", strings.Replace(githubScoreExample, "labels(first: 60)", "labels", 1), 101, 1, -1},
		// Node limit examples: 550 and 22,060 total nodes.
		{"simple node count", githubSimpleNodes, 1 + 50, 1, 550},
		{"complex node count", githubComplexNodes, 1 + 50*(1+20+1+20) + 1, 21, 22060},
		// The minimum point value of a call is 1.
		{"minimum one point", `{ viewer { login } }`, 0, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := g.Analyze(gqlPost(gqlBody(tt.query, nil, "")))
			if err != nil {
				t.Fatal(err)
			}
			if c.Requests != tt.requests || c.Points != tt.points || c.Cost != tt.points {
				t.Fatalf("requests=%d points=%d cost=%d, want %d %d", c.Requests, c.Points, c.Cost, tt.requests, tt.points)
			}
			if tt.nodes >= 0 && c.Nodes != tt.nodes {
				t.Fatalf("nodes=%d, want %d", c.Nodes, tt.nodes)
			}
		})
	}
}

func TestGraphQLFieldsModel(t *testing.T) {
	tests := []struct {
		name   string
		query  string
		vars   map[string]any
		opName string
		want   int64
	}{
		{"flat fields", `{ a b c }`, nil, "", 3},
		{"typename is free but a query costs at least 1", `{ __typename }`, nil, "", 1},
		{"connection multiplies its selection", `{ a(first: 10) { b c } }`, nil, "", 1 + 10*2},
		{"nested multipliers multiply", `{ a(first: 10) { b(last: 5) { c } } }`, nil, "", 1 + 10*(1+5*1)},
		{"largest slicing argument wins", `{ a(first: 3, last: 9) { b } }`, nil, "", 1 + 9},
		{"variable", `query($n: Int) { a(first: $n) { b } }`, map[string]any{"n": 5}, "", 1 + 5},
		{"missing variable uses the default size", `query($n: Int) { a(first: $n) { b } }`, nil, "", 1 + 1},
		{"variable default value", `query($n: Int = 7) { a(first: $n) { b } }`, nil, "", 1 + 7},
		{"request variable beats default", `query($n: Int = 7) { a(first: $n) { b } }`, map[string]any{"n": 2}, "", 1 + 2},
		{"negative size counts zero", `{ a(first: -5) { b } }`, nil, "", 1},
		{"named fragments expand at each spread", `query { ...F ...F } fragment F on Query { a(first: 2) { b } }`, nil, "", 2 * (1 + 2)},
		{"fragment inside a connection is multiplied", `query { a(first: 4) { ...F } } fragment F on A { b c }`, nil, "", 1 + 4*2},
		{"inline fragments", `{ node { ... on User { name } ... on Org { login } } }`, nil, "", 1 + 2},
		{"operation name chooses", `query A { a } query B { a b }`, nil, "B", 2},
		{"mutation", `mutation { createThing(input: {}) { id } }`, nil, "", 2},
		{"directives are counted conservatively", `{ a @skip(if: true) b @include(if: false) }`, nil, "", 2},
		{"huge sizes saturate", `{ a(first: 99999999999999999999) { b(first: 99999999999) { c(first: 9999999) { d } } } }`, nil, "", math.MaxInt64},
	}
	g := provisioned(t, &GraphQL{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := g.Estimate(gqlPost(gqlBody(tt.query, tt.vars, tt.opName)))
			if err != nil {
				t.Fatal(err)
			}
			if n != tt.want {
				t.Fatalf("cost %d, want %d", n, tt.want)
			}
		})
	}
}

func TestGraphQLFieldsModelGitHubExample(t *testing.T) {
	// labels: 1 + 60×(edges 1 + node(1 + id + name)) = 241
	// issues: 1 + 50×(edges 1 + node(1 + id + 241)) = 12,201
	// repositories: 1 + 100×(edges 1 + node(1 + id + 12,201)) = 1,220,401
	// viewer: 1 + login + 1,220,401 = 1,220,403
	g := provisioned(t, &GraphQL{})
	n, err := g.Estimate(gqlPost(gqlBody(githubScoreExample, nil, "")))
	if err != nil || n != 1220403 {
		t.Fatalf("got %d %v, want 1220403", n, err)
	}
}

func TestGraphQLTransports(t *testing.T) {
	g := provisioned(t, &GraphQL{})
	get := httptest.NewRequest(http.MethodGet, "/graphql?"+url.Values{
		"query":         {`query Q($n: Int) { a(first: $n) { b } } query R { x }`},
		"operationName": {"Q"},
		"variables":     {`{"n": 3}`},
	}.Encode(), nil)
	if n, err := g.Estimate(&Request{HTTP: get}); n != 4 || err != nil {
		t.Fatalf("GET: %d %v", n, err)
	}

	raw := httptest.NewRequest(http.MethodPost, "/graphql", nil)
	raw.Header.Set("Content-Type", "application/graphql; charset=utf-8")
	if n, err := g.Estimate(&Request{HTTP: raw, Body: []byte(`{ a b }`)}); n != 2 || err != nil {
		t.Fatalf("application/graphql: %d %v", n, err)
	}

	batch := `[` + gqlBody(`{ a }`, nil, "") + `,` + gqlBody(`{ a b }`, nil, "") + `]`
	c, err := g.Analyze(gqlPost(batch))
	if err != nil || c.Cost != 3 || c.Queries != 2 {
		t.Fatalf("batch: %+v %v", c, err)
	}

	// Variables sent as a JSON string, as some clients do.
	str := `{"query":"query($n: Int) { a(first: $n) { b } }","variables":"{\"n\": 6}"}`
	if n, err := g.Estimate(gqlPost(str)); n != 7 || err != nil {
		t.Fatalf("string variables: %d %v", n, err)
	}

	// A wrong content type must not be a free pass: the body is read as JSON.
	plain := gqlPost(gqlBody(`{ a b c }`, nil, ""))
	plain.HTTP.Header.Set("Content-Type", "text/plain")
	if n, err := g.Estimate(plain); n != 3 || err != nil {
		t.Fatalf("text/plain: %d %v", n, err)
	}
}

func TestGraphQLSchemaDirectives(t *testing.T) {
	const sdl = `
directive @cost(weight: Int!) on FIELD_DEFINITION | OBJECT | ARGUMENT_DEFINITION | SCALAR | ENUM
directive @listSize(assumedSize: Int, slicingArguments: [String!]) on FIELD_DEFINITION
schema { query: Root }
type Root {
  users(limit: Int): [User!]! @listSize(slicingArguments: ["limit"], assumedSize: 50)
  search(q: String! @cost(weight: 10)): [User!]
  me: User
  expensive: Int @cost(weight: "25")
}
type User @cost(weight: 2) {
  name: String
  friends: [User!]!
  posts(first: Int): PostConnection
}
type PostConnection { edges: [PostEdge] totalCount: Int }
type PostEdge { node: Post }
type Post { title: String }
extend type Root { cheap: Int @cost(weight: 0) }
`
	g := provisioned(t, &GraphQL{Schema: sdl})
	tests := []struct {
		query string
		want  int64
	}{
		{`{ users(limit: 10) { name } }`, 2 + 10*1},                                         // type weight 2, sized by limit
		{`{ users { name } }`, 2 + 50*1},                                                    // assumedSize
		{`{ search(q: "x") { name } }`, 2 + 10 + 1*1},                                       // argument weight; list of default size 1
		{`{ me { friends { name } } }`, 2 + (2 + 1)},                                        // [User!]! is a list
		{`{ expensive cheap }`, 25},                                                         // field weights, from an extension too
		{`{ me { posts(first: 5) { edges { node { title } } totalCount } } }`, 2 + 1 + 5*4}, // connection by first
		{`{ unknownField { x } }`, 2},                                                       // unknown fields cost the defaults
	}
	for _, tt := range tests {
		n, err := g.Estimate(gqlPost(gqlBody(tt.query, nil, "")))
		if err != nil || n != tt.want {
			t.Errorf("%s: got %d %v, want %d", tt.query, n, err, tt.want)
		}
	}

	for _, bad := range []string{
		`type Query { a: Int @cost(weight: -1) }`,
		`type Query { a: Int @cost }`,
		`type Query { a: [Int] @listSize(assumedSize: "x") }`,
		`type Query { a: [Int] @listSize(slicingArguments: [1]) }`,
		`type Query {`,
	} {
		if err := (&GraphQL{Schema: bad}).Provision(); err == nil {
			t.Errorf("schema %q accepted", bad)
		}
	}
	if _, err := (&GraphQL{Schema: sdl}).Estimate(gqlPost(gqlBody(`{a}`, nil, ""))); err == nil {
		t.Error("an unprovisioned schema was silently ignored")
	}
}

// hostile builds a query that must be refused, and the problem type.
func TestGraphQLHostileInputs(t *testing.T) {
	var aliases, directives, deep, chain, batch strings.Builder
	aliases.WriteString("{")
	for i := range 1000 {
		fmt.Fprintf(&aliases, " a%d: viewer { login }", i)
	}
	aliases.WriteString("}")
	directives.WriteString("{ a")
	for range 500 {
		directives.WriteString(" @d")
	}
	directives.WriteString(" }")
	deep.WriteString(strings.Repeat("{a", 900) + strings.Repeat("}", 900))
	chain.WriteString("query { ...F0 }")
	for i := range 300 {
		fmt.Fprintf(&chain, " fragment F%d on Q { ...F%d }", i, i+1)
	}
	chain.WriteString(" fragment F300 on Q { x }")
	batch.WriteString("[")
	for i := range 100000 {
		if i > 0 {
			batch.WriteString(",")
		}
		batch.WriteString(`{"query":"{a}"}`)
	}
	batch.WriteString("]")

	tests := []struct {
		name string
		g    GraphQL
		body string
		typ  string
	}{
		{"alias bomb", GraphQL{}, gqlBody(aliases.String(), nil, ""), TypeGraphQLTooManyAliases},
		{"directive overloading", GraphQL{}, gqlBody(directives.String(), nil, ""), TypeGraphQLTooManyDirs},
		{"deep nesting", GraphQL{MaxTokens: 100000}, gqlBody(deep.String(), nil, ""), TypeGraphQLTooDeep},
		{"deeper than the parser allows", GraphQL{MaxTokens: 1 << 20}, gqlBody(strings.Repeat("{a", 5000)+strings.Repeat("}", 5000), nil, ""), TypeGraphQLTooDeep},
		{"fragment chain without fields", GraphQL{MaxTokens: 100000}, gqlBody(chain.String(), nil, ""), ""},
		{"fragment cycle", GraphQL{}, gqlBody(`query { ...A } fragment A on Q { x ...B } fragment B on Q { ...A }`, nil, ""), TypeGraphQLFragmentCycle},
		{"self-spreading fragment", GraphQL{}, gqlBody(`query { ...A } fragment A on Q { a { ...A } }`, nil, ""), TypeGraphQLFragmentCycle},
		{"unknown fragment", GraphQL{}, gqlBody(`query { ...Nope }`, nil, ""), TypeGraphQLUnknownFrag},
		{"token limit", GraphQL{}, gqlBody("{"+strings.Repeat(" a", 20000)+"}", nil, ""), TypeGraphQLTooManyTokens},
		{"huge batch", GraphQL{MaxBodyBytes: 10 << 20}, batch.String(), TypeGraphQLBatchTooLarge},
		{"cost cap", GraphQL{MaxCost: 1000}, gqlBody(`{ a(first: 100) { b(first: 100) { c } } }`, nil, ""), TypeGraphQLCostExceeded},
		{"overflowing cost hits the cap", GraphQL{MaxCost: 1 << 40}, gqlBody(`{ a(first: 9223372036854775807) { b(first: 9223372036854775807) { c } } }`, nil, ""), TypeGraphQLCostExceeded},
		{"ambiguous operation", GraphQL{}, gqlBody(`query A { a } query B { b }`, nil, ""), TypeGraphQLAmbiguousOp},
		{"unknown operation", GraphQL{}, gqlBody(`query A { a }`, nil, "B"), TypeGraphQLUnknownOp},
		{"syntax error", GraphQL{}, gqlBody(`{ a `, nil, ""), TypeGraphQLParse},
		{"malformed JSON", GraphQL{}, `{"query": "{ a }"`, TypeMalformedJSON},
		{"missing query (persisted)", GraphQL{}, `{"extensions":{"persistedQuery":{"version":1,"sha256Hash":"abc"}}}`, TypeGraphQLMissingQuery},
		{"query of the wrong type", GraphQL{}, `{"query": 5}`, TypeGraphQLInvalidRequest},
		{"empty batch", GraphQL{}, `[]`, TypeGraphQLInvalidRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := provisioned(t, &tt.g)
			start := time.Now()
			c, err := g.Analyze(gqlPost(tt.body))
			// Generous: these take microseconds to milliseconds; the bound
			// only catches exponential or unbounded work.
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v", d)
			}
			if tt.typ == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				if c.Cost != 1 {
					t.Fatalf("cost %d", c.Cost)
				}
				return
			}
			var ie *InputError
			if !errors.As(err, &ie) || ie.Type != tt.typ || ie.Status != 400 || ie.Detail == "" {
				t.Fatalf("err = %v, want a 400 %s", err, tt.typ)
			}
		})
	}
}

// TestGraphQLFragmentFanOutIsLinear: each fragment spreads the previous one
// twice, so the expanded query has 2^41 fields. Costing must reuse each
// fragment's cost rather than expand it.
func TestGraphQLFragmentFanOutIsLinear(t *testing.T) {
	var q strings.Builder
	q.WriteString("query { ...F40 } fragment F0 on Q { a b }")
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&q, " fragment F%d on Q { ...F%d ...F%d }", i, i-1, i-1)
	}
	g := provisioned(t, &GraphQL{})
	start := time.Now()
	n, err := g.Estimate(gqlPost(gqlBody(q.String(), nil, "")))
	if err != nil || n != 1<<41 {
		t.Fatalf("got %d %v, want 2^41", n, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestGraphQLOnMalformedDefault(t *testing.T) {
	g := provisioned(t, &GraphQL{OnMalformed: OnMalformedDefault, DefaultCost: 50})
	for _, body := range []string{`{"query": "{ a "}`, `not json`, `{"extensions":{}}`, gqlBody(`query A { a }`, nil, "B")} {
		n, err := g.Estimate(gqlPost(body))
		if err != nil || n != 50 {
			t.Errorf("%s: %d %v, want the default cost", body, n, err)
		}
	}
	// One bad element of a batch costs the default; the others their cost.
	n, err := g.Estimate(gqlPost(`[{"query":"{ a b }"},{"query":"{"}]`))
	if err != nil || n != 52 {
		t.Errorf("batch: %d %v", n, err)
	}
	// Guards are never forgiven.
	_, err = g.Estimate(gqlPost(gqlBody(`query { ...A } fragment A on Q { ...A }`, nil, "")))
	var ie *InputError
	if !errors.As(err, &ie) || ie.Type != TypeGraphQLFragmentCycle {
		t.Errorf("cycle with default policy: %v", err)
	}
}

func TestGraphQLBodyBounds(t *testing.T) {
	g := provisioned(t, &GraphQL{})
	r := gqlPost(`{"query":"{ a`)
	r.Truncated = true
	var ie *InputError
	if _, err := g.Estimate(r); !errors.As(err, &ie) || ie.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("truncated: %v", err)
	}
	m := gqlPost("--x\r\n")
	m.HTTP.Header.Set("Content-Type", "multipart/form-data; boundary=x")
	if _, err := g.Estimate(m); !errors.As(err, &ie) || ie.Status != http.StatusUnsupportedMediaType {
		t.Fatalf("multipart: %v", err)
	}
	if g.BodyLimit() != DefaultGraphQLBodyBytes {
		t.Fatal("BodyLimit")
	}
}

func TestGraphQLValidate(t *testing.T) {
	for _, g := range []GraphQL{
		{Model: "ibm"},
		{MaxDepth: -1},
		{DefaultListSize: -1},
		{SlicingArguments: []string{""}},
		{OnMalformed: OnMalformedDefault},
	} {
		if err := g.Provision(); err == nil {
			t.Errorf("%+v accepted", g)
		}
	}
}

func TestGraphQLDocumentCache(t *testing.T) {
	g := provisioned(t, &GraphQL{})
	q := `query($n: Int) { a(first: $n) { b } }`
	for _, n := range []int{3, 5, 3} {
		// Same text, different variables: the cached document is reused,
		// the variables are not.
		got, err := g.Estimate(gqlPost(gqlBody(q, map[string]any{"n": n}, "")))
		if err != nil || got != int64(1+n) {
			t.Fatalf("n=%d: %d %v", n, got, err)
		}
	}
	d1, _ := g.parse(q)
	d2, _ := g.parse(q)
	if d1 != d2 {
		t.Fatal("the second parse did not hit the cache")
	}

	c := newDocCache(2, 10, 15)
	docs := map[string]*ast.QueryDocument{}
	for _, k := range []string{"aaaa", "bbbb", "cccc"} {
		docs[k] = &ast.QueryDocument{}
		c.put(k, docs[k])
	}
	if c.get("aaaa") != nil || c.get("bbbb") != docs["bbbb"] || c.get("cccc") != docs["cccc"] {
		t.Fatal("entry bound: the least recently used entry must go")
	}
	c.put("dddddddd", &ast.QueryDocument{}) // 4+4+8 > 15 bytes: evicts bbbb
	if c.get("bbbb") != nil || c.get("cccc") == nil {
		t.Fatal("byte bound")
	}
	c.put("this query is too long", &ast.QueryDocument{})
	if c.get("this query is too long") != nil {
		t.Fatal("a query over the size bound was cached")
	}
	var nilCache *docCache
	nilCache.put("x", nil)
	if nilCache.get("x") != nil {
		t.Fatal("nil cache hit")
	}
}

func TestGraphQLConcurrentEstimates(t *testing.T) {
	g := provisioned(t, &GraphQL{CacheSize: 4})
	done := make(chan error)
	for w := range 8 {
		go func() {
			var err error
			for i := range 200 {
				n := (w+i)%6 + 1
				q := fmt.Sprintf(`query($n: Int) { a%d(first: $n) { b } }`, i%7)
				var got int64
				got, err = g.Estimate(gqlPost(gqlBody(q, map[string]any{"n": n}, "")))
				if err == nil && got != int64(1+n) {
					err = fmt.Errorf("got %d, want %d", got, 1+n)
				}
				if err != nil {
					break
				}
			}
			done <- err
		}()
	}
	for range 8 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestGraphQLVariableSizeSpellings: a size a server would coerce to the Int
// 100 costs as 100, however it is spelt: 100.0 and 1e2 (graphql-js,
// graphql-ruby), "100" (gqlgen, also with JSON escapes), and whatever the
// spelling of the variable's name. A fraction counts rounded up; a size
// too large for an int64 saturates.
func TestGraphQLVariableSizeSpellings(t *testing.T) {
	g := provisioned(t, &GraphQL{})
	q := `query($n: Int) { users(first: $n) { name } }`
	cost := func(vars string) int64 {
		t.Helper()
		n, err := g.Estimate(gqlPost(`{"query":"` + q + `","variables":` + vars + `}`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	want := cost(`{"n":100}`)
	for _, vars := range []string{`{"n":100.0}`, `{"n":1e2}`, `{"n":1E2}`, `{"n":"100"}`, `{"n":" 100 "}`,
		`{"n":99.5}`, `{"n":"\u0031\u0030\u0030"}`, `{"n":"1\u0030\u0030"}`, `{"\u006e":100}`} {
		if got := cost(vars); got != want {
			t.Errorf("variables %s: cost %d, want %d (as for n = 100)", vars, got, want)
		}
	}
	if got := cost(`{"n":1e400}`); got <= want {
		t.Errorf("n = 1e400: cost %d, want it saturated above %d", got, want)
	}
}

// TestGraphQLQueryInURLOfAPost: a POST whose URL carries a query (which
// graphql-go's handler and express-graphql run instead of the body's) is
// charged for it, whatever the body: a cheap one, an application/graphql
// one, a malformed one under on_malformed default, or none.
func TestGraphQLQueryInURLOfAPost(t *testing.T) {
	expensive := `{ users(first: 1000) { friends(first: 1000) { name } } }`
	for _, tc := range []struct {
		name, body, contentType string
		g                       *GraphQL
	}{
		{"cheap JSON body", `{"query":"{ __typename }"}`, "", &GraphQL{}},
		{"application/graphql body", `{ __typename }`, "application/graphql", &GraphQL{}},
		{"malformed body, on_malformed default", `not json`, "", &GraphQL{OnMalformed: OnMalformedDefault, DefaultCost: 1}},
		{"no body", ``, "", &GraphQL{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := provisioned(t, tc.g)
			want, err := g.Estimate(gqlPost(gqlBody(expensive, nil, "")))
			if err != nil {
				t.Fatal(err)
			}
			r := gqlPost(tc.body)
			if tc.contentType != "" {
				r.HTTP.Header.Set("Content-Type", tc.contentType)
			}
			r.HTTP.URL.RawQuery = "query=" + url.QueryEscape(expensive)
			if got, err := g.Estimate(r); err != nil || got < want {
				t.Fatalf("POST ?query=<%d points>: charged %d, %v", want, got, err)
			}
		})
	}
}

// abusive is the query that passes as cheap without a schema: four fields,
// no slicing argument anywhere, yet every level is a list.
const abusive = `{ allUsers { posts { comments { likes } } } }`

// TestGraphQLPricingOptions: each option's price of the abusive query and
// of queries with fragments, aliases, variables, mutations and batches,
// each number worked out by hand in its comment.
func TestGraphQLPricingOptions(t *testing.T) {
	lists := []string{"all*", "*s"}
	for _, tc := range []struct {
		name string
		g    GraphQL
		body string
		want int64
	}{
		// 1 + 1 + 1 + 1: every field once.
		{"abusive, defaults", GraphQL{}, gqlBody(abusive, nil, ""), 4},
		// Lists of 1 change nothing in the fields model.
		{"abusive, list_fields alone", GraphQL{ListFields: lists}, gqlBody(abusive, nil, ""), 4},
		// likes 1; comments 1 + 10×1 = 11; posts 1 + 10×11 = 111; allUsers 1 + 10×111.
		{"abusive, list_fields, 10", GraphQL{ListFields: lists, DefaultListSize: 10}, gqlBody(abusive, nil, ""), 1111},
		// Only allUsers is a list: 1 + 10 × (1 + 1 + 1).
		{"abusive, all* only", GraphQL{ListFields: []string{"all*"}, DefaultListSize: 10}, gqlBody(abusive, nil, ""), 31},
		// 1 + 1.5 + 2.25 + 3.375 = 8.125, rounded up.
		{"abusive, depth_factor", GraphQL{DepthFactor: 1.5}, gqlBody(abusive, nil, ""), 9},
		// 1 + 10 × (1.5 + 10 × (2.25 + 10 × 3.375)) = 1 + 10 × 361.5.
		{"abusive, both", GraphQL{ListFields: lists, DefaultListSize: 10, DepthFactor: 1.5}, gqlBody(abusive, nil, ""), 3616},
		// A query pays no mutation price.
		{"abusive, mutation", GraphQL{Mutation: 10, Subscription: 50}, gqlBody(abusive, nil, ""), 4},
		// GitHub: 1 + 10 × (1 + 10 × (1 + 10 × 1)) = 1111 requests: 11 points.
		{"abusive, github", GraphQL{Model: ModelGitHub, ListFields: lists, DefaultListSize: 10}, gqlBody(abusive, nil, ""), 11},
		// A factor of 1.1 over 3 levels: 1 + 1.1 + 1.21 = 3.31 → 4.
		{"factor 1.1", GraphQL{DepthFactor: 1.1}, gqlBody(`{ a { b { c } } }`, nil, ""), 4},
		{"factor 1 is none", GraphQL{DepthFactor: 1}, gqlBody(abusive, nil, ""), 4},
		// Fragments: allUsers 1 (level 1) + 10 × (posts 1.5 + 10 × id 2.25),
		// P costed once at its own levels and scaled by 1.5 where spread.
		{"fragments", GraphQL{ListFields: lists, DefaultListSize: 10, DepthFactor: 1.5},
			gqlBody(`query { ...U } fragment U on Query { allUsers { ...P } } fragment P on User { posts { id } }`, nil, ""), 241},
		// Aliases: two lists of 10 users, 1 + 10 × 1 each.
		{"aliases", GraphQL{ListFields: lists, DefaultListSize: 10},
			gqlBody(`{ a: allUsers { id } b: allUsers { id } }`, nil, ""), 22},
		// A slicing argument's variable sizes the list: 1 + 5 × 1.
		{"variable first", GraphQL{ListFields: lists, DefaultListSize: 10},
			gqlBody(`query($n: Int) { allUsers(first: $n) { id } }`, map[string]any{"n": 5}, ""), 6},
		// Unbound, it counts default_list_size: 1 + 10 × 1.
		{"variable first, unbound", GraphQL{ListFields: lists, DefaultListSize: 10},
			gqlBody(`query($n: Int) { allUsers(first: $n) { id } }`, nil, ""), 11},
		// Its default value: 1 + 3 × 1.
		{"variable first, default", GraphQL{ListFields: lists, DefaultListSize: 10},
			gqlBody(`query($n: Int = 3) { allUsers(first: $n) { id } }`, nil, ""), 4},
		// Two of the abusive query: 2 × 1111.
		{"batch", GraphQL{ListFields: lists, DefaultListSize: 10}, "[" + gqlBody(abusive, nil, "") + "," + gqlBody(abusive, nil, "") + "]", 2222},
		// Fields 4, plus 10 for each of the two top-level fields.
		{"mutation", GraphQL{Mutation: 10},
			gqlBody(`mutation { createUser(name: "a") { id } deletePost(id: 1) { id } }`, nil, ""), 24},
		// An alias and a fragment's field count, __typename does not:
		// fields 2 + 2, plus 2 × 10.
		{"mutation, alias and fragment", GraphQL{Mutation: 10},
			gqlBody(`mutation { a: createUser { id } ...M __typename } fragment M on Mutation { deletePost { id } }`, nil, ""), 24},
		// Fields 2, plus 50.
		{"subscription", GraphQL{Mutation: 10, Subscription: 50}, gqlBody(`subscription { onPost { id } }`, nil, ""), 52},
		// GitHub: 1 point, plus 10.
		{"mutation, github", GraphQL{Model: ModelGitHub, Mutation: 10}, gqlBody(`mutation { createUser { id } }`, nil, ""), 11},
		// A mutation in a batch of two, beside a query: (2 + 10) + 4.
		{"mutation in a batch", GraphQL{Mutation: 10},
			"[" + gqlBody(`mutation { createUser { id } }`, nil, "") + "," + gqlBody(abusive, nil, "") + "]", 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := provisioned(t, &tc.g)
			got, err := g.Estimate(gqlPost(tc.body))
			if err != nil || got != tc.want {
				t.Fatalf("cost %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// TestGraphQLListFieldsYieldToTheSchema: a field the schema knows is what
// the schema says, whatever its name; one it does not know follows
// list_fields.
func TestGraphQLListFieldsYieldToTheSchema(t *testing.T) {
	g := provisioned(t, &GraphQL{ListFields: []string{"all*"}, DefaultListSize: 10,
		Schema: "type Query { allUsers: User }\ntype User { id: ID }"})
	for query, want := range map[string]int64{
		`{ allUsers { id } }`:   2,      // not a list, says the schema
		`{ allThings { id } }`:  1 + 10, // unknown: a list by its name
		`{ allUsers { id } x }`: 3,
	} {
		if got, err := g.Estimate(gqlPost(gqlBody(query, nil, ""))); err != nil || got != want {
			t.Errorf("%s: %d, %v; want %d", query, got, err, want)
		}
	}
}

// TestGraphQLPricingSaturates: a depth factor over huge lists saturates
// instead of overflowing, and max_cost still refuses.
func TestGraphQLPricingSaturates(t *testing.T) {
	g := provisioned(t, &GraphQL{DepthFactor: 10, MaxDepth: 30})
	q := `{ a(first: 1000000000) { b(first: 1000000000) { c(first: 1000000000) { d } } } }`
	if got, err := g.Estimate(gqlPost(gqlBody(q, nil, ""))); err != nil || got != math.MaxInt64 {
		t.Fatalf("%d, %v", got, err)
	}
	g = provisioned(t, &GraphQL{DepthFactor: 1.5, MaxCost: 8})
	if _, err := g.Estimate(gqlPost(gqlBody(abusive, nil, ""))); !isType(err, TypeGraphQLCostExceeded) {
		t.Fatalf("9 points over a max_cost of 8: %v", err)
	}
}

func isType(err error, typ string) bool {
	var ie *InputError
	return errors.As(err, &ie) && ie.Type == typ
}

func TestGraphQLPricingValidate(t *testing.T) {
	for name, g := range map[string]GraphQL{
		"factor below 1":   {DepthFactor: 0.5},
		"factor negative":  {DepthFactor: -2},
		"factor NaN":       {DepthFactor: math.NaN()},
		"factor infinite":  {DepthFactor: math.Inf(1)},
		"negative price":   {Mutation: -1},
		"bad glob":         {ListFields: []string{"[a-"}},
		"empty glob":       {ListFields: []string{""}},
		"negative sub fee": {Subscription: -5},
		"factor in github": {DepthFactor: 1.5, Model: ModelGitHub}, // no weights to scale: silently ignored
	} {
		if err := g.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestGraphQLPricingDocsTable holds docs/costs.md's table of what each
// option does to three queries to the estimator's numbers.
func TestGraphQLPricingDocsTable(t *testing.T) {
	queries := []string{
		abusive,
		`{ viewer { repositories(first: 10) { nodes { name } } } }`,
		`mutation { createPost(title: "hi") { id author { name } } }`,
	}
	lists := []string{"*s", "all*"}
	for _, row := range []struct {
		name string
		g    GraphQL
		want [3]int64
	}{
		{"defaults", GraphQL{}, [3]int64{4, 22, 4}},
		{"list_fields", GraphQL{ListFields: lists, DefaultListSize: 10}, [3]int64{1111, 112, 4}},
		{"depth_factor", GraphQL{DepthFactor: 1.5}, [3]int64{9, 59, 7}},
		{"both", GraphQL{ListFields: lists, DefaultListSize: 10, DepthFactor: 1.5}, [3]int64{3616, 363, 7}},
		{"mutation", GraphQL{Mutation: 10}, [3]int64{4, 22, 14}},
	} {
		g := provisioned(t, &row.g)
		for i, q := range queries {
			if got, err := g.Estimate(gqlPost(gqlBody(q, nil, ""))); err != nil || got != row.want[i] {
				t.Errorf("%s, query %d: %d, %v; want %d", row.name, i+1, got, err, row.want[i])
			}
		}
	}
}

// FuzzGraphQLPricing: with every pricing option on, any request is costed
// without a panic, and never cheaper than without them (sizes of at least
// 1, a factor of at least 1 and fixed prices only add).
func FuzzGraphQLPricing(f *testing.F) {
	for _, q := range []string{abusive, `mutation { a: createUser { id } ...M } fragment M on Mutation { b { c } }`,
		`subscription { s(first: 3) { items { x } } }`, `query($n: Int) { allUsers(first: $n) { posts { id } } }`} {
		f.Add(gqlBody(q, map[string]any{"n": 7}, ""))
	}
	plain := &GraphQL{MaxCost: 0, CacheSize: -1}
	priced := &GraphQL{ListFields: []string{"*s", "all*", "[a-c]"}, DefaultListSize: 7, DepthFactor: 1.7,
		Mutation: 11, Subscription: 13, CacheSize: -1}
	for _, g := range []*GraphQL{plain, priced} {
		if err := g.Provision(); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, body string) {
		a, errA := plain.Estimate(gqlPost(body))
		b, errB := priced.Estimate(gqlPost(body))
		if (errA == nil) != (errB == nil) {
			t.Fatalf("%q: errors %v and %v", body, errA, errB)
		}
		if errA == nil && b < a {
			t.Fatalf("%q: %d with the options, %d without", body, b, a)
		}
	})
}
