package cost

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"
)

// GraphQL models.
const (
	// ModelFields charges every field 1 (or its schema @cost weight), a list
	// field multiplying the cost of its selection by its size.
	ModelFields = "fields"
	// ModelGitHub charges GitHub's rate-limit points: the number of requests
	// needed to fulfil every connection, divided by 100 and rounded, at least 1.
	ModelGitHub = "github"
)

// Defaults of [GraphQL].
const (
	DefaultGraphQLBodyBytes     = 1 << 20
	DefaultGraphQLMaxTokens     = 10000
	DefaultGraphQLMaxDepth      = 20
	DefaultGraphQLMaxAliases    = 30
	DefaultGraphQLMaxDirectives = 50
	DefaultGraphQLMaxBatch      = 10
	DefaultGraphQLListSize      = 1
	DefaultGraphQLCacheSize     = 128
)

// GraphQL estimates the cost of a GraphQL request from the query alone,
// without executing it and without a schema (one may be given to refine it).
//
// # The fields model (default)
//
// Every field costs 1. A list field multiplies the cost of its selection by
// its size: the largest of its slicing arguments (first, last) when present,
// a literal or a variable (from the request's variables, else the
// variable's default), else DefaultListSize. Nested sizes multiply:
//
//	cost(field) = weight + size × cost(selection)   (list fields)
//	cost(field) = weight + cost(selection)          (other fields)
//
// Without a schema, a field is a list exactly when it has a slicing argument
// (the Relay connection convention GitHub, Shopify and others follow) or
// its name matches one of ListFields. DepthFactor weighs deeper fields
// more, and Mutation and Subscription price an operation's top-level
// fields (see their fields).
// __typename costs nothing. Named and inline fragments are expanded where
// they are spread; @skip and @include are ignored (the conservative reading).
// A query costs at least 1.
//
// # The GitHub model
//
// GitHub's published formula: add up the requests needed to fulfil each
// connection, assuming every connection returns first/last items (1 for a
// top connection, and for a nested one the product of the sizes of the
// connections above it); divide by 100 and round to the nearest whole
// number; the minimum is 1. GitHub's own example — repositories(first: 100),
// within each issues(first: 50), within each labels(first: 60) — needs
// 1 + 100 + 5,000 = 5,101 requests: 51 points. [GraphQL.Analyze] also
// reports GitHub's node count (550 and 22,060 in GitHub's node-limit
// examples).
//
// # Schema directives
//
// An optional Schema (SDL) gives exact weights in the style of the IBM
// GraphQL cost specification: @cost(weight: Int) on a field definition sets
// that field's weight; on a type, the weight of every field returning it; on
// an argument definition, a weight added when the argument is given.
// @listSize(assumedSize: Int, slicingArguments: [String!]) on a field sets
// its slicing arguments and the size assumed when none is given; fields of
// list type ([T]) are lists even without arguments. sizedFields is accepted
// but the size then multiplies the field's whole selection (an over-estimate
// for totalCount and pageInfo). Fields the schema does not know cost the
// defaults. The GitHub model uses the schema's sizes but not its weights.
//
// # Requests and guards
//
// GET requests carry query, operationName and variables in the URL; POST
// bodies are application/json (an object, or an array for a batch whose
// costs are summed) or application/graphql (the query itself). When the
// document holds several operations, operationName chooses one; it is an
// error when missing or unknown.
//
// Parsing and costing are bounded: MaxBodyBytes (413), MaxTokens for the
// parser, then MaxDepth, MaxAliases and MaxDirectives over the executed
// operation and the fragments it reaches, fragment cycles, MaxBatch, and
// MaxCost per query; all are 400 problems. Each fragment is costed once and
// reused wherever it is spread, so a document whose fragments spread each
// other exponentially is costed in linear time, and costs saturate at the
// int64 maximum instead of overflowing.
//
// Malformed input (bad JSON, a syntax error, a missing query, an unknown
// operation) is a 400, or DefaultCost when OnMalformed is "default"; guard
// violations are always refused.
type GraphQL struct {
	// Model is "fields" (default) or "github".
	Model string `json:"model,omitempty"`
	// DefaultListSize is the size of a list whose size the request does not
	// give: a slicing argument bound to a missing variable, or a schema list
	// field without one (default 1).
	DefaultListSize int64 `json:"default_list_size,omitempty"`
	// SlicingArguments are the arguments that give a list's size (default
	// first and last).
	SlicingArguments []string `json:"slicing_arguments,omitempty"`
	// MaxBodyBytes bounds the body read (default 1 MiB).
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// MaxTokens bounds the lexical tokens of each query (default 10,000).
	MaxTokens int `json:"max_tokens,omitempty"`
	// MaxDepth bounds the nesting of fields (default 20).
	MaxDepth int `json:"max_depth,omitempty"`
	// MaxAliases bounds the aliases of a query (default 30).
	MaxAliases int `json:"max_aliases,omitempty"`
	// MaxDirectives bounds the directives of a query (default 50).
	MaxDirectives int `json:"max_directives,omitempty"`
	// MaxBatch bounds the queries of a batch (default 10).
	MaxBatch int `json:"max_batch,omitempty"`
	// MaxCost refuses any query costing more (0, the default, sets no cap:
	// the rate limits themselves refuse what can never be admitted).
	MaxCost int64 `json:"max_cost,omitempty"`
	// Schema is optional SDL whose @cost and @listSize directives refine
	// the cost.
	Schema string `json:"schema,omitempty"`
	// OnMalformed is "reject" (default) or "default".
	OnMalformed string `json:"on_malformed,omitempty"`
	// DefaultCost is charged for malformed input when OnMalformed is
	// "default"; it must then be positive.
	DefaultCost int64 `json:"default_cost,omitempty"`
	// ListFields are glob patterns (path.Match: *, ?, [a-z]) of field names
	// that are lists when no schema says otherwise (e.g. "*s", "all*",
	// "*Connection"): such a field without a slicing argument counts as
	// DefaultListSize items, its selection multiplied by it, as a schema
	// list field does. A field a schema knows is what the schema says.
	ListFields []string `json:"list_fields,omitempty"`
	// DepthFactor, when above 1, multiplies each field's weight by
	// DepthFactor^(level−1), level 1 being the operation's own fields, in
	// the fields model: with 1.5, { a { b { c } } } costs 1 + 1.5 + 2.25 =
	// 4.75, rounded up to 5. Lists multiply as before. 0 (the default) and
	// 1 leave costs as they are.
	DepthFactor float64 `json:"depth_factor,omitempty"`
	// Mutation and Subscription are added, in either model, for each
	// top-level field of a mutation or subscription operation (aliases
	// and fragments' fields counted, __typename not): a fixed price for
	// what a query's shape does not show (0, the default, adds nothing).
	Mutation     int64 `json:"mutation,omitempty"`
	Subscription int64 `json:"subscription,omitempty"`
	// ExtensionsCost shows the request's cost to the client: Cascade adds
	// Shopify's extensions.cost object to a JSON response, and to the
	// problem body of a refusal. The estimator only carries the setting;
	// the handler writes it (see [ExtensionsWriter]).
	ExtensionsCost bool `json:"extensions_cost,omitempty"`
	// CacheSize is the number of parsed queries kept for reuse (default
	// 128; -1 disables the cache). Clients send the same few query texts
	// with different variables, and parsing is most of the cost of an
	// estimate; the cache holds queries up to 16 KiB, 1 MiB of text in all.
	CacheSize int `json:"cache_size,omitempty"`

	schema *schemaIndex
	cache  *docCache
}

