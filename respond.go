package cascade

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rate"
)

// Problem types of the problem+json bodies (RFC 9457), documented in the README.
const (
	problemBase        = "https://github.com/caddy-cascade/cascade#"
	problemUnavailable = "store-unavailable"
)

// writeHeaders writes the rate-limit header families of a decision.
//
//	RateLimit-Policy: "org";q=10000;w=3600, "org.tokens";q=1000000;w=3600;qu="tokens"
//	RateLimit: "user";r=12;t=36
//	X-RateLimit-Limit: 1000, X-RateLimit-Remaining: 12, X-RateLimit-Reset: 36
//	Retry-After: 36 (denials only)
//
// RateLimit, and the X-RateLimit headers, describe the policy closest to
// exhaustion, or on a denial the policy that denied. t is the wait (in
// whole seconds, rounded up) until that policy's bucket is full again, or
// on a denial until this request could be admitted.
func (h *Handler) writeHeaders(hdr http.Header, d *decision) {
	if d.buckets == nil || d.closest < 0 {
		return
	}
	cfg := h.Headers
	if cfg == nil {
		cfg = &HeadersConfig{}
	}
	ietf, xrl := on(cfg.IETF), on(cfg.XRateLimit)
	retry := !d.Allowed && !d.Impossible && on(cfg.RetryAfter)
	if !ietf && !xrl && !retry && !cfg.OpenAI { // headers none
		return
	}
	c := d.buckets[d.closest]
	cr := d.Results[d.closest]
	t := ceilSeconds(microseconds(cr.Reset))
	if !d.Allowed {
		t = ceilSeconds(d.retry)
	}
	// What does not change from one request to the next on this path
	// (RateLimit-Policy, each limit's name and capacity) is formatted once
	// per path, unless the adaptive factor scaled a limit.
	var ph *pathHeaders
	if !d.scaled && (ietf || xrl) {
		ph = h.headerCache.get(d.buckets)
	}
	// The other values are written into one buffer and cut from one
	// string, and the header slices share one array.
	var buf [160]byte
	b := buf[:0]
	var cuts [7]int
	var names [6]string
	var fixed [6]string // a value formatted beforehand, instead of a cut
	n := 0
	cut := func(name string) {
		names[n] = name
		n++
		cuts[n] = len(b)
	}
	use := func(name, value string) {
		fixed[n] = value
		cut(name)
	}
	if ietf {
		if ph != nil {
			use("Ratelimit-Policy", ph.policy) // canonical keys, set directly
			b = append(b, ph.items[d.closest]...)
		} else {
			use("Ratelimit-Policy", h.policyOf(d))
			b = append(b, '"')
			b = append(b, c.Limit.Policy()...)
			b = append(b, `";r=`...)
		}
		b = strconv.AppendInt(b, cr.Remaining, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, t, 10)
		cut("Ratelimit")
	}
	if xrl {
		if ph != nil {
			use("X-Ratelimit-Limit", ph.capacity[d.closest])
		} else {
			b = strconv.AppendInt(b, d.limits[d.closest].Limit.Capacity(), 10)
			cut("X-Ratelimit-Limit")
		}
		b = strconv.AppendInt(b, cr.Remaining, 10)
		cut("X-Ratelimit-Remaining")
		b = strconv.AppendInt(b, t, 10)
		cut("X-Ratelimit-Reset")
	}
	if retry {
		b = strconv.AppendInt(b, ceilSeconds(d.retry), 10)
		cut("Retry-After")
	}
	if n > 0 {
		all := string(b)
		vals := make([]string, n)
		for i := 0; i < n; i++ {
			if fixed[i] != "" {
				vals[i] = fixed[i]
			} else {
				vals[i] = all[cuts[i]:cuts[i+1]]
			}
			hdr[names[i]] = vals[i : i+1 : i+1]
		}
	}
	if cfg.OpenAI {
		h.writeOpenAIHeaders(hdr, d)
	}
}

