package cascade

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// The decision endpoint: a rate_limit handler with `forwarded` decides for
// another proxy (Traefik's ForwardAuth or Cascade's Traefik plugin, nginx's
// auth_request, Envoy's ext_authz in HTTP mode). It reads the original
// request from the forwarded headers, decides it like any request, and
// answers itself: 200 with the rate-limit headers, or the refusal. A
// decision whose costs reconcile from the upstream's response is held
// under an id (the Cascade-Decision response header) until the front end
// reports that response to the report path.

// ForwardedConfig makes a rate_limit handler a decision endpoint.
type ForwardedConfig struct {
	// Report is the path at which front ends report an upstream's
	// response for the decision named by its Cascade-Decision header to be
	// reconciled; empty for none. Keep it, like the whole endpoint, where
	// only the proxies can reach it.
	Report string `json:"report,omitempty"`
	// ReportTTL is how long a decision waits for its report; default 10m.
	// A decision not reported in time keeps its estimate.
	ReportTTL caddy.Duration `json:"report_ttl,omitempty"`
	// MaxReportBytes bounds a report's body; default 1 MiB. Larger reports
	// are refused (413) and the decision keeps its estimate.
	MaxReportBytes int64 `json:"max_report_bytes,omitempty"`
	// MaxHeld bounds the decisions waiting for a report; default 100000.
	// When full, the oldest is dropped (it keeps its estimate).
	MaxHeld int `json:"max_held,omitempty"`
}

// decisionHeader names a held decision, in the endpoint's answer and in a
// report.
const decisionHeader = "Cascade-Decision"

func (c *ForwardedConfig) provision() error {
	if c.Report != "" && !strings.HasPrefix(c.Report, "/") {
		return fmt.Errorf("forwarded: report %q: give a path starting with /, e.g. /report", c.Report)
	}
	if c.ReportTTL < 0 || c.MaxReportBytes < 0 || c.MaxHeld < 0 {
		return errors.New("forwarded: report_ttl, max_report_bytes and max_held must not be negative")
	}
	if c.ReportTTL == 0 {
		c.ReportTTL = caddy.Duration(10 * time.Minute)
	}
	if c.MaxReportBytes == 0 {
		c.MaxReportBytes = 1 << 20
	}
	if c.MaxHeld == 0 {
		c.MaxHeld = 100000
	}
	return nil
}

// parseForwarded parses
//
//	forwarded {
//	    report           <path>
//	    report_ttl       <duration>
//	    max_report_bytes <size>
//	    max_held         <n>
//	}
func (h *Handler) parseForwarded(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.Errf("forwarded takes a block or nothing, not %q", d.Val())
	}
	c := &ForwardedConfig{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch opt := d.Val(); opt {
		case "report":
			if !d.NextArg() {
				return d.Errf("report needs a path, e.g. report /report")
			}
			c.Report = d.Val()
			if !strings.HasPrefix(c.Report, "/") {
				return d.Errf("report %q: give a path starting with /, e.g. /report", c.Report)
			}
		case "report_ttl":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, perr := caddy.ParseDuration(d.Val())
			if perr != nil || dur <= 0 {
				return d.Errf("report_ttl %q: give a positive duration, e.g. 10m", d.Val())
			}
			c.ReportTTL = caddy.Duration(dur)
		case "max_report_bytes":
			c.MaxReportBytes, err = sizeArg(d)
		case "max_held":
			var n int64
			if n, err = int64Arg(d); err == nil {
				c.MaxHeld = int(n)
			}
		default:
			return d.Errf("forwarded: unknown option %q: expected report, report_ttl, max_report_bytes or max_held", opt)
		}
		if err != nil {
			return err
		}
	}
	h.Forwarded = c
	return nil
}

// errNotForwarded refuses a request to the decision endpoint that does
// not say which request is to be decided.
var errNotForwarded = errors.New("this endpoint decides forwarded requests: send the original request's URI in X-Forwarded-Uri (Traefik, Envoy) or X-Original-URI (nginx), and its method in X-Forwarded-Method")

// unforward turns the endpoint's request into the request it forwards,
// in place (as Caddy's rewrite does, so that matchers and placeholders see
// it): the method from X-Forwarded-Method, the URI from X-Forwarded-Uri
// or X-Original-URI, the host from X-Forwarded-Host, the client from the
// last address of X-Forwarded-For (the one the proxy saw). Every other
// header is the original request's, as the proxies copy them.
func unforward(r *http.Request) error {
	uri := r.Header.Get("X-Forwarded-Uri")
	if uri == "" {
		uri = r.Header.Get("X-Original-URI")
	}
	if uri == "" {
		return errNotForwarded
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil || u.Host != "" {
		return fmt.Errorf("the forwarded URI %q is not a request path: %v", truncate(uri, 256), err)
	}
	if m := r.Header.Get("X-Forwarded-Method"); m != "" {
		if strings.ContainsFunc(m, func(c rune) bool { return c <= ' ' || c >= 0x7f }) || len(m) > 32 {
			return fmt.Errorf("the forwarded method %q is not a method", truncate(m, 32))
		}
		r.Method = m
	}
	r.URL.Path, r.URL.RawPath, r.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
	r.RequestURI = uri
	if host := r.Header.Get("X-Forwarded-Host"); host != "" {
		r.Host = host
	}
	if xff := r.Header.Get("X-Forwarded-For"); xff != "" {
		last := strings.TrimSpace(xff[strings.LastIndexByte(xff, ',')+1:])
		if ip := net.ParseIP(last); ip != nil {
			r.RemoteAddr = net.JoinHostPort(ip.String(), "0")
			caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, ip.String())
		}
	}
	return nil
}

