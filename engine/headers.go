package engine

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rate"
)

// ProblemBase is the prefix of the problem types of refusals' bodies
// (RFC 9457), documented in docs/responses.md.
const ProblemBase = "https://github.com/caddy-cascade/cascade#"

// WriteHeaders writes the rate-limit header families of a decision.
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
func (d *Decision) WriteHeaders(hdr http.Header) {
	if d.Buckets == nil || d.Closest < 0 {
		return
	}
	e := d.e
	cfg := &e.cfg.Headers
	ietf, xrl := cfg.IETF, cfg.XRateLimit
	retry := !d.Allowed && !d.Impossible && cfg.RetryAfter
	if !ietf && !xrl && !retry && !cfg.OpenAI && !cfg.Anthropic { // headers none
		return
	}
	c := d.Buckets[d.Closest]
	cr := d.Results[d.Closest]
	t := CeilSeconds(microseconds(cr.Reset))
	if !d.Allowed {
		t = CeilSeconds(d.Retry)
	}
	if c.Limit.Penalty() != nil {
		// Refused by a penalty box, which is no policy of the
		// RateLimit headers: only the wait is said.
		ietf, xrl = false, false
	}
	// What does not change from one request to the next on this path
	// (RateLimit-Policy, each limit's name and capacity) is formatted once
	// per path, unless the adaptive factor scaled a limit.
	var ph *pathHeaders
	if !d.Scaled && (ietf || xrl) {
		ph = e.headerCache.get(d.Buckets)
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
			b = append(b, ph.items[d.Closest]...)
		} else {
			use("Ratelimit-Policy", e.policyOf(d))
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
			use("X-Ratelimit-Limit", ph.capacity[d.Closest])
		} else {
			b = strconv.AppendInt(b, d.Limits[d.Closest].Limit.Capacity(), 10)
			cut("X-Ratelimit-Limit")
		}
		b = strconv.AppendInt(b, cr.Remaining, 10)
		cut("X-Ratelimit-Remaining")
		b = strconv.AppendInt(b, t, 10)
		cut("X-Ratelimit-Reset")
	}
	if retry {
		b = strconv.AppendInt(b, CeilSeconds(d.Retry), 10)
		cut("Retry-After")
	}
	if n > 0 {
		var all string
		var vals []string
		if n <= len(headerValues{}.vals) && len(b) <= len(headerValues{}.b) {
			// The default headers of an admitted request: one
			// allocation.
			hv := new(headerValues)
			copy(hv.b[:], b)
			all, vals = unsafe.String(&hv.b[0], len(b)), hv.vals[:n]
		} else {
			all, vals = string(b), make([]string, n)
		}
		for i := 0; i < n; i++ {
			if fixed[i] != "" {
				vals[i] = fixed[i]
			} else {
				vals[i] = all[cuts[i]:cuts[i+1]]
			}
			hdr[names[i]] = vals[i : i+1 : i+1]
		}
	}
	if !d.Allowed && d.Mode != Warn && (cfg.RetryAfter || cfg.OpenAI || cfg.Anthropic) { // a refusal (warn lets it pass)
		writeRetry(hdr, d, cfg.RetryWithin)
	}
	if cfg.OpenAI {
		e.writeOpenAIHeaders(hdr, d)
	}
	if cfg.Anthropic {
		writeAnthropicHeaders(hdr, d)
	}
}

// writeRetry says, on a refusal, how long exactly to wait (retry-after-ms,
// which the OpenAI and Anthropic SDKs read before Retry-After's whole
// seconds) and whether an SDK should retry on its own at all
// (x-should-retry, which both obey): not when waiting will not help
// (impossible) or the wait is longer than within, which is for the
// caller to schedule rather than for a client to sleep through.
func writeRetry(hdr http.Header, d *Decision, within time.Duration) {
	if within <= 0 {
		within = time.Minute
	}
	retry := !d.Impossible && d.Retry > 0 && d.Retry <= within
	if !d.Impossible && d.Retry > 0 {
		hdr.Set("Retry-After-Ms", strconv.FormatInt(int64((d.Retry+time.Millisecond-1)/time.Millisecond), 10))
	}
	hdr.Set("X-Should-Retry", strconv.FormatBool(retry))
}

