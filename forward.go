package cascade

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/engine"
)

// The decision endpoint: a rate_limit handler with `forwarded` decides for
// another proxy (Traefik's ForwardAuth or Cascade's Traefik plugin, nginx's
// auth_request, Envoy's ext_authz in HTTP mode). It reads the original
// request from the forwarded headers, decides it like any request, and
// answers itself: 200 with the rate-limit headers, or the refusal. A
// decision whose costs reconcile from the upstream's response is held
// under an id (the Cascade-Decision response header) until the front end
// reports that response to the report path.
//
// Forwarded headers say who the client is and what it asked for, so the
// endpoint answers only peers the server trusts (Caddy's trusted_proxies):
// from anyone else they would let a client pick its own bucket.

// ForwardedConfig makes a rate_limit handler a decision endpoint.
type ForwardedConfig struct {
	// Report is the path at which front ends report an upstream's
	// response for the decision named by its Cascade-Decision header to be
	// reconciled; empty for none. Reports, like decisions, are answered
	// only to the server's trusted proxies.
	Report string `json:"report,omitempty"`
	// ReportTTL is how long a decision waits for its report; default 10m.
	// A decision not reported in time keeps its estimate.
	ReportTTL caddy.Duration `json:"report_ttl,omitempty"`
	// MaxReportBytes bounds a report's body; default 1 MiB. Larger reports
	// are refused (413) and the decision keeps its estimate.
	MaxReportBytes int64 `json:"max_report_bytes,omitempty"`
	// MaxHeld bounds the decisions waiting for a report; default 100000.
	// When full, the oldest decision of the tenant holding the most is
	// dropped (it keeps its estimate).
	MaxHeld int `json:"max_held,omitempty"`
	// MaxHeldPerTenant bounds the decisions of one tenant (the value of
	// the first tier keyed on a placeholder, as the store shards by it)
	// waiting for a report; default a tenth of MaxHeld. When a tenant
	// holds that many, its own oldest is dropped: one tenant's flood never
	// drops another's.
	MaxHeldPerTenant int `json:"max_held_per_tenant,omitempty"`
	// URIHeader names the one header that carries the original request's
	// URI, for a proxy known to send it (nginx: X-Original-URI). By
	// default both X-Forwarded-Uri and X-Original-URI are read, and a
	// request in which they disagree is refused.
	URIHeader string `json:"uri_header,omitempty"`

	logger          *zap.Logger
	untrustedLogged *atomic.Bool // the first refusal of an untrusted peer is logged (set at provision)
}

// decisionHeader names a pending decision, in the endpoint's answer and in a
// report.
const decisionHeader = "Cascade-Decision"

// uriHeaders carry the original request's URI, as the proxies name them:
// Traefik and Envoy X-Forwarded-Uri, nginx (by convention) X-Original-URI.
var uriHeaders = []string{"X-Forwarded-Uri", "X-Original-URI"}

func (c *ForwardedConfig) provision() error {
	if c.Report != "" && !strings.HasPrefix(c.Report, "/") {
		return fmt.Errorf("forwarded: report %q: give a path starting with /, e.g. /report", c.Report)
	}
	if c.ReportTTL < 0 || c.MaxReportBytes < 0 || c.MaxHeld < 0 || c.MaxHeldPerTenant < 0 {
		return errors.New("forwarded: report_ttl, max_report_bytes, max_held and max_held_per_tenant must not be negative")
	}
	if c.URIHeader != "" && !isHeaderName(c.URIHeader) {
		return fmt.Errorf("forwarded: uri_header %q is not a header name: give one such as X-Original-URI", c.URIHeader)
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
	if c.MaxHeldPerTenant == 0 {
		c.MaxHeldPerTenant = max(c.MaxHeld/10, 1)
	}
	if c.MaxHeldPerTenant > c.MaxHeld {
		return fmt.Errorf("forwarded: max_held_per_tenant %d is more than max_held %d: give at most max_held", c.MaxHeldPerTenant, c.MaxHeld)
	}
	return nil
}

// isHeaderName tells whether s is an HTTP field name (an RFC 9110 token).
func isHeaderName(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(c rune) bool {
		return c <= ' ' || c >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c)
	})
}