// policyOf formats the RateLimit-Policy of a path whose limits may be
// scaled.
func (h *Handler) policyOf(d *decision) string {
	var b strings.Builder
	b.Grow(64 * len(d.buckets))
	for i, bk := range d.buckets {
		if i > 0 {
			b.WriteString(", ")
		}
		if item, ok := h.policies[bk.Limit]; ok && d.limits[i].Limit == bk.Limit.Rate() {
			b.WriteString(item) // unscaled: formatted once, at provision
		} else {
			writePolicy(&b, bk.Limit, d.limits[i].Limit)
		}
	}
	return b.String()
}

// pathHeaders are the header values of one path (one sequence of limits)
// that do not change from request to request while no limit is scaled.
type pathHeaders struct {
	limits   []*hierarchy.Limit
	policy   string   // RateLimit-Policy
	items    []string // per bucket: the start of its RateLimit item, `"name";r=`
	capacity []string // per bucket: X-RateLimit-Limit
}

// headerCache holds the pathHeaders of recently seen paths, direct-mapped
// by a hash of their limits' addresses: a config has few distinct paths
// (one per combination of tiers skipped and values overridden), and a
// collision only costs formatting the values again.
type headerCache struct {
	policies map[*hierarchy.Limit]string // each limit's RateLimit-Policy item, unscaled
	slots    [64]atomic.Pointer[pathHeaders]
}

// get returns the pathHeaders of the unscaled limits of buckets.
func (c *headerCache) get(buckets []hierarchy.Bucket) *pathHeaders {
	var x uintptr
	for _, b := range buckets {
		x = (x ^ uintptr(unsafe.Pointer(b.Limit))) * 0x9E3779B97F4A7C15
	}
	slot := &c.slots[x>>(unsafe.Sizeof(x)*8-6)]
	if ph := slot.Load(); ph != nil && len(ph.limits) == len(buckets) {
		same := true
		for i, l := range ph.limits {
			same = same && l == buckets[i].Limit
		}
		if same {
			return ph
		}
	}
	ph := c.format(buckets)
	slot.Store(ph)
	return ph
}

func (c *headerCache) format(buckets []hierarchy.Bucket) *pathHeaders {
	ph := &pathHeaders{
		limits:   make([]*hierarchy.Limit, len(buckets)),
		items:    make([]string, len(buckets)),
		capacity: make([]string, len(buckets)),
	}
	var b strings.Builder
	for i, bk := range buckets {
		ph.limits[i] = bk.Limit
		if i > 0 {
			b.WriteString(", ")
		}
		if item, ok := c.policies[bk.Limit]; ok {
			b.WriteString(item)
		} else {
			writePolicy(&b, bk.Limit, bk.Limit.Rate())
		}
		ph.items[i] = `"` + bk.Limit.Policy() + `";r=`
		ph.capacity[i] = strconv.FormatInt(bk.Limit.Rate().Capacity(), 10)
	}
	ph.policy = b.String()
	return ph
}

// writePolicy writes one RateLimit-Policy item: the policy's name, its
// effective quota q (scaled when adaptive), its window w in seconds and, for
// dimensions other than requests, its quota unit qu.
func writePolicy(b *strings.Builder, hl *hierarchy.Limit, l rate.Limit) {
	b.WriteString(`"`)
	b.WriteString(hl.Policy())
	b.WriteString(`";q=`)
	b.WriteString(strconv.FormatInt(l.Capacity(), 10))
	b.WriteString(";w=")
	b.WriteString(strconv.FormatInt(l.WindowSeconds(), 10))
	if hl.Dimension != hierarchy.Requests {
		b.WriteString(`;qu="`)
		b.WriteString(hl.Dimension)
		b.WriteString(`"`)
	}
}

// policyItems formats every limit's RateLimit-Policy item once.
func policyItems(trees []*Tree) map[*hierarchy.Limit]string {
	items := map[*hierarchy.Limit]string{}
	for _, t := range trees {
		for _, l := range t.Limits() {
			var b strings.Builder
			writePolicy(&b, l, l.Rate())
			items[l] = b.String()
		}
	}
	return items
}

