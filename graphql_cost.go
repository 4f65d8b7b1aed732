package cascade

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/rate"
)

// The cost shown to the client: Cascade-Cost (a cost's charged_header)
// and, for a GraphQL cost with extensions_cost, Shopify's
// extensions.cost in the response body and in a refusal's.

// chargedHeader is the response header a cost's ChargedHeader writes.
const chargedHeader = "Cascade-Cost"

// counts tells whether a bucket of d's path counts dimension dim.
func counts(d *decision, dim string) bool {
	for _, b := range d.Buckets {
		if b.Limit.Dimension == dim {
			return true
		}
	}
	return false
}

// passShowingCost passes an admitted request whose response shows its
// cost: Cascade-Cost in its header, extensions.cost in its body (the
// writer that inserts it sits outside the usage taps, which read the
// upstream's own bytes).
//
//go:noinline
func (h *Handler) passShowingCost(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision, mode string) error {
	var items []string
	var ew *cost.ExtensionsWriter
	for i, c := range h.Costs {
		if !c.shows || i >= len(d.Request.Estimates) || !counts(d, c.Dimension) {
			continue
		}
		charged := d.Request.Estimates[i]
		if d.Replayed {
			charged = 0 // a retry admitted without a charge
		}
		if c.ChargedHeader {
			items = append(items, c.Dimension+"="+strconv.FormatInt(charged, 10))
		}
		if c.GraphQL != nil && c.GraphQL.ExtensionsCost && ew == nil {
			s := shownCostOf(d, c, i, false)
			s.hdr = w.Header()
			ew = cost.NewExtensionsWriter(w, cost.ExtensionsOptions{Build: s.object, NoBody: r.Method == http.MethodHead,
				Skipped: h.skippedExtensions(c), Gzip: c.gzip})
		}
	}
	if len(items) > 0 {
		w.Header().Set(chargedHeader, strings.Join(items, ", "))
	}
	if ew == nil {
		return h.passOn(w, r, next, d, mode)
	}
	readableEncoding(r.Header) // gzip or identity: what the writer decodes
	// Closed even if a handler panics: its gzip goroutine ends. (A body cut
	// short is never made to look whole: see ExtensionsWriter.)
	defer ew.Close()
	return h.passOn(ew, r, next, d, mode)
}

// refusalShowingCost is w for a refusal's problem body: with the cost
// object in its extensions when a GraphQL cost of the path shows it,
// else w itself (and nil).
func (h *Handler) refusalShowingCost(w http.ResponseWriter, d *decision) (http.ResponseWriter, *cost.ExtensionsWriter) {
	for i, c := range h.Costs {
		if c.GraphQL == nil || !c.GraphQL.ExtensionsCost || i >= len(d.Request.Estimates) || !counts(d, c.Dimension) {
			continue
		}
		s := shownCostOf(d, c, i, true)
		ew := cost.NewExtensionsWriter(w, cost.ExtensionsOptions{Build: s.object, AnyStatus: true, Skipped: h.skippedExtensions(c), Gzip: c.gzip})
		return ew, ew
	}
	return w, nil
}

// skippedExtensions logs, once a minute at most, a response left without
// its extensions.cost.
func (h *Handler) skippedExtensions(c *Cost) func(string) {
	return func(reason string) {
		if ok, held := c.skipLog.Allow(time.Now()); ok {
			h.logger.Info("rate limit: a GraphQL response was left without extensions.cost", zap.String("cost", c.Dimension),
				zap.String("why", reason), zap.Int64("others_since", held))
		}
	}
}

// shownCost is what a response shows of its GraphQL cost: everything but
// the actual cost is known when the request is decided, and taken from
// the decision then (its memory is not the writer's to read later).
type shownCost struct {
	requested  int64
	charged    int64 // requested, or 0 for a retry replayed without a charge
	refused    bool
	status     bool // a bucket of the dimension was found
	maximum    int64
	available  int64
	restore    float64
	c          *Cost
	model      string
	hdr        http.Header // the response's, for a reconcile header
	reconciles bool        // the response's usage corrects the charge
}

