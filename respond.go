package cascade

import (
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/entitle"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/running"
)

// problemUnavailable is the problem type of a refusal when the store
// cannot decide.
const problemUnavailable = "store-unavailable"

// problem writes a problem+json response.
func (h *Handler) problem(w http.ResponseWriter, r *http.Request, status int, kind, title, detail string, d *decision) error {
	return h.writeProblem(w, r, engine.NewProblem(status, kind, title, detail, &d.Decision))
}

// writeProblem writes p in the handler's refusal body format, with the
// request's id.
func (h *Handler) writeProblem(w http.ResponseWriter, r *http.Request, p *engine.Problem) error {
	if id := requestID(r); id != "" {
		// As OpenAI's API names it, and Anthropic's: their SDKs show it.
		w.Header().Set("X-Request-Id", id)
		w.Header().Set("Request-Id", id)
	}
	return p.WriteAs(w, h.RefusalBody)
}

// requestID is Caddy's id of r ({http.request.uuid}, also in its access
// log line): what a refusal and its log line name, so that a client's
// report can be traced. "" outside a Caddy server (which readies the
// context the id is kept in).
func requestID(r *http.Request) string {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if _, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); repl == nil || !ok {
		return ""
	}
	id, _ := repl.GetString("http.request.uuid")
	return id
}

// setPlaceholders publishes the decision as {http.rate_limit.*}. One
// lazy provider, rather than a Set per value, keeps the hot path to one
// allocation: most requests never read these placeholders. Caddy may read
// them after ServeHTTP has returned (access logs) and the decision's
// memory has been reused, so the provider holds a copy of what it shows.
//
// A request may pass several rate_limit handlers (a site-wide one and a
// route's). The replacer asks its providers in the order they were added
// and the first answer wins, so the first handler registers the provider
// and marks the request's variables; a later handler leaves what the
// provider is to show in them instead, and the provider shows that. The
// placeholders are those of the last decision published (a handler with
// placeholders refused publishes none for a request it admits), which is
// the one that refused the request if any did. A handler alone in its
// configuration (the common case) has no other to find or to make way for,
// and skips the variables: their lookup and the mark's write were a tenth
// of its cost under load. (The same handler may run twice in one request when
// the named route it is in is invoked twice: a server with named routes
// marks the variables, as if other handlers shared it.)
//
// The provider is a closure holding its copy of the values and the
// variables: one allocation (a pointer to shared placeholders and a
// method value of it would be two). The rare later handler allocates the
// placeholders it leaves.
func (h *Handler) setPlaceholders(r *http.Request, repl *caddy.Replacer, d *decision) {
	p := placeholders{
		allowed: admitted(d),
		reason:  d.Reason,
		blocked: d.Blocked,
		retry:   d.Retry,
	}
	switch {
	case d.ents.n == 1:
		p.ent = d.ents.shownOne() // no copy: the answer names its source
	case d.ents.n > 1:
		p.ents = d.ents.shown(h.Entitlements)
	}
	if d.Closest >= 0 && d.Closest < len(d.Results) {
		c, res := &d.Buckets[d.Closest], &d.Results[d.Closest]
		p.limit, p.tier = c.Limit, c.Tier
		p.capacity, p.remaining, p.reset = d.Limits[d.Closest].Limit.Capacity(), res.Remaining, res.Reset
		if d.Reason == engine.ReasonLimited || d.Reason == engine.ReasonImpossible || d.Reason == engine.ReasonPenalty {
			p.exceeded = c.Tree
		}
	}
	if h.alone() {
		repl.Map(p.lookup)
		return
	}
	vars, _ := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if later, ok := vars[placeholdersVar].(*placeholders); ok { // marked: not the first handler
		if later == nil {
			later = new(placeholders)
			vars[placeholdersVar] = later
		}
		*later = p
		return
	}
	if vars != nil {
		vars[placeholdersVar] = (*placeholders)(nil) // the mark
	}
	repl.Map(func(key string) (any, bool) {
		if later, _ := vars[placeholdersVar].(*placeholders); later != nil {
			return later.lookup(key)
		}
		return p.lookup(key)
	})
}

// admitted reports whether d admitted its request as asked: what
// {http.rate_limit.allowed} shows (a request passed over a limit in mode
// warn or shadow was not admitted).
func admitted(d *decision) bool {
	return d.Allowed && (d.Reason == engine.ReasonOK || d.Replayed)
}

// alone tells whether this handler is the only rate_limit handler of its
// configuration, which it learns at its first request: by then Caddy has
// provisioned every handler of the configuration. A handler of a server
// with named routes is never alone (see Provision), nor is one never
// provisioned, nor one whose configuration is being unloaded (the other
// handlers may already have left package running).
func (h *Handler) alone() bool {
	if h.config.company == nil {
		return false
	}
	switch h.config.company.Load() {
	case companyNone:
		return true
	case companySome:
		return false
	}
	select {
	case <-h.config.done:
		return false // not remembered: the handlers may be leaving
	default:
	}
	c := int32(companySome)
	if len(running.EnginesOf(h.config.done)) == 1 {
		c = companyNone
	}
	h.config.company.Store(c)
	return c == companyNone
}