// writeAnthropicHeaders writes, for each dimension Anthropic's API names
// that d's path limits, the limit closest to exhaustion as Anthropic does:
// anthropic-ratelimit-<dim>-limit, -remaining, and -reset (when its bucket
// is full again, an RFC 3339 time).
func writeAnthropicHeaders(hdr http.Header, d *Decision) {
	// The dimensions Anthropic's headers name, and how they name them.
	dims := [...]struct{ dim, name string }{
		{"requests", "requests"}, {"tokens", "tokens"}, {"input_tokens", "input-tokens"}, {"output_tokens", "output-tokens"},
	}
	for _, ad := range dims {
		best := -1
		for i, bk := range d.Buckets {
			if bk.Limit.Dimension == ad.dim && (best < 0 || d.Results[i].Remaining < d.Results[best].Remaining) {
				best = i
			}
		}
		if best < 0 {
			continue
		}
		r := d.Results[best]
		prefix := "anthropic-ratelimit-" + ad.name
		hdr.Set(prefix+"-limit", strconv.FormatInt(d.Limits[best].Limit.Capacity(), 10))
		hdr.Set(prefix+"-remaining", strconv.FormatInt(r.Remaining, 10))
		hdr.Set(prefix+"-reset", time.UnixMicro(d.ChargedAt(best)+r.Reset).UTC().Format(time.RFC3339))
	}
}

// headerValues backs the values WriteHeaders cuts for the default headers
// (RateLimit-Policy and RateLimit): their slices and the bytes of those
// cut, in one allocation of 64 bytes rather than two of 32 and (for up to
// 32 bytes of text) 8 to 32. The bytes are never written again once cut.
type headerValues struct {
	vals [2]string
	b    [32]byte
}

