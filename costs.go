package cascade

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/logsample"
)

// Cost is what a request costs in one dimension: a number, a placeholder,
// or an estimator that reads the request (LLM tokens, GraphQL points, body
// bytes). Set exactly one of Value, LLM, GraphQL and BodySize.
type Cost struct {
	// Dimension counted, e.g. "tokens".
	Dimension string `json:"dimension"`
	// Value is a number or a placeholder template that resolves to one,
	// e.g. "{http.request.header.X-Tokens}". Only for trusted callers: the
	// client chooses its own cost.
	Value string `json:"value,omitempty"`
	// Default is the cost when Value resolves to nothing (the header is
	// absent). Without it such a request is refused with 400.
	Default *int64 `json:"default,omitempty"`
	// LLM estimates tokens from an OpenAI or Anthropic request body:
	// input characters / 4 plus the maximum output tokens.
	LLM *cost.LLM `json:"llm,omitempty"`
	// Pricing, with LLM, makes the dimension money: a request costs its
	// tokens at the price of the model its body names (input estimate ×
	// input price + max output × output price up front; the reported
	// usage × the prices when reconciled), in micro-units. A model with no
	// price is refused (400) unless Pricing has a default.
	Pricing *cost.Pricing `json:"pricing,omitempty"`
	// GraphQL estimates the complexity of a GraphQL query.
	GraphQL *cost.GraphQL `json:"graphql,omitempty"`
	// BodySize charges the request body's size in bytes.
	BodySize bool `json:"body_size,omitempty"`
	// Reconcile corrects the charge once the upstream has answered, from
	// the usage it reports: every bucket of this dimension on the request's
	// path is adjusted by actual − estimate (a refund, or a debt that later
	// requests pay).
	Reconcile *Reconcile `json:"reconcile,omitempty"`
	// ChargedHeader says what an admitted request was charged in this
	// dimension, when its path counts it, in the response header
	// Cascade-Cost: points=12 (with other dimensions' items, comma
	// separated): the estimate charged before the upstream answered.
	ChargedHeader bool `json:"charged_header,omitempty"`

	estimator cost.Estimator   // nil for Value
	at        position         // the Caddyfile line that wrote it, when one did
	shows     bool             // ChargedHeader, or a GraphQL cost's ExtensionsCost
	skipLog   *logsample.Every // responses left without extensions.cost: one logged a minute
	gzip      *cost.GzipPool   // the gzip coders of the responses extensions_cost rewrites
}

// Reconcile says where the upstream reports its usage and how to count it.
type Reconcile struct {
	cost.TapConfig
	// Actual turns the reported usage into a cost: "total" (default),
	// "input", "output" or "weighted" input and output.
	Actual cost.Actual `json:"actual,omitzero"`
}

// provision checks a cost and prepares its estimator.
func (c *Cost) provision() error {
	if c.Dimension == "" || c.Dimension == hierarchy.Requests {
		return fmt.Errorf("cost needs a dimension other than %q", hierarchy.Requests)
	}
	if hierarchy.Reserved(c.Dimension) {
		return fmt.Errorf("cost %s: the dimension %q is the penalty box's: name yours otherwise", c.Dimension, c.Dimension)
	}
	set := 0
	for _, b := range []bool{c.Value != "", c.LLM != nil, c.GraphQL != nil, c.BodySize} {
		if b {
			set++
		}
	}
	if set != 1 {
		return fmt.Errorf("cost %s: give exactly one of a number or placeholder, llm, graphql or body_size", c.Dimension)
	}
	if c.Pricing != nil && c.LLM == nil {
		return fmt.Errorf("cost %s: prices are for llm costs: cost %s llm { price … }", c.Dimension, c.Dimension)
	}
	if c.Default != nil && *c.Default < 0 {
		return fmt.Errorf("cost %s: default %d must not be negative", c.Dimension, *c.Default)
	}
	switch {
	case c.Value != "":
		if !strings.ContainsRune(c.Value, '{') {
			if n, err := strconv.ParseInt(c.Value, 10, 64); err != nil || n < 0 {
				return fmt.Errorf("cost %s: %q is neither a placeholder nor a non-negative integer", c.Dimension, c.Value)
			}
		}
	case c.LLM != nil:
		if err := c.LLM.Provision(); err != nil {
			return fmt.Errorf("cost %s: llm: %w", c.Dimension, err)
		}
		c.estimator = c.LLM
		if c.Pricing != nil {
			if err := c.Pricing.Provision(); err != nil {
				return fmt.Errorf("cost %s: %w", c.Dimension, err)
			}
			if len(c.Pricing.Prices) == 0 && c.Pricing.Default == nil {
				return fmt.Errorf("cost %s: pricing has no price: add price <model> input <per 1M tokens> output <per 1M tokens>", c.Dimension)
			}
		}
	case c.GraphQL != nil:
		if strings.HasPrefix(c.GraphQL.Schema, "@") { // schema from a file: "@schema.graphql"
			sdl, err := os.ReadFile(strings.TrimPrefix(c.GraphQL.Schema, "@"))
			if err != nil {
				return fmt.Errorf("cost %s: graphql schema: %w", c.Dimension, err)
			}
			c.GraphQL.Schema = string(sdl)
		}
		if err := c.GraphQL.Provision(); err != nil {
			return fmt.Errorf("cost %s: %w", c.Dimension, err)
		}
		c.estimator = c.GraphQL
	case c.BodySize:
		c.estimator = cost.BodySize{}
	}
	c.shows = c.ChargedHeader || c.GraphQL != nil && c.GraphQL.ExtensionsCost
	if c.GraphQL != nil && c.GraphQL.ExtensionsCost {
		c.skipLog, c.gzip = &logsample.Every{Interval: time.Minute}, new(cost.GzipPool)
	}
	if c.Reconcile != nil {
		if err := c.Reconcile.TapConfig.Provision(); err != nil {
			return fmt.Errorf("cost %s: reconcile: %w", c.Dimension, err)
		}
		if err := c.Reconcile.Actual.Provision(); err != nil {
			return fmt.Errorf("cost %s: reconcile: %w", c.Dimension, err)
		}
	}
	return nil
}