// What Handler.company holds: not yet known (0), no other rate_limit
// handler in the configuration, or some.
const (
	companyNone = 1
	companySome = 2
)

// placeholdersVar is the request variable that the first handler marks (a
// nil *placeholders) and a later one sets to the placeholders the first
// handler's provider is to show.
const placeholdersVar = "cascade.rate_limit"

// lookup is the replacer provider of {http.rate_limit.*}.
func (p placeholders) lookup(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, "http.rate_limit.")
	if !ok {
		return nil, false
	}
	if strings.HasPrefix(name, "entitlement.") {
		switch {
		case p.ent != nil:
			return entitlementPlaceholderOf(p.ent, name)
		case p.ents != nil:
			return p.ents.lookup(name)
		}
	}
	switch name {
	case "allowed":
		return p.allowed, true
	case "reason":
		return p.reason, true
	case "blocked_by":
		return p.blocked, true
	case "retry_after":
		return engine.CeilSeconds(p.retry), true
	case "exceeded.name": // mholt/caddy-ratelimit's: the zone (tree) that refused
		if p.exceeded == nil {
			return "", false
		}
		return p.exceeded.Name, p.exceeded.Name != ""
	}
	if p.limit == nil { // no bucket closest to exhaustion
		return nil, false
	}
	switch name {
	case "policy":
		return p.limit.Policy(), true
	case "tier":
		return p.tier.Name, true
	case "limit":
		return p.capacity, true
	case "remaining":
		return p.remaining, true
	case "reset":
		return engine.CeilSeconds(microseconds(p.reset)), true
	}
	return nil, false
}

// placeholders is what {http.rate_limit.*} show of one decision.
type placeholders struct {
	allowed   bool
	reason    string
	blocked   string
	retry     time.Duration
	limit     *hierarchy.Limit // of the bucket closest to exhaustion; nil if none
	tier      *hierarchy.Tier
	capacity  int64 // its effective capacity
	remaining int64
	reset     int64                // µs
	exceeded  *hierarchy.Tree      // the tree that refused the request (limited, impossible or penalty), else nil
	ent       *entitle.Entitlement // the request's entitlement, for a handler with one source ({http.rate_limit.entitlement.*})
	ents      *shownEntitlements   // the request's entitlements, for a handler with several
}

// ownHeaders is a response writer that keeps Cascade's rate-limit headers
// as they were written before the upstream answered: an upstream that
// writes the same names (an LLM API's own x-ratelimit-*) would add its
// values to them, and a client would read "1, 499" where it expects one
// number. Cascade's values win; the upstream's of other names pass.
type ownHeaders struct {
	*caddyhttp.ResponseWriterWrapper
	own     http.Header // Cascade's headers of the names an upstream may write too
	written bool
}

// keepOwnHeaders wraps w so that the rate-limit headers now in its header
// are the ones sent (see ownHeaders).
func keepOwnHeaders(w http.ResponseWriter) http.ResponseWriter {
	own := http.Header{}
	for k, v := range w.Header() {
		if lk := strings.ToLower(k); strings.HasPrefix(lk, "x-ratelimit-") || strings.HasPrefix(lk, "anthropic-ratelimit-") ||
			lk == "ratelimit" || lk == "ratelimit-policy" {
			own[k] = v
		}
	}
	if len(own) == 0 {
		return w
	}
	return &ownHeaders{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, own: own}
}

func (w *ownHeaders) WriteHeader(status int) {
	if status >= 200 || status == http.StatusSwitchingProtocols { // the final header; not a 1xx's
		w.apply()
	}
	w.ResponseWriterWrapper.WriteHeader(status)
}

// apply puts Cascade's values back, once.
func (w *ownHeaders) apply() {
	if w.written {
		return
	}
	w.written = true
	hdr := w.Header()
	for k, v := range w.own {
		hdr[k] = v
	}
}

// Write, ReadFrom and FlushError send the header first, as the writer
// beneath would (with 200) when nothing wrote it: Cascade's values first.
func (w *ownHeaders) Write(b []byte) (int, error) {
	w.apply()
	return w.ResponseWriterWrapper.Write(b)
}

func (w *ownHeaders) ReadFrom(r io.Reader) (int64, error) {
	w.apply()
	return w.ResponseWriterWrapper.ReadFrom(r)
}

func (w *ownHeaders) FlushError() error {
	w.apply()
	return http.NewResponseController(w.ResponseWriterWrapper).Flush()
}