// Provision applies defaults, validates, and indexes the schema.
func (g *GraphQL) Provision() error {
	if g.Model == "" {
		g.Model = ModelFields
	}
	if g.DefaultListSize == 0 {
		g.DefaultListSize = DefaultGraphQLListSize
	}
	if len(g.SlicingArguments) == 0 {
		g.SlicingArguments = []string{"first", "last"}
	}
	if g.MaxBodyBytes == 0 {
		g.MaxBodyBytes = DefaultGraphQLBodyBytes
	}
	if g.MaxTokens == 0 {
		g.MaxTokens = DefaultGraphQLMaxTokens
	}
	if g.MaxDepth == 0 {
		g.MaxDepth = DefaultGraphQLMaxDepth
	}
	if g.MaxAliases == 0 {
		g.MaxAliases = DefaultGraphQLMaxAliases
	}
	if g.MaxDirectives == 0 {
		g.MaxDirectives = DefaultGraphQLMaxDirectives
	}
	if g.MaxBatch == 0 {
		g.MaxBatch = DefaultGraphQLMaxBatch
	}
	if g.OnMalformed == "" {
		g.OnMalformed = OnMalformedReject
	}
	if g.CacheSize == 0 {
		g.CacheSize = DefaultGraphQLCacheSize
	}
	if err := g.Validate(); err != nil {
		return err
	}
	if g.CacheSize > 0 {
		g.cache = newDocCache(g.CacheSize, maxCachedQuery, maxCachedBytes)
	}
	if g.Schema != "" {
		idx, err := indexSchema(g.Schema)
		if err != nil {
			return fmt.Errorf("graphql: schema: %w", err)
		}
		g.schema = idx
	}
	return nil
}

