package cascade

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/engine"
)

// decide runs steps 1-4 of the request path: the trees that apply and
// their key values, the cost, then the engine's decision. A non-zero
// status means the request is refused before any decision (a client
// error), with err saying why.
func (h *Handler) decide(r *http.Request, repl *caddy.Replacer, d *decision) (int, error) {
	h.engine.Begin(&d.Decision)
	if h.readsModel {
		if err := h.readModel(r, repl, d); err != nil {
			var ie *cost.InputError
			errors.As(err, &ie)
			d.Reason, d.inputErr = reasonBadCost, ie
			// Refused as a tree would refuse it: if some tree enforces.
			d.Enforcing = slices.ContainsFunc(h.etrees, func(t *engine.Tree) bool { return h.engine.Mode(t) == engine.Enforce })
			return ie.Status, err
		}
	}
	if h.direct {
		// One tree that always applies, and nothing to decide besides its
		// path: the steps below would add nothing.
		if err := h.add(r, repl, d, 0); err != nil {
			return http.StatusBadRequest, err
		}
		return 0, h.engine.Decide(r.Context(), &d.Decision, engine.Request{Refundable: h.refundable})
	}
	status, err := h.decidePath(r, repl, d)
	if status == 0 && err == nil && d.Request.Tentative && !d.Allowed {
		if h.fallsBack(d) {
			return h.fallBack(r, repl, d)
		}
		d.Strike(r.Context()) // the refusal stands
	}
	return status, err
}

// decidePath decides d, begun, on the general path: the trees that apply,
// the costs, the idempotency key, waiting.
func (h *Handler) decidePath(r *http.Request, repl *caddy.Replacer, d *decision) (int, error) {
	for i, t := range h.trees {
		if t.matchers != nil {
			match, err := t.matchers.AnyMatchWithError(r)
			if err != nil {
				// A matcher that cannot decide must not let the tree's
				// limits go unenforced (Caddy's deprecated AnyMatch would
				// say "no match"): the request is refused, with the
				// matcher's status if it gave one.
				d.Reason, d.Blocked, d.Enforcing, d.Mode = reasonMatcherError, t.Name, true, engine.Enforce
				return errorStatus(err, http.StatusInternalServerError), fmt.Errorf("the matcher of tree %s could not decide on this request: %w", t.Name, err)
			}
			if !match {
				continue
			}
		}
		if err := h.add(r, repl, d, i); err != nil {
			return http.StatusBadRequest, err
		}
	}
	var estimates []int64
	if len(d.Buckets) > 0 {
		var err error
		if estimates, err = h.estimate(r, repl, d); err != nil {
			var ie *cost.InputError
			errors.As(err, &ie)
			d.Reason, d.Buckets, d.inputErr = reasonBadCost, nil, ie
			return ie.Status, err
		}
	}
	req := engine.Request{
		Estimates:  estimates,
		Refundable: h.refundable,       // a charge that may be refunded is not decided on a lease
		Untracked:  h.Forwarded != nil, // a decision endpoint never sees the response
		// A refusal a fallback model may avoid counts towards a penalty
		// box only if it stands (decide strikes it then).
		Tentative: len(h.FallbackModels[d.model]) > 0,
	}
	if h.Idempotency != nil && len(d.Buckets) > 0 {
		key, err := h.Idempotency.key(r)
		if err != nil {
			d.Reason, d.Buckets = reasonBadIdempotencyKey, nil
			return http.StatusBadRequest, err
		}
		req.Idempotency = key
	}
	return 0, h.decideWaiting(r.Context(), d, req)
}

// modelPlaceholder is the model a request's body asks for (OpenAI chat
// completions and responses, Anthropic messages: the body's top-level
// model), "" when it names none or is not such a body.
const modelPlaceholder = "{http.rate_limit.model}"