// provisionForwarded readies a decision endpoint, and warns when its
// server trusts no proxy: then it refuses every request (403).
func (h *Handler) provisionForwarded(ctx caddy.Context) error {
	c := h.Forwarded
	if err := c.provision(); err != nil {
		return err
	}
	c.logger, c.untrustedLogged = h.logger, new(atomic.Bool)
	h.reports = &pendingReports{byID: map[string]*pendingDecision{}}
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil {
		trusts, known := trustsProxies(srv)
		switch {
		case known && !trusts:
			h.logger.Warn("rate_limit: this decision endpoint (forwarded) answers only the server's trusted proxies, "+
				"and its server has none: every request will be refused (403). List the proxies that call it, "+
				"e.g. in the Caddyfile's global options: servers { trusted_proxies static 127.0.0.1/32 }",
				zap.String("server", srv.Name()))
		case trusts && srv.TrustedProxiesStrict == 0:
			// Caddy then takes the left-most X-Forwarded-For address, which
			// a client chooses when its proxy appends to the header.
			h.logger.Warn("rate_limit: this decision endpoint (forwarded) keys clients on {client_ip}, which its server "+
				"reads from the left of X-Forwarded-For: a proxy that appends to a client's X-Forwarded-For (Traefik, "+
				"Envoy) lets the client choose it. Unless every proxy replaces the header, set trusted_proxies_strict: "+
				"servers { trusted_proxies ...; trusted_proxies_strict }",
				zap.String("server", srv.Name()))
		}
	}
	return nil
}

// trustsProxies tells whether srv trusts some proxy, and whether that
// could be found out. Caddy keeps a server's provisioned trusted_proxies
// unexported (and clears the raw config once loaded), so its nil-ness is
// read by reflection; a Caddy without that field leaves it unknown, and
// the first refusal is logged instead (see untrusted).
func trustsProxies(srv *caddyhttp.Server) (trusts, known bool) {
	if srv.TrustedProxiesRaw != nil || srv.TrustedProxiesUnix {
		return true, true
	}
	f := reflect.ValueOf(srv).Elem().FieldByName("trustedProxies")
	if !f.IsValid() || (f.Kind() != reflect.Interface && f.Kind() != reflect.Pointer) {
		return false, false
	}
	return !f.IsNil(), true
}

// serveForwarded answers what a decision endpoint answers itself: a peer
// it does not trust, a report, a request whose forwarded headers cannot
// be read. Otherwise it turns r into the request it forwards, to be
// decided, and answered is false.
func (h *Handler) serveForwarded(w http.ResponseWriter, r *http.Request) (answered bool, err error) {
	c := h.Forwarded
	if !trustedPeer(r) {
		return true, h.untrusted(w, r)
	}
	// A report is a request to the report path that forwards nothing (a
	// forwarded request's path may be anything: nginx asks at the
	// original URI).
	if c.Report != "" && r.URL.Path == c.Report && !c.forwardsURI(r.Header) {
		return true, h.serveReport(w, r)
	}
	if err := c.unforward(r); err != nil {
		return true, h.badForwarded(w, r, err)
	}
	return false, nil
}

// trustedPeer is Caddy's verdict on r's peer: one of its server's
// trusted_proxies (then Caddy has resolved the client from its
// client_ip_headers too).
func trustedPeer(r *http.Request) bool {
	trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool)
	return trusted
}

// problemUntrusted is the kind of the refusal of a peer that is not a
// trusted proxy (its type ends in #untrusted-proxy).
const problemUntrusted = "untrusted_proxy"

// untrusted refuses a request from a peer that is not a trusted proxy:
// 403, nothing decided, nothing charged. The first is logged.
//
//go:noinline
func (h *Handler) untrusted(w http.ResponseWriter, r *http.Request) error {
	if c := h.Forwarded; c.untrustedLogged != nil && c.untrustedLogged.CompareAndSwap(false, true) {
		c.logger.Warn("rate_limit: a decision endpoint (forwarded) refused a peer that is not one of its server's "+
			"trusted_proxies (logged once): if it is your proxy, add its address to trusted_proxies",
			zap.String("peer", r.RemoteAddr))
	}
	d := &decision{Decision: engine.Decision{Reason: problemUntrusted, Closest: -1}}
	h.metrics.observe(d, 0)
	return h.problem(w, r, http.StatusForbidden, problemUntrusted, "Forbidden",
		"this decision endpoint honours forwarded headers only from its server's trusted_proxies, and this peer is not one of them", d)
}

// errNotForwarded refuses a request to the decision endpoint that does
// not say which request is to be decided.
var errNotForwarded = errors.New("this endpoint decides forwarded requests: send the original request's URI in X-Forwarded-Uri (Traefik, Envoy) or X-Original-URI (nginx), and its method in X-Forwarded-Method")

// forwardsURI tells whether h names an original URI in any header the
// endpoint may read one from.
func (c *ForwardedConfig) forwardsURI(h http.Header) bool {
	if c.URIHeader != "" && h.Get(c.URIHeader) != "" {
		return true
	}
	for _, name := range uriHeaders {
		if h.Get(name) != "" {
			return true
		}
	}
	return false
}