// Validate rejects bad values. Zero values mean "the default".
func (g *GraphQL) Validate() error {
	switch g.Model {
	case "", ModelFields, ModelGitHub:
	default:
		return fmt.Errorf(`graphql: model must be "fields" or "github", got %q`, g.Model)
	}
	for name, v := range map[string]int64{
		"default_list_size": g.DefaultListSize,
		"max_body_bytes":    g.MaxBodyBytes,
		"max_tokens":        int64(g.MaxTokens),
		"max_depth":         int64(g.MaxDepth),
		"max_aliases":       int64(g.MaxAliases),
		"max_directives":    int64(g.MaxDirectives),
		"max_batch":         int64(g.MaxBatch),
		"max_cost":          g.MaxCost,
	} {
		if v < 0 {
			return fmt.Errorf("graphql: %s must not be negative, got %d", name, v)
		}
	}
	if g.CacheSize < -1 {
		return fmt.Errorf("graphql: cache_size must be -1 (disabled), 0 (default) or positive, got %d", g.CacheSize)
	}
	for _, a := range g.SlicingArguments {
		if a == "" {
			return fmt.Errorf("graphql: slicing_arguments must not contain an empty name")
		}
	}
	for _, p := range g.ListFields {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return fmt.Errorf("graphql: list_fields: %q is not a glob pattern of field names (e.g. *s, all*, *Connection)", p)
		}
	}
	if f := g.DepthFactor; math.IsNaN(f) || math.IsInf(f, 0) || f != 0 && f < 1 {
		return fmt.Errorf("graphql: depth_factor must be at least 1 (e.g. 1.5), or 0 for none, got %v", f)
	}
	if g.DepthFactor > 1 && g.Model == ModelGitHub {
		// Else silently ignored: GitHub's formula counts no field weights.
		return fmt.Errorf("graphql: depth_factor weighs fields, which model github does not count: drop depth_factor, or use model fields")
	}
	if g.Mutation < 0 || g.Subscription < 0 {
		return fmt.Errorf("graphql: mutation and subscription costs must not be negative, got %d and %d", g.Mutation, g.Subscription)
	}
	if g.OnMalformed != "" {
		if err := validateOnMalformed(g.OnMalformed, g.DefaultCost); err != nil {
			return fmt.Errorf("graphql: %w", err)
		}
	}
	return nil
}