// estimate returns each cost of the request, in h.Costs order. A client
// error (malformed body, missing header…) comes back as *cost.InputError.
// Only the costs of dimensions that some bucket of the path counts are
// estimated (the others are 0): a route whose limits count no tokens never
// has its body read as a chat request, nor refused for not being one.
func (h *Handler) estimate(r *http.Request, repl *caddy.Replacer, d *decision) ([]int64, error) {
	buckets := d.Buckets
	out := make([]int64, len(h.Costs))
	if len(h.Costs) == 0 {
		return out, nil
	}
	var needed [8]bool
	need := needed[:0]
	if len(h.Costs) > len(needed) {
		need = make([]bool, 0, len(h.Costs))
	}
	var peek int64
	for _, c := range h.Costs {
		counted := false
		for _, b := range buckets {
			if b.Limit.Dimension == c.Dimension {
				counted = true
				break
			}
		}
		need = append(need, counted)
		if counted {
			peek = max(peek, cost.BodyLimit(c.estimator, 1<<20))
		}
	}
	req := &cost.Request{HTTP: r}
	if peek > 0 {
		if err := d.peek(r, peek); err != nil {
			return nil, err
		}
		req.Body, req.Truncated = d.body.bytes, d.body.truncated
	}
	for i, c := range h.Costs {
		var n int64
		var err error
		switch {
		case !need[i]:
			continue
		case c.estimator == nil:
			n, err = resolveCost(repl, c.Value, c.Default)
			if err != nil {
				err = &cost.InputError{Status: http.StatusBadRequest, Type: "bad-cost", Title: "Bad Request",
					Detail: fmt.Sprintf("cost %s: %v", c.Dimension, err)}
			}
		case c.Pricing != nil:
			var u cost.Usage
			if u, err = c.LLM.EstimateUsage(req); err == nil {
				if !h.readsModel { // else read already, or set by a fallback
					if d.model, err = cost.ModelOf(req.Body); err != nil {
						return nil, &cost.InputError{Status: http.StatusBadRequest, Type: cost.TypeMalformedJSON, Title: "Malformed request body",
							Detail: fmt.Sprintf("cost %s: reading the model the request asks for: %v", c.Dimension, err), Err: err}
					}
				}
				n, err = c.priced(u, d.model)
			}
		case c.LLM != nil && c.Reconcile != nil:
			// Count the estimate as the usage will be counted (input only,
			// output only, weighted…), so that actual − estimate is fair.
			var u cost.Usage
			if u, err = c.LLM.EstimateUsage(req); err == nil {
				n = c.Reconcile.Actual.Cost(u)
			}
		default:
			n, err = c.estimator.Estimate(req)
		}
		if err != nil {
			var ie *cost.InputError
			if !errors.As(err, &ie) {
				ie = &cost.InputError{Status: http.StatusBadRequest, Type: "bad-cost", Title: "Bad Request", Detail: err.Error(), Err: err}
			}
			return nil, ie
		}
		out[i] = n
	}
	return out, nil
}