// policyOf formats the RateLimit-Policy of a path whose limits may be
// scaled.
func (e *Engine) policyOf(d *Decision) string {
	var b strings.Builder
	b.Grow(64 * len(d.Buckets))
	for i, bk := range d.Buckets {
		if bk.Limit.Penalty() != nil {
			continue // a penalty box is no policy
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		if item, ok := e.policies[bk.Limit]; ok && d.Limits[i].Limit == bk.Limit.Rate() {
			b.WriteString(item) // unscaled: formatted once, at provision
		} else {
			writePolicy(&b, bk.Limit, d.Limits[i].Limit)
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
		if bk.Limit.Penalty() == nil { // a penalty box is no policy
			if b.Len() > 0 {
				b.WriteString(", ")
			}
			if item, ok := c.policies[bk.Limit]; ok {
				b.WriteString(item)
			} else {
				writePolicy(&b, bk.Limit, bk.Limit.Rate())
			}
		}
		ph.items[i] = `"` + bk.Limit.Policy() + `";r=`
		ph.capacity[i] = strconv.FormatInt(bk.Limit.Rate().Capacity(), 10)
	}
	ph.policy = b.String()
	return ph
}

// writePolicy writes one RateLimit-Policy item: the policy's name, its
// effective quota q (scaled when adaptive), its window w in seconds (none
// for a concurrency limit: q requests in flight at once) and, for
// dimensions other than requests, its quota unit qu.
func writePolicy(b *strings.Builder, hl *hierarchy.Limit, l rate.Limit) {
	b.WriteString(`"`)
	b.WriteString(hl.Policy())
	b.WriteString(`";q=`)
	b.WriteString(strconv.FormatInt(l.Capacity(), 10))
	if l.Algorithm != rate.Concurrent { // requests in flight have no window
		b.WriteString(";w=")
		b.WriteString(strconv.FormatInt(l.WindowSeconds(), 10))
	}
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
func (e *Engine) writeOpenAIHeaders(hdr http.Header, d *Decision) {
	for _, dim := range []string{"requests", "tokens"} {
		best := -1
		for i, bk := range d.Buckets {
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
		hdr.Set("x-ratelimit-limit-"+dim, strconv.FormatInt(d.Limits[best].Limit.Capacity(), 10))
		hdr.Set("x-ratelimit-remaining-"+dim, strconv.FormatInt(r.Remaining, 10))
		hdr.Set("x-ratelimit-reset-"+dim, strconv.FormatInt(CeilSeconds(microseconds(r.Reset)), 10)+"s")
	}
}

// Problem is an RFC 9457 problem detail, extended with what refused the
// request.
type Problem struct {
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	Status     int      `json:"status"`
	Detail     string   `json:"detail,omitempty"`
	BlockedBy  string   `json:"blocked_by,omitempty"`
	Policies   []string `json:"violated_policies,omitempty"`
	RetryAfter int64    `json:"retry_after,omitempty"`
	// OriginalStatus, refusing the retry of a request whose response
	// could not be kept for replay, is that response's status.
	OriginalStatus int `json:"original_status,omitempty"`
	// Error is the refusal as an LLM provider's SDK reads an error (an
	// extension member, as RFC 9457 allows): the OpenAI and Anthropic SDKs
	// then surface its message, type and code.
	Error *ProblemError `json:"error,omitempty"`

	kind      string // the refusal's kind, as given to NewProblem
	dimension string // what the denying limit counts ("" when no limit denied)
}

// ProblemError is a refusal as the providers' error objects say one.
type ProblemError struct {
	Type    string `json:"type"`    // rate_limit_error, invalid_request_error, api_error, …
	Code    string `json:"code"`    // rate_limit_exceeded for a 429, else the problem's kind
	Message string `json:"message"` // the problem's detail
}

// Refusal bodies: RFC 9457 problem+json, or the error object of an LLM
// provider's API, which its official SDKs read (message, type, code).
const (
	BodyProblem   = "problem"   // the default
	BodyOpenAI    = "openai"    // {"error": {"message", "type", "param", "code"}}
	BodyAnthropic = "anthropic" // {"type": "error", "error": {"type", "message"}}
)

// NewProblem describes a refusal of kind (a Reason or a front end's own;
// its type is ProblemBase + kind, with dashes) with status, title and
// detail, naming the policies of d that denied.
func NewProblem(status int, kind, title, detail string, d *Decision) *Problem {
	p := &Problem{
		Type:      ProblemBase + strings.ReplaceAll(kind, "_", "-"),
		Title:     title,
		Status:    status,
		Detail:    detail,
		BlockedBy: d.Blocked,
		kind:      kind,
	}
	if d.Closest >= 0 && d.Closest < len(d.Buckets) && (kind == ReasonLimited || kind == ReasonImpossible || kind == ReasonPenalty) {
		p.dimension = d.Buckets[d.Closest].Limit.Dimension
	}
	for i, r := range d.Results {
		if !r.Allowed {
			p.Policies = append(p.Policies, d.Buckets[i].Tree.Name+"/"+d.Buckets[i].Limit.Name())
		}
	}
	if d.Retry > 0 {
		p.RetryAfter = CeilSeconds(d.Retry)
	}
	p.Error = &ProblemError{Type: p.anthropicType(), Code: kind, Message: detail}
	if status == http.StatusTooManyRequests {
		p.Error.Code = "rate_limit_exceeded"
	}
	if detail == "" {
		p.Error.Message = title
	}
	return p
}

// Write writes the problem as an application/problem+json response.
func (p *Problem) Write(w http.ResponseWriter) error { return p.WriteAs(w, BodyProblem) }

// WriteAs writes p as the body format says (a Body constant; "" is
// BodyProblem). A provider's error object carries the problem's detail as
// its message; its type and code say what the provider's would for the
// same status (a 429: rate_limit_exceeded, of type requests or tokens at
// OpenAI, rate_limit_error at Anthropic).
func (p *Problem) WriteAs(w http.ResponseWriter, format string) error {
	var v any = p
	contentType := "application/problem+json"
	switch format {
	case BodyOpenAI:
		v, contentType = p.openAI(), "application/json"
	case BodyAnthropic:
		v, contentType = p.anthropic(), "application/json"
	}
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	_, err = w.Write(body)
	return err
}

// openAIError is OpenAI's error object.
type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func (p *Problem) openAI() *openAIError {
	e := &openAIError{}
	e.Error.Message = p.message()
	code := p.kind
	switch {
	case p.Status == http.StatusTooManyRequests:
		code, e.Error.Type = "rate_limit_exceeded", "requests"
		if p.dimension != "" && p.dimension != "requests" {
			e.Error.Type = p.dimension
		}
	case p.Status >= 500:
		e.Error.Type = "server_error"
	default:
		e.Error.Type = "invalid_request_error"
	}
	e.Error.Code = &code
	return e
}

// anthropicError is Anthropic's error object.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (p *Problem) anthropic() *anthropicError {
	e := &anthropicError{Type: "error"}
	e.Error.Message, e.Error.Type = p.message(), p.anthropicType()
	return e
}

// anthropicType is the type of Anthropic's error for p's status.
func (p *Problem) anthropicType() string {
	switch {
	case p.Status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case p.Status == http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case p.Status == http.StatusForbidden:
		return "permission_error"
	case p.Status >= 500:
		return "api_error"
	}
	return "invalid_request_error"
}

// message is the problem as one sentence: its title, and its detail.
func (p *Problem) message() string {
	if p.Detail == "" {
		return p.Title
	}
	return p.Title + ": " + p.Detail
}

// Detail says why d was denied, for a problem body.
func (d *Decision) Detail() string {
	if d.Reason == ReasonImpossible {
		return "this request costs more than the " + d.Blocked + " limit can ever admit"
	}
	if d.Reason == ReasonPenalty {
		return "refused too often by the " + d.Blocked + " limit: refused outright; retry in " + strconv.FormatInt(CeilSeconds(d.Retry), 10) + " s"
	}
	return "the " + d.Blocked + " limit is exhausted; retry in " + strconv.FormatInt(CeilSeconds(d.Retry), 10) + " s"
}