// isListField reports whether a field the schema does not know is a list
// by its name (ListFields).
func (g *GraphQL) isListField(name string) bool {
	for _, p := range g.ListFields {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// NeedsBody returns true (POST requests carry the query in the body).
func (g *GraphQL) NeedsBody() bool { return true }

// BodyLimit returns MaxBodyBytes (or its default).
func (g *GraphQL) BodyLimit() int64 { return orDefault(g.MaxBodyBytes, DefaultGraphQLBodyBytes) }

// Estimate returns the request's cost in the configured model.
func (g *GraphQL) Estimate(req *Request) (int64, error) {
	c, err := g.Analyze(req)
	return c.Cost, err
}

// Complexity is the detailed result of [GraphQL.Analyze]. For a batch, the
// counts are summed and the maxima taken over its queries.
type Complexity struct {
	// Cost is the charge in the configured model (Fields or Points).
	Cost int64
	// Fields is the fields-model cost.
	Fields int64
	// Requests is the number of requests GitHub's formula counts.
	Requests int64
	// Points is GitHub's score: round(Requests/100), at least 1.
	Points int64
	// Nodes is GitHub's node count: the items all connections may return.
	Nodes int64
	// Depth is the deepest field nesting.
	Depth int
	// Aliases and Directives are counted over the executed operation and
	// the fragments it reaches.
	Aliases, Directives int
	// Queries is the number of queries (1, or the batch's length).
	Queries int
	// Defaulted counts malformed queries charged DefaultCost.
	Defaulted int
}

// Analyze parses the request's GraphQL queries and returns their complexity.
func (g *GraphQL) Analyze(req *Request) (Complexity, error) {
	if g.Schema != "" && g.schema == nil {
		return Complexity{}, errors.New("graphql: schema configured but not provisioned (call Provision)")
	}
	var total Complexity
	qs, err := g.queries(req)
	if err != nil {
		return g.malformed(total, err)
	}
	for _, q := range qs {
		if q.err != nil {
			total, err = g.malformed(total, q.err)
		} else {
			var c Complexity
			c, err = g.analyzeOne(q)
			if err != nil {
				total, err = g.malformed(total, err)
			} else {
				total.add(c)
			}
		}
		if err != nil {
			return Complexity{}, err
		}
	}
	return total, nil
}

func (c *Complexity) add(o Complexity) {
	c.Cost = satAdd(c.Cost, o.Cost)
	c.Fields = satAdd(c.Fields, o.Fields)
	c.Requests = satAdd(c.Requests, o.Requests)
	c.Points = satAdd(c.Points, o.Points)
	c.Nodes = satAdd(c.Nodes, o.Nodes)
	c.Depth = max(c.Depth, o.Depth)
	c.Aliases = max(c.Aliases, o.Aliases)
	c.Directives = max(c.Directives, o.Directives)
	c.Queries += o.Queries
	c.Defaulted += o.Defaulted
}

// malformed applies OnMalformed to err: a malformed-class InputError becomes
// a DefaultCost charge when so configured; anything else is returned.
func (g *GraphQL) malformed(total Complexity, err error) (Complexity, error) {
	var ie *InputError
	if g.OnMalformed == OnMalformedDefault && errors.As(err, &ie) && isMalformed(ie.Type) {
		total.add(Complexity{Cost: g.DefaultCost, Queries: 1, Defaulted: 1})
		return total, nil
	}
	return Complexity{}, err
}

// isMalformed reports whether a problem is one OnMalformed "default"
// forgives: input the estimator cannot read. Guards (depth, aliases, cycles,
// size…) are always enforced.
func isMalformed(typ string) bool {
	switch typ {
	case TypeMalformedJSON, TypeGraphQLParse, TypeGraphQLMissingQuery, TypeGraphQLInvalidRequest,
		TypeGraphQLUnknownOp, TypeGraphQLAmbiguousOp, TypeGraphQLNoOperation, TypeGraphQLUnknownFrag:
		return true
	}
	return false
}

// gqlQuery is one query of a request, as sent.
type gqlQuery struct {
	query  string
	opName string
	vars   []byte // raw JSON of "variables", nil when absent
	err    error  // this element of a batch could not be read
}

// queries extracts the request's queries, without parsing them.
func (g *GraphQL) queries(req *Request) ([]gqlQuery, error) {
	r := req.HTTP
	if r != nil && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		q := urlQuery(r.URL.Query())
		if q.query == "" {
			q.err = missingQuery()
		}
		return []gqlQuery{q}, nil
	}
	// Some servers (graphql-go's handler, express-graphql) run a query in
	// the URL even on a POST, in place of the body's, whatever the body
	// holds: cost it as well, so that a cheap or malformed body never
	// covers for an expensive URL.
	var inURL []gqlQuery
	if r != nil && r.URL.RawQuery != "" {
		if v := r.URL.Query(); v.Get("query") != "" {
			inURL = []gqlQuery{urlQuery(v)}
		}
	}
	if inURL != nil && len(bytes.TrimSpace(req.Body)) == 0 && !req.Truncated {
		return inURL, nil // the query is in the URL only
	}
	qs, err := g.bodyQueries(req)
	if inURL == nil {
		return qs, err
	}
	if err != nil {
		qs = []gqlQuery{{err: err}} // charged (or refused) as the body alone would be
	}
	return append(qs, inURL...), nil
}

// bodyQueries extracts the queries of a request's body.
func (g *GraphQL) bodyQueries(req *Request) ([]gqlQuery, error) {
	r := req.HTTP
	if req.Truncated || int64(len(req.Body)) > g.BodyLimit() { // see LLM.EstimateUsage
		return nil, tooLarge(g.BodyLimit())
	}
	if r != nil {
		if ct := r.Header.Get("Content-Type"); ct != "" {
			mt, _, _ := mime.ParseMediaType(ct)
			switch {
			case mt == "application/graphql":
				q := gqlQuery{query: string(req.Body)}
				if strings.TrimSpace(q.query) == "" {
					q.err = missingQuery()
				}
				return []gqlQuery{q}, nil
			case strings.HasPrefix(mt, "multipart/"):
				// GraphQL multipart uploads put the operations next to
				// files of any size; costing them would mean buffering.
				return nil, &InputError{
					Status: http.StatusUnsupportedMediaType,
					Type:   TypeUnsupportedMediaType,
					Title:  "Unsupported media type for GraphQL cost estimation",
					Detail: fmt.Sprintf("%s bodies cannot be costed; send application/json", mt),
				}
			}
			// Anything else is read as JSON: servers that ignore the
			// content type would, and a wrong label must not be a free pass.
		}
	}
	c := &jsonCursor{b: req.Body}
	var qs []gqlQuery
	var err error
	switch c.peek() {
	case '{':
		var q gqlQuery
		q, err = readGQLObject(c)
		qs = append(qs, q)
	case '[':
		limit := orDefault(int64(g.MaxBatch), DefaultGraphQLMaxBatch)
		err = c.array(func() error {
			if int64(len(qs)) >= limit {
				return inputErr(TypeGraphQLBatchTooLarge, "GraphQL batch too large", "a batch may hold at most %d queries", limit)
			}
			if c.peek() != '{' {
				if err := c.skip(); err != nil {
					return err
				}
				qs = append(qs, gqlQuery{err: inputErr(TypeGraphQLInvalidRequest, "Invalid GraphQL request", "each batch element must be an object")})
				return nil
			}
			q, err := readGQLObject(c)
			qs = append(qs, q)
			return err
		})
		if err == nil && len(qs) == 0 {
			err = inputErr(TypeGraphQLInvalidRequest, "Invalid GraphQL request", "the batch is empty")
		}
	case 0:
		return nil, missingQuery()
	default:
		err = c.fail("a GraphQL request must be a JSON object or array")
	}
	if err == nil {
		err = c.end()
	}
	if err != nil {
		var se *jsonSyntaxError
		if errors.As(err, &se) {
			return nil, &InputError{Status: http.StatusBadRequest, Type: TypeMalformedJSON, Title: "Malformed JSON request body", Detail: se.Error(), Err: err}
		}
		return nil, err
	}
	return qs, nil
}

// urlQuery is the query of a URL's query string (a GET request's).
func urlQuery(v url.Values) gqlQuery {
	q := gqlQuery{query: v.Get("query"), opName: v.Get("operationName")}
	if s := v.Get("variables"); s != "" {
		q.vars = []byte(s)
	}
	return q
}

func missingQuery() *InputError {
	return inputErr(TypeGraphQLMissingQuery, "Missing GraphQL query", "the request carries no query (persisted queries cannot be costed)")
}

// readGQLObject reads {"query": …, "operationName": …, "variables": …}.
func readGQLObject(c *jsonCursor) (gqlQuery, error) {
	var q gqlQuery
	err := c.object(func(key []byte) error {
		switch string(key) {
		case "query", "operationName":
			if c.peek() == 'n' {
				return c.literal("null")
			}
			if c.peek() != '"' {
				if q.err == nil {
					q.err = inputErr(TypeGraphQLInvalidRequest, "Invalid GraphQL request", "%s must be a string", key)
				}
				return c.skip()
			}
			raw, esc, err := c.str()
			if err != nil {
				return err
			}
			if key[0] == 'q' {
				q.query = jsonString(raw, esc)
			} else {
				q.opName = jsonString(raw, esc)
			}
			return nil
		case "variables":
			span, err := c.span()
			if len(span) > 0 && span[0] == '"' {
				// Some clients send variables as a JSON string.
				sc := c.sub(span)
				raw, esc, err := sc.str()
				if err != nil {
					return err
				}
				span = []byte(jsonString(raw, esc))
			}
			q.vars = span
			return err
		}
		return c.skip()
	})
	if err == nil && q.err == nil && strings.TrimSpace(q.query) == "" {
		q.err = missingQuery()
	}
	return q, err
}

// analyzeOne parses and costs one query.
func (g *GraphQL) analyzeOne(q gqlQuery) (Complexity, error) {
	doc, err := g.parse(q.query)
	if err != nil {
		return Complexity{}, err
	}
	op, err := pickOperation(doc, q.opName)
	if err != nil {
		return Complexity{}, err
	}
	w := newWalker(g, doc, op, q.vars)
	acc, err := w.operation()
	if err != nil {
		return Complexity{}, err
	}
	fields := acc.fields
	if w.factor != 0 {
		fields = ceilCost(acc.scaled)
	}
	fixed := int64(0)
	switch op.Operation {
	case ast.Mutation:
		fixed = satMul(g.Mutation, acc.top)
	case ast.Subscription:
		fixed = satMul(g.Subscription, acc.top)
	}
	c := Complexity{
		Fields:     satAdd(max(fields, 1), fixed),
		Requests:   acc.requests,
		Points:     satAdd(max(satAdd(acc.requests, 50)/100, 1), fixed),
		Nodes:      acc.nodes,
		Depth:      acc.depth,
		Aliases:    w.aliases,
		Directives: w.directives,
		Queries:    1,
	}
	c.Cost = c.Fields
	if g.Model == ModelGitHub {
		c.Cost = c.Points
	}
	if g.MaxCost > 0 && c.Cost > g.MaxCost {
		return Complexity{}, inputErr(TypeGraphQLCostExceeded, "GraphQL query too expensive",
			"the query costs %d, more than the %d allowed per query", c.Cost, g.MaxCost)
	}
	return c, nil
}

// ceilCost rounds a scaled cost up to a whole number, saturating at the
// int64 maximum. A cost within a part in 10^12 of a whole number is that
// number, so that the binary rounding of a factor such as 1.1 never adds a
// point of its own.
func ceilCost(f float64) int64 {
	switch {
	case math.IsNaN(f) || f <= 0:
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	}
	if r := math.Round(f); math.Abs(f-r) <= f*1e-12 {
		return int64(r)
	}
	return int64(math.Ceil(f))
}

// parse parses a query, or reuses the document parsed for the same text.
// Documents are only read after parsing, so one may serve many requests at
// once.
func (g *GraphQL) parse(query string) (*ast.QueryDocument, error) {
	if doc := g.cache.get(query); doc != nil {
		return doc, nil
	}
	maxTokens := orDefault(int64(g.MaxTokens), DefaultGraphQLMaxTokens)
	doc, err := parser.ParseQueryWithTokenLimit(&ast.Source{Name: "query", Input: query}, int(maxTokens))
	if err != nil {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "token limit"):
			return nil, &InputError{Status: http.StatusBadRequest, Type: TypeGraphQLTooManyTokens, Title: "GraphQL query too long",
				Detail: fmt.Sprintf("the query has more than %d tokens", maxTokens), Err: err}
		case strings.Contains(msg, "nesting depth"):
			return nil, &InputError{Status: http.StatusBadRequest, Type: TypeGraphQLTooDeep, Title: "GraphQL query too deep",
				Detail: msg, Err: err}
		}
		return nil, &InputError{Status: http.StatusBadRequest, Type: TypeGraphQLParse, Title: "GraphQL syntax error", Detail: msg, Err: err}
	}
	g.cache.put(query, doc)
	return doc, nil
}

// pickOperation chooses the operation to execute, as a GraphQL server would.
func pickOperation(doc *ast.QueryDocument, name string) (*ast.OperationDefinition, error) {
	if name != "" {
		for _, op := range doc.Operations {
			if op.Name == name {
				return op, nil
			}
		}
		return nil, inputErr(TypeGraphQLUnknownOp, "Unknown GraphQL operation", "the document has no operation named %q", name)
	}
	switch len(doc.Operations) {
	case 0:
		return nil, inputErr(TypeGraphQLNoOperation, "No GraphQL operation", "the document defines no operation")
	case 1:
		return doc.Operations[0], nil
	}
	return nil, inputErr(TypeGraphQLAmbiguousOp, "Ambiguous GraphQL operation", "the document defines %d operations; operationName must choose one", len(doc.Operations))
}