// readModel reads the model the request's body names, for the trees'
// keys and matchers, within the largest body an llm cost reads
// (h.modelBodyLimit). A body it cannot read has no model (a tier keyed on it applies
// its missing policy), unless a tree's matcher reads the model: then the
// tree would not apply, so such a body is refused instead, a longer one
// with 413, one that is not a JSON object (or names its model in two
// cases) with 400.
func (h *Handler) readModel(r *http.Request, repl *caddy.Replacer, d *decision) error {
	limit := h.modelBodyLimit
	if err := d.peek(r, limit); err != nil {
		return err
	}
	model, err := cost.ModelOf(d.body.bytes)
	if !h.matchesModel && !errors.Is(err, cost.ErrAmbiguousModel) {
		d.model = model
		if d.body.truncated {
			d.model = "" // it may name another model further on
		}
		repl.Set(modelPlaceholder[1:len(modelPlaceholder)-1], d.model)
		return nil
	}
	if d.body.truncated {
		return &cost.InputError{Status: http.StatusRequestEntityTooLarge, Type: cost.TypeBodyTooLarge, Title: "Request body too large",
			Detail: fmt.Sprintf("the model a request asks for is read from a body of at most %d bytes (an llm cost's max_body_bytes)", limit)}
	}
	if err != nil {
		return &cost.InputError{Status: http.StatusBadRequest, Type: cost.TypeMalformedJSON, Title: "Malformed request body",
			Detail: "reading the model the request asks for: " + err.Error(), Err: err}
	}
	d.model = model
	repl.Set(modelPlaceholder[1:len(modelPlaceholder)-1], d.model)
	return nil
}

// add adds the path of tree i, by the request's values of its tiers' keys,
// to d.
func (h *Handler) add(r *http.Request, repl *caddy.Replacer, d *decision, i int) error {
	t := h.trees[i]
	values := d.Values()
	for j := range t.Tiers {
		values = append(values, t.value(r, repl, j))
	}
	if t.PlanKey != "" {
		return h.addEntitled(r, repl, d, i, values)
	}
	return h.engine.Add(&d.Decision, h.etrees[i], values)
}

// value is the request's value of the key of tier j.
func (t *Tree) value(r *http.Request, repl *caddy.Replacer, j int) string {
	if t.header[j] != "" { // the common case, without the replacer's parsing
		return headerValue(r.Header[t.header[j]])
	}
	return resolveKey(repl, t.Tiers[j].Key, t.dynamic[j])
}

// headerValue is what {http.request.header.NAME} resolves to: the values
// joined with commas.
func headerValue(vals []string) string {
	switch len(vals) {
	case 0:
		return ""
	case 1:
		return vals[0]
	}
	return strings.Join(vals, ",")
}

// resolveKey resolves a tier's key template. A key is missing (empty) when
// any placeholder in it resolves to empty: "user-{header}" without the
// header must not become one shared "user-" bucket.
func resolveKey(repl *caddy.Replacer, tmpl string, dynamic bool) string {
	if !dynamic {
		return tmpl
	}
	empty := false
	out, err := repl.ReplaceFunc(tmpl, func(_ string, val any) (any, error) {
		switch v := val.(type) {
		case nil:
			empty = true
		case string:
			empty = empty || v == ""
		case []string: // header values
			empty = empty || len(v) == 0 || v[0] == ""
		}
		return val, nil
	})
	if err != nil || empty {
		return ""
	}
	return out
}

// resolveCost turns a cost template into a non-negative integer.
func resolveCost(repl *caddy.Replacer, tmpl string, def *int64) (int64, error) {
	s := strings.TrimSpace(repl.ReplaceAll(tmpl, ""))
	if s == "" {
		if def != nil {
			return *def, nil
		}
		return 0, fmt.Errorf("resolved to nothing (is the header or placeholder set?)")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a non-negative integer", truncate(s, 32))
	}
	return n, nil
}

// looksLikeHeader tells whether a constant key is probably a header name
// written without its placeholder (tier user X-User).
func looksLikeHeader(key string) bool {
	if len(key) > 2 && strings.EqualFold(key[:2], "x-") {
		return true
	}
	switch strings.ToLower(key) {
	case "authorization", "cookie", "host", "user-agent", "x-forwarded-for":
		return true
	}
	return false
}