// answer is the decision endpoint's "next" handler: the request is
// admitted (or passed by a tree that does not enforce).
var answer = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	w.WriteHeader(http.StatusOK)
	return nil
})

// held are the decisions of one endpoint waiting for their reports,
// bounded in number and age.
type held struct {
	mu    sync.Mutex
	byID  map[string]*heldDecision
	order []string // ids, oldest first (may hold ids already reported)
}

type heldDecision struct {
	held    *engine.Held
	costs   []int // the reconciling costs counted on the path (h.Costs indices)
	expires time.Time
}

// hold keeps d for its report and names it in the answer's
// Cascade-Decision header, when some cost on d's path reconciles.
func (h *Handler) hold(hdr http.Header, d *decision) {
	var costs []int
	for i, c := range h.Costs {
		if c.Reconcile != nil && slices.ContainsFunc(d.Buckets, func(b hierarchy.Bucket) bool { return b.Limit.Dimension == c.Dimension }) {
			costs = append(costs, i)
		}
	}
	if len(costs) == 0 {
		return
	}
	hd := h.engine.Hold(&d.Decision)
	if hd == nil {
		return
	}
	var b [18]byte
	_, _ = rand.Read(b[:])
	id := base64.RawURLEncoding.EncodeToString(b[:])
	now := time.Now()
	p := h.pending
	p.mu.Lock()
	for len(p.order) > 0 && (len(p.byID) >= h.Forwarded.MaxHeld || p.byID[p.order[0]] == nil || now.After(p.byID[p.order[0]].expires)) {
		delete(p.byID, p.order[0])
		p.order = p.order[1:]
	}
	if len(p.order) > 2*max(len(p.byID), 1024) { // reported ids behind a live one
		p.order = slices.DeleteFunc(p.order, func(id string) bool { return p.byID[id] == nil })
	}
	p.byID[id] = &heldDecision{held: hd, costs: costs, expires: now.Add(time.Duration(h.Forwarded.ReportTTL))}
	p.order = append(p.order, id)
	p.mu.Unlock()
	hdr.Set(decisionHeader, id)
}

// put holds hd under id again.
func (p *held) put(id string, hd *heldDecision) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.byID[id] = hd
	p.order = append(p.order, id)
}

// take removes the held decision id and returns it, or nil when it is
// unknown, expired or already reported.
func (p *held) take(id string) *heldDecision {
	p.mu.Lock()
	defer p.mu.Unlock()
	hd := p.byID[id]
	delete(p.byID, id)
	if hd == nil || time.Now().After(hd.expires) {
		return nil
	}
	return hd
}

// serveReport reconciles a held decision with the upstream's response a
// front end reports: the body as the upstream sent it (JSON or an event
// stream, as its Content-Type says), read by the costs' usage readers.
func (h *Handler) serveReport(w http.ResponseWriter, r *http.Request) error {
	fail := func(status int, kind, detail string) error {
		return engine.NewProblem(status, kind, http.StatusText(status), detail, &engine.Decision{}).Write(w)
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return fail(http.StatusMethodNotAllowed, "bad_report", "report a response with POST")
	}
	id := r.Header.Get(decisionHeader)
	if id == "" {
		return fail(http.StatusBadRequest, "bad_report", "a report names its decision in the "+decisionHeader+" header, as the decision's answer gave it")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.Forwarded.MaxReportBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fail(http.StatusRequestEntityTooLarge, cost.TypeBodyTooLarge,
				fmt.Sprintf("a report's body is at most %d bytes (max_report_bytes); the decision keeps its estimate", h.Forwarded.MaxReportBytes))
		}
		return fail(http.StatusBadRequest, "bad_report", "reading the report: "+err.Error())
	}
	hd := h.pending.take(id)
	if hd == nil {
		return fail(http.StatusNotFound, "unknown_decision", fmt.Sprintf("no decision %q waits for a report: unknown, older than report_ttl, or already reported", truncate(id, 64)))
	}
	var usage []engine.Usage
	for _, i := range hd.costs {
		c := h.Costs[i]
		tp := cost.NewTap(discard{hdr: http.Header{"Content-Type": {r.Header.Get("Content-Type")}, "Content-Encoding": r.Header.Values("Content-Encoding")}}, c.Reconcile.TapConfig)
		tp.WriteHeader(http.StatusOK)
		_, _ = tp.Write(body)
		if u := tp.Usage(); u.Found {
			usage = append(usage, engine.Usage{Dimension: c.Dimension, Actual: c.Reconcile.Actual.Cost(u)})
		}
	}
	adjusted, err := h.engine.ReconcileHeld(r.Context(), hd.held, usage...)
	if err != nil {
		h.pending.put(id, hd) // for the front end to report again
		h.logStoreError(err)
		w.Header().Set("Retry-After", "1")
		return fail(http.StatusServiceUnavailable, problemUnavailable, "the rate limit store could not apply the report; report again shortly")
	}
	if ce := h.logger.Check(zap.DebugLevel, "usage reported"); ce != nil {
		ce.Write(zap.String("decision", id), zap.Int("usages", len(usage)), zap.Int("adjusted", len(adjusted)))
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// discard is a ResponseWriter that keeps nothing but its header: what a
// usage reader reads a reported body through.
type discard struct{ hdr http.Header }

func (d discard) Header() http.Header         { return d.hdr }
func (d discard) Write(p []byte) (int, error) { return len(p), nil }
func (d discard) WriteHeader(int)             {}