// writeOpenAIHeaders writes x-ratelimit-{limit,remaining,reset}-{requests,tokens}
// from the tightest bucket of each of those two dimensions.
func (h *Handler) writeOpenAIHeaders(hdr http.Header, d *decision) {
	for _, dim := range []string{"requests", "tokens"} {
		best := -1
		for i, bk := range d.buckets {
			if bk.Limit.Dimension != dim {
				continue
			}
			if best < 0 || d.Results[i].Remaining < d.Results[best].Remaining {
				best = i
			}
		}
		if best < 0 {
			continue
		}
		r := d.Results[best]
		hdr.Set("x-ratelimit-limit-"+dim, strconv.FormatInt(d.limits[best].Limit.Capacity(), 10))
		hdr.Set("x-ratelimit-remaining-"+dim, strconv.FormatInt(r.Remaining, 10))
		hdr.Set("x-ratelimit-reset-"+dim, strconv.FormatInt(ceilSeconds(microseconds(r.Reset)), 10)+"s")
	}
}

// problemBody is an RFC 9457 problem detail, extended with the blocking tier.
type problemBody struct {
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	Status     int      `json:"status"`
	Detail     string   `json:"detail,omitempty"`
	BlockedBy  string   `json:"blocked_by,omitempty"`
	Policies   []string `json:"violated_policies,omitempty"`
	RetryAfter int64    `json:"retry_after,omitempty"`
}

// problem writes a problem+json response.
func (h *Handler) problem(w http.ResponseWriter, status int, kind, title, detail string, d *decision) error {
	p := problemBody{
		Type:      problemBase + strings.ReplaceAll(kind, "_", "-"),
		Title:     title,
		Status:    status,
		Detail:    detail,
		BlockedBy: d.blocked,
	}
	for i, r := range d.Results {
		if !r.Allowed {
			p.Policies = append(p.Policies, d.buckets[i].Tree.Name+"/"+d.buckets[i].Limit.Name())
		}
	}
	if d.retry > 0 {
		p.RetryAfter = ceilSeconds(d.retry)
	}
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err = w.Write(body)
	return err
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
// and leaves it in the request's variables; a later handler overwrites
// what it shows. The placeholders are those of the last decision, which
// is the one that refused the request if any did.
func (h *Handler) setPlaceholders(r *http.Request, repl *caddy.Replacer, d *decision) {
	p := placeholders{
		allowed: d.Allowed && d.reason == "ok",
		reason:  d.reason,
		blocked: d.blocked,
		retry:   d.retry,
	}
	if d.closest >= 0 && d.closest < len(d.Results) {
		c, res := &d.buckets[d.closest], &d.Results[d.closest]
		p.limit, p.tier = c.Limit, c.Tier
		p.capacity, p.remaining, p.reset = d.limits[d.closest].Limit.Capacity(), res.Remaining, res.Reset
		if d.reason == "limited" || d.reason == "impossible" {
			p.exceeded = c.Tree.Name
		}
	}
	if shown, ok := caddyhttp.GetVar(r.Context(), placeholdersVar).(*placeholders); ok {
		*shown = p
		return
	}
	shown := &p
	caddyhttp.SetVar(r.Context(), placeholdersVar, shown)
	repl.Map(shown.lookup)
}

// placeholdersVar is the request variable under which the first handler
// leaves the placeholders its provider shows.
const placeholdersVar = "cascade.rate_limit"

// lookup is the replacer provider of {http.rate_limit.*}.
func (p *placeholders) lookup(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, "http.rate_limit.")
	if !ok {
		return nil, false
	}
	switch name {
	case "allowed":
		return p.allowed, true
	case "reason":
		return p.reason, true
	case "blocked_by":
		return p.blocked, true
	case "retry_after":
		return ceilSeconds(p.retry), true
	case "exceeded.name": // mholt/caddy-ratelimit's: the zone (tree) that refused
		return p.exceeded, p.exceeded != ""
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
		return ceilSeconds(microseconds(p.reset)), true
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
	reset     int64  // µs
	exceeded  string // the tree that refused the request (limited or impossible), else ""
}