// forwardedURI is the original request's URI: from URIHeader alone when
// set, else from X-Forwarded-Uri and X-Original-URI, which must agree (a
// proxy that sets one and passes the client's other would otherwise let
// the client choose the request decided).
func (c *ForwardedConfig) forwardedURI(h http.Header) (string, error) {
	names := uriHeaders
	if c.URIHeader != "" {
		names = []string{c.URIHeader}
	}
	uri, from := "", ""
	for _, name := range names {
		for _, v := range h.Values(name) {
			switch {
			case v == "" || v == uri:
			case uri == "":
				uri, from = v, name
			default:
				return "", fmt.Errorf("the request names two original URIs, %s %q and %s %q: have the proxy set one and remove any the client sent, or name the one it sets with forwarded { uri_header <name> }",
					from, truncate(uri, 128), name, truncate(v, 128))
			}
		}
	}
	if uri == "" && c.URIHeader != "" {
		return "", fmt.Errorf("this endpoint decides forwarded requests: send the original request's URI in %s (uri_header), and its method in X-Forwarded-Method", c.URIHeader)
	}
	if uri == "" {
		return "", errNotForwarded
	}
	return uri, nil
}

// single is the one value of the header name, however many lines carry
// it: "" when none, an error when two differ.
func single(h http.Header, name string) (string, error) {
	one := ""
	for _, v := range h.Values(name) {
		if v != "" && one != "" && v != one {
			return "", fmt.Errorf("the request names two values of %s, %q and %q: have the proxy set it and remove the client's", name, truncate(one, 64), truncate(v, 64))
		}
		if v != "" {
			one = v
		}
	}
	return one, nil
}

// unforward turns the endpoint's request into the request it forwards,
// in place (as Caddy's rewrite does, so that matchers and placeholders see
// it): the method from X-Forwarded-Method, the URI from the URI headers
// (see forwardedURI), the host from X-Forwarded-Host. The client is the
// one Caddy resolved from its client_ip_headers for a trusted peer
// ({client_ip}); the remote address is set to it, for {remote_host}.
// Every other header is the original request's, as the proxies copy them.
// Call it only for a trusted peer.
func (c *ForwardedConfig) unforward(r *http.Request) error {
	uri, err := c.forwardedURI(r.Header)
	if err != nil {
		return err
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil || u.Host != "" {
		return fmt.Errorf("the forwarded URI %q is not a request path: %v", truncate(uri, 256), err)
	}
	m, err := single(r.Header, "X-Forwarded-Method")
	if err != nil {
		return err
	}
	if strings.ContainsFunc(m, func(c rune) bool { return c <= ' ' || c >= 0x7f }) || len(m) > 32 {
		return fmt.Errorf("the forwarded method %q is not a method", truncate(m, 32))
	}
	host, err := single(r.Header, "X-Forwarded-Host")
	if err != nil {
		return err
	}
	if m != "" {
		r.Method = m
	}
	r.URL.Path, r.URL.RawPath, r.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
	r.RequestURI = uri
	if host != "" {
		r.Host = host
	}
	if ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); net.ParseIP(ip) != nil {
		r.RemoteAddr = net.JoinHostPort(ip, "0")
	}
	return nil
}

// answer is the decision endpoint's "next" handler: the request is
// admitted (or passed by a tree that does not enforce).
var answer = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	w.WriteHeader(http.StatusOK)
	return nil
})

// serveReport reconciles a pending decision with the upstream's response a
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
	hd := h.reports.take(id, time.Now())
	if hd == nil {
		return fail(http.StatusNotFound, "unknown_decision", fmt.Sprintf("no decision %q waits for a report: unknown, older than report_ttl, or already reported", truncate(id, 64)))
	}
	usage := h.reportedUsage(hd, r.Header, body)
	adjusted, err := hd.charge.Reconcile(r.Context(), usage...)
	if err != nil {
		h.reports.add(hd, h.Forwarded, time.Now()) // for the front end to report again
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

// reportedUsage reads, with the usage reader of each reconciling cost of
// hd, the usage a reported body shows (hdr: the report's headers, whose
// Content-Type and Content-Encoding are the upstream's).
func (h *Handler) reportedUsage(hd *pendingDecision, hdr http.Header, body []byte) []engine.Usage {
	var usage []engine.Usage
	for _, i := range hd.costs {
		c := h.Costs[i]
		tp := cost.NewTap(discard{hdr: http.Header{"Content-Type": {hdr.Get("Content-Type")}, "Content-Encoding": hdr.Values("Content-Encoding")}}, c.Reconcile.TapConfig)
		tp.WriteHeader(http.StatusOK)
		_, _ = tp.Write(body)
		if u := tp.Usage(); u.Found {
			usage = append(usage, engine.Usage{Dimension: c.Dimension, Actual: c.actual(u, hd.model)})
		}
	}
	return usage
}

// discard is a ResponseWriter that keeps nothing but its header: what a
// usage reader reads a reported body through.
type discard struct{ hdr http.Header }

func (d discard) Header() http.Header         { return d.hdr }
func (d discard) Write(p []byte) (int, error) { return len(p), nil }
func (d discard) WriteHeader(int)             {}