// peeked is the start of a request's body, read once for whatever needs it
// (the costs, the model a key names).
type peeked struct {
	bytes     []byte
	truncated bool  // the body is longer than bytes
	max       int64 // the most that was asked for: 0 when nothing was peeked
}

// peek reads the first max bytes of r's body into d.body, unless as many
// were read already; the upstream still gets every byte (cost.PeekBody). A
// failure to read is a client error.
func (d *decision) peek(r *http.Request, max int64) error {
	if d.body.max >= max || d.body.max > 0 && !d.body.truncated {
		return nil
	}
	body, truncated, err := cost.PeekBody(r, max)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &cost.InputError{Status: http.StatusRequestEntityTooLarge, Type: cost.TypeBodyTooLarge,
				Title: "Request body too large", Detail: err.Error(), Err: err}
		}
		return &cost.InputError{Status: http.StatusBadRequest, Type: cost.TypeBodyRead,
			Title: "Could not read the request body", Detail: err.Error(), Err: err}
	}
	d.body = peeked{bytes: body, truncated: truncated, max: max}
	return nil
}

// tapped is a response writer that reads usage reports on the way through,
// one tap per reconciling cost.
type tapped struct {
	w    http.ResponseWriter
	taps []*cost.Tap
	idx  []int // the cost each tap reconciles
}

// tap wraps w for every cost that reconciles a dimension counted on the
// request's path.
func (h *Handler) tap(w http.ResponseWriter, buckets []hierarchy.Bucket) tapped {
	t := tapped{w: w}
	for i, c := range h.Costs {
		if c.Reconcile != nil && slices.ContainsFunc(buckets, func(b hierarchy.Bucket) bool { return b.Limit.Dimension == c.Dimension }) {
			tp := cost.NewTap(t.w, c.Reconcile.TapConfig)
			t.w, t.taps, t.idx = tp, append(t.taps, tp), append(t.idx, i)
		}
	}
	return t
}

// readableEncoding narrows a request's Accept-Encoding, which the proxy
// forwards upstream, to what the usage tap can read: gzip when the client
// accepts it, else identity. Otherwise a client could ask for br or zstd,
// which the tap does not decode, and never pay for what it used beyond its
// estimate. The client still gets an encoding it accepts.
func readableEncoding(h http.Header) {
	ae := h.Values("Accept-Encoding")
	if len(ae) == 0 {
		return // identity
	}
	gzip := false
	for _, v := range ae {
		for _, item := range strings.Split(v, ",") {
			name, params, _ := strings.Cut(item, ";")
			name = strings.ToLower(strings.TrimSpace(name))
			if name != "gzip" && name != "x-gzip" {
				continue
			}
			gzip = true
			for _, param := range strings.Split(params, ";") {
				k, v, _ := strings.Cut(param, "=")
				if strings.EqualFold(strings.TrimSpace(k), "q") {
					if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f == 0 {
						gzip = false // explicitly refused
					}
				}
			}
		}
	}
	if gzip {
		h.Set("Accept-Encoding", "gzip")
	} else {
		h.Set("Accept-Encoding", "identity")
	}
}

// priced is what usage u of model costs, in micro-units; a model with no
// price is a client error that names it.
func (c *Cost) priced(u cost.Usage, model string) (int64, error) {
	rate, ok := c.Pricing.Lookup(model)
	if !ok {
		what := fmt.Sprintf("the model %q", truncate(model, 64))
		if model == "" {
			what = "a request that names no model"
		}
		return 0, &cost.InputError{Status: http.StatusBadRequest, Type: "unpriced-model", Title: "No price for this model",
			Detail: fmt.Sprintf("cost %s: %s has no price here: use a priced model, or ask the operator to add 'price %s input <per 1M tokens> output <per 1M tokens>' (or a default price)", c.Dimension, what, truncate(model, 64))}
	}
	return rate.Cost(u), nil
}

// actual is what reported usage u counts in c's dimension, for a request
// that asked for model.
func (c *Cost) actual(u cost.Usage, model string) int64 {
	if c.Pricing != nil {
		if rate, ok := c.Pricing.Lookup(model); ok {
			return rate.Cost(u)
		}
	}
	return c.Reconcile.Actual.Cost(u)
}

// reconcile reconciles d's estimates with the usage the upstream reported
// through the taps (engine.Decision.Reconcile). No report (a stream cut short)
// leaves the estimate standing.
func (h *Handler) reconcile(t tapped, d *decision) {
	var usage []engine.Usage
	for k, tp := range t.taps {
		c := h.Costs[t.idx[k]]
		if u := tp.Usage(); u.Found {
			usage = append(usage, engine.Usage{Dimension: c.Dimension, Actual: c.actual(u, d.model)})
		}
	}
	d.Reconcile(usage...)
}
