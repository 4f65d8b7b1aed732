package cascade

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/engine"
)

// fallbackHeader tells the client which model served its request instead
// of the one it asked for.
const fallbackHeader = "Cascade-Fallback-Model"

// fallsBack reports whether d, decided, is a refusal that a fallback model
// may avoid: enforced, by a limit of the model (a tier keyed on
// {http.rate_limit.model}) or of money, for a model with fallbacks.
func (h *Handler) fallsBack(d *decision) bool {
	return h.FallbackModels != nil && len(h.FallbackModels[d.model]) > 0 && h.refusedByModel(d)
}

// refusedByModel reports whether d is an enforced refusal by a limit of
// its model (a tier keyed on {http.rate_limit.model}) or of money: one that
// another model may not meet.
func (h *Handler) refusedByModel(d *decision) bool {
	if d.Allowed || d.Mode != engine.Enforce || d.Reason != engine.ReasonLimited && d.Reason != engine.ReasonImpossible ||
		d.Closest < 0 || d.Closest >= len(d.Buckets) {
		return false
	}
	b := d.Buckets[d.Closest]
	return strings.Contains(b.Tier.Key, modelPlaceholder) || h.money[b.Limit.Dimension]
}

// fallBack decides d again as each fallback of its model in turn, and
// serves the first one its limits admit: the body's model rewritten (every
// other byte as it was), charged at that model's limits and price. The
// refused decisions charged nothing. When none is admitted, the last
// refusal stands. A body longer than was read cannot be rewritten: its
// refusal stands.
func (h *Handler) fallBack(r *http.Request, repl *caddy.Replacer, d *decision) (int, error) {
	original := d.body.bytes
	for _, fb := range h.FallbackModels[d.model] {
		body, ok := cost.ReplaceModel(original, fb)
		if d.body.truncated || !ok {
			if d.Request.Tentative {
				d.Strike(r.Context()) // the refusal stands
			}
			return 0, nil
		}
		if d.entry != nil {
			d.entry.Leave()
		}
		d.Release()
		*d = decision{model: fb, body: peeked{bytes: body, max: d.body.max}}
		h.engine.Begin(&d.Decision)
		repl.Set(modelPlaceholder[1:len(modelPlaceholder)-1], fb)
		status, err := h.decidePath(r, repl, d)
		if status != 0 || err != nil {
			return status, err
		}
		if d.Allowed {
			d.fallback = fb
			r.Body = struct {
				io.Reader
				io.Closer
			}{bytes.NewReader(body), r.Body}
			r.ContentLength = int64(len(body))
			if r.Header.Get("Content-Length") != "" {
				r.Header.Set("Content-Length", strconv.Itoa(len(body)))
			}
			return 0, nil
		}
		if !h.refusedByModel(d) {
			// Refused by a limit no model avoids (the organisation's
			// requests): another fallback would be refused too.
			break
		}
	}
	if d.Request.Tentative && !d.Allowed {
		d.Strike(r.Context()) // the last refusal stands
	}
	return 0, nil
}

// checkFallbacks refuses an empty model or chain, a chain that names a
// model twice, and a cycle: a model that falls back, through the chains,
// to itself.
func checkFallbacks(chains map[string][]string) error {
	models := slices.Sorted(maps.Keys(chains))
	for _, m := range models {
		chain := chains[m]
		if m == "" || len(chain) == 0 || slices.Contains(chain, "") {
			return fmt.Errorf("fallback_model %q %v: give a model and the models to serve instead, e.g. fallback_model gpt-4o gpt-4o-mini", m, chain)
		}
		for i, fb := range chain {
			if slices.Contains(chain[:i], fb) {
				return fmt.Errorf("fallback_model %s: %s is named twice", m, fb)
			}
		}
	}
	// Depth-first, from each model: a model met again on the current way
	// down is a cycle.
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var visit func(m string, path []string) error
	visit = func(m string, path []string) error {
		switch state[m] {
		case onPath:
			return fmt.Errorf("fallback_model: a cycle: %s → %s: a model must not fall back to itself", strings.Join(path, " → "), m)
		case done:
			return nil
		}
		state[m] = onPath
		for _, fb := range chains[m] {
			if err := visit(fb, append(path, m)); err != nil {
				return err
			}
		}
		state[m] = done
		return nil
	}
	for _, m := range models {
		if err := visit(m, nil); err != nil {
			return err
		}
	}
	return nil
}