// shownCostOf readies the object of c, the i-th cost of the handler, for
// d: admitted, or refused.
func shownCostOf(d *decision, c *Cost, i int, refused bool) *shownCost {
	s := &shownCost{requested: d.Request.Estimates[i], refused: refused, c: c, model: d.model}
	s.charged = s.requested
	if d.Replayed {
		s.charged = 0 // its actual cost is all debt (engine.Decision.Charge)
	}
	s.reconciles = c.Reconcile != nil && !refused
	best := -1
	for j, b := range d.Buckets {
		if b.Limit.Dimension != c.Dimension || j >= len(d.Results) || j >= len(d.Limits) {
			continue
		}
		if best < 0 || d.Results[j].Remaining < d.Results[best].Remaining {
			best = j
		}
	}
	if best >= 0 {
		l := d.Limits[best].Limit
		s.status, s.maximum, s.available, s.restore = true, l.Capacity(), d.Results[best].Remaining, restoreRate(l)
	}
	return s
}

// restoreRate is how many units a limit gives back a second, as Shopify's
// throttleStatus.restoreRate says: a GCRA bucket's refill, a sliding
// window's average; 0 for a calendar quota (it resets, it does not
// refill) and a concurrency limit.
func restoreRate(l rate.Limit) float64 {
	switch l.Algorithm {
	case rate.GCRA, "", rate.Sliding, rate.SlidingApprox:
		if l.Period > 0 {
			return float64(l.Count) / l.Period.Seconds()
		}
	}
	return 0
}

// object is the value of extensions.cost, given the upstream's own value
// there (nil when none): Shopify's shape, its actualQueryCost the
// upstream's usage when the cost reconciles with it (from that value, or
// the reconcile header), else the charge; null on a refusal (nothing ran).
// currentlyAvailable is what the decision left, corrected by the charge
// minus the actual cost when the upstream reported one (which
// reconciliation gives back or charges once the response has ended),
// within [0, maximumAvailable].
func (s *shownCost) object(upstream []byte) []byte {
	actual, correction := s.requested, int64(0)
	if s.reconciles {
		var u cost.Usage
		rc := s.c.Reconcile
		switch {
		case rc.Header != "":
			u = cost.HeaderCost(s.hdr.Get(rc.Header))
		case rc.Provider == cost.ProviderGraphQL || rc.Provider == cost.ProviderAuto || rc.Provider == "":
			u = cost.UpstreamCost(upstream)
		}
		if u.Found {
			actual = s.c.actual(u, s.model)
			correction = satAdd(s.charged, -actual)
		}
	}
	b := make([]byte, 0, 192)
	b = append(b, `{"requestedQueryCost":`...)
	b = strconv.AppendInt(b, s.requested, 10)
	b = append(b, `,"actualQueryCost":`...)
	if s.refused {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, actual, 10)
	}
	if s.status {
		available := s.available
		if !s.refused {
			available = min(max(satAdd(available, correction), 0), s.maximum)
		}
		b = append(b, `,"throttleStatus":{"maximumAvailable":`...)
		b = strconv.AppendInt(b, s.maximum, 10)
		b = append(b, `,"currentlyAvailable":`...)
		b = strconv.AppendInt(b, available, 10)
		b = append(b, `,"restoreRate":`...)
		b = strconv.AppendFloat(b, s.restore, 'f', -1, 64)
		b = append(b, '}')
	}
	return append(b, '}')
}

// satAdd is a + b, saturating (costs are never negative, a difference of
// two may be).
func satAdd(a, b int64) int64 {
	c := a + b
	if (c > a) != (b > 0) {
		if b > 0 {
			return 1<<63 - 1
		}
		return -1 << 63
	}
	return c
}
