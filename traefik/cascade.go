// Package traefik is a Traefik middleware plugin that has Cascade decide
// every request: exact, hierarchical, cost-weighted rate limits shared by
// every proxy in front of an API.
//
// For each request it asks Cascade's decision endpoint (a Caddy running
// Cascade) with the request's method, URI, host and client address in the
// X-Forwarded-* headers, its own headers, and optionally its body (for LLM
// or GraphQL costs). A 2xx answer admits the request: the plugin passes it
// on and adds the rate-limit headers Cascade returned to the response
// (which Traefik's ForwardAuth cannot do). A refusal (429 with Retry-After,
// or Cascade's 503) reaches the client with Cascade's problem+json body and
// its rate-limit headers only. When Cascade names the decision
// (Cascade-Decision) and a report endpoint is configured, the plugin keeps
// the upstream's response body (bounded) and reports it in the background
// after the response, so that Cascade reconciles the charge with the usage
// the upstream reports (LLM tokens).
//
// Cascade believes those forwarded headers only from the peers its server
// trusts (Caddy's trusted_proxies) and refuses anyone else (403): bind the
// decision endpoint to loopback, or to an address only Traefik reaches, and
// list Traefik's address in trusted_proxies. The plugin overwrites every
// forwarded header a client could send (the URI, method, host, proto and
// client Cascade reads, and removes the others: X-Original-URI, Forwarded,
// ...). The client is the peer Traefik saw, or, when that peer is one of
// TrustedIPs, the address X-Forwarded-For names as Traefik's own
// forwardedHeaders.trustedIPs would believe it.
//
// It uses the standard library only: Traefik interprets plugins with Yaegi,
// which hands compiled code an interpreted http.ResponseWriter through a
// wrapper with only Header, Write and WriteHeader. So Traefik's proxy
// behind the plugin can neither flush nor hijack the plugin's writer: the
// plugin flushes streams itself and gives upgrades Traefik's own writer.
package traefik

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Config is the plugin's configuration (Traefik's dynamic configuration).
type Config struct {
	// Endpoint is the URL of Cascade's decision endpoint.
	Endpoint string `json:"endpoint,omitempty"`
	// ReportEndpoint, when set, is where the upstream's response is
	// reported for the decision to be reconciled.
	ReportEndpoint string `json:"reportEndpoint,omitempty"`
	// Timeout bounds one decision (default 250ms).
	Timeout string `json:"timeout,omitempty"`
	// FailOpen passes requests when Cascade cannot be reached; by default
	// they get 503.
	FailOpen bool `json:"failOpen,omitempty"`
	// SendBody sends the request's body with the decision, for costs read
	// from it; the upstream still gets all of it. A body over MaxBodyBytes
	// (default 1 MiB) is refused with 413: priced on its start, it would
	// be charged less than it costs.
	SendBody     bool  `json:"sendBody,omitempty"`
	MaxBodyBytes int64 `json:"maxBodyBytes,omitempty"`
	// MaxReportBytes bounds the response body kept for a report (default
	// 1 MiB): a JSON body longer than that is not reported; of an event
	// stream its start and its end are, where the usage is.
	MaxReportBytes int64 `json:"maxReportBytes,omitempty"`
	// MaxReportMemory bounds the response bodies kept at once, for the
	// responses under way and the reports not yet sent (default 64 MiB):
	// past it a response is not kept, and its decision keeps its estimate.
	MaxReportMemory int64 `json:"maxReportMemory,omitempty"`
	// TrustedIPs are the peers (addresses or CIDRs) whose X-Forwarded-For
	// is believed, as Traefik's forwardedHeaders.trustedIPs: a load
	// balancer in front of Traefik. From any other peer the client is the
	// peer itself.
	TrustedIPs []string `json:"trustedIPs,omitempty"`
}

// CreateConfig returns the default configuration.
func CreateConfig() *Config {
	return &Config{Timeout: "250ms", MaxBodyBytes: 1 << 20, MaxReportBytes: 1 << 20, MaxReportMemory: 64 << 20}
}

// Cascade is the middleware.
type Cascade struct {
	next     http.Handler
	name     string
	cfg      Config
	trusted  []*net.IPNet
	client   *http.Client // decisions: bounded by the timeout
	reporter *http.Client // reports: off the request's path, bounded by reportTimeout or the timeout
	reports  chan struct{}
	memory   atomic.Int64 // bytes of MaxReportMemory not reserved by a kept body
	logged   atomic.Int64 // when logf last wrote, in Unix nanoseconds
}

const (
	// maxReports bounds the reports in flight; past it a report is dropped
	// (the decision keeps its estimate) rather than queued.
	maxReports = 256
	// reportTimeout bounds a report, which no response waits for.
	reportTimeout = 5 * time.Second
	// maxProblemBytes bounds a refusal's body passed to the client.
	maxProblemBytes = 64 << 10
	// problemBase starts the type of every problem, as Cascade's own.
	problemBase = "https://github.com/caddy-cascade/cascade#"
)

// New creates the middleware.
func New(_ context.Context, next http.Handler, cfg *Config, name string) (http.Handler, error) {
	if err := checkURL("endpoint", cfg.Endpoint, true); err != nil {
		return nil, err
	}
	if err := checkURL("reportEndpoint", cfg.ReportEndpoint, false); err != nil {
		return nil, err
	}
	timeout := 250 * time.Millisecond
	if cfg.Timeout != "" {
		d, err := time.ParseDuration(cfg.Timeout)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("cascade: timeout %q: give a positive duration such as 250ms", cfg.Timeout)
		}
		timeout = d
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.MaxReportBytes <= 0 {
		cfg.MaxReportBytes = 1 << 20
	}
	if cfg.MaxReportMemory <= 0 {
		cfg.MaxReportMemory = 64 << 20
	}
	var trusted []*net.IPNet
	for _, s := range cfg.TrustedIPs {
		n, err := parseNet(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("cascade: trustedIPs %q: give an address or a CIDR such as 10.0.0.0/8: %w", s, err)
		}
		trusted = append(trusted, n)
	}
	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		// A closure, not the method value: Yaegi cannot convert the latter.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, addr)
		},
	}
	reportBound := reportTimeout
	if timeout > reportBound {
		reportBound = timeout
	}
	// A redirect is not an answer: the endpoint is Cascade's, or not. (Its
	// parameters named: Yaegi mistypes a func literal's unnamed ones.)
	noRedirect := func(req *http.Request, via []*http.Request) error { return http.ErrUseLastResponse }
	c := &Cascade{next: next, name: name, cfg: *cfg, trusted: trusted,
		client:   &http.Client{Transport: transport, Timeout: timeout, CheckRedirect: noRedirect},
		reporter: &http.Client{Transport: transport, Timeout: reportBound, CheckRedirect: noRedirect},
		reports:  make(chan struct{}, maxReports)}
	c.memory.Store(cfg.MaxReportMemory)
	return c, nil
}

// checkURL validates the URL of an endpoint setting.
func checkURL(setting, s string, required bool) error {
	if s == "" && !required {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("cascade: %s %q: give the http(s) URL of Cascade's decision endpoint, e.g. http://cascade:8080/ (and http://cascade:8080/report for reportEndpoint)", setting, s)
	}
	return nil
}

// parseNet reads a CIDR, or an address as a network of one.
func parseNet(s string) (*net.IPNet, error) {
	if strings.Contains(s, "/") {
		_, n, err := net.ParseCIDR(s)
		return n, err
	}
	ip := net.ParseIP(s)
	if ip == nil {
		return nil, fmt.Errorf("not an address")
	}
	bits := 128
	if ip4 := ip.To4(); ip4 != nil {
		ip, bits = ip4, 32
	}
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}, nil
}

// hopHeaders are not forwarded in either direction.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
}

// decisionHeader names the decision for a report.
const decisionHeader = "Cascade-Decision"

// ServeHTTP has Cascade decide r, then passes it on or answers the refusal.
func (c *Cascade) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, ok := c.readBody(w, r)
	if !ok {
		return
	}
	res, err := c.decide(r, body)
	if err == nil && res.StatusCode/100 != 2 {
		err = c.refuse(w, res)
		res.Body.Close()
		if err == nil {
			return
		}
	}
	if err != nil {
		if r.Context().Err() == nil { // else the client left: nothing failed
			c.logf("no decision for %s %q: %v", r.Method, r.URL.Path, err)
		}
		if c.cfg.FailOpen {
			c.next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, "decision-unavailable",
			"the rate limit service could not decide this request; retry shortly")
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20)) // reuse the connection
	res.Body.Close()
	add := rateLimitHeaders(res.Header)
	if webSocket(r) {
		// Traefik's proxy switches protocols by hijacking the writer it
		// is given, which the plugin's own cannot offer (see the package
		// comment): it gets Traefik's, the headers set. Its response is
		// not reported: a WebSocket is charged its estimate.
		for k, vs := range add {
			w.Header()[k] = vs
		}
		c.next.ServeHTTP(w, r)
		return
	}
	if r.Header.Get("Upgrade") != "" {
		// Any other upgrade would take Traefik's writer too, and its
		// response would go unreported: the upstream is not asked to.
		r.Header.Del("Upgrade")
		r.Header.Del("Connection")
	}
	id := res.Header.Get(decisionHeader)
	rw := &responseWriter{ResponseWriter: w, add: add}
	if id != "" && c.cfg.ReportEndpoint != "" {
		if c.memory.Add(-c.cfg.MaxReportBytes) >= 0 {
			rw.keep = c.cfg.MaxReportBytes
			// A body the report endpoint can decode: gzip or none.
			if acceptsGzip(r.Header) {
				r.Header.Set("Accept-Encoding", "gzip")
			} else {
				r.Header.Del("Accept-Encoding")
			}
		} else {
			c.memory.Add(c.cfg.MaxReportBytes)
			c.logf("response to decision %s not kept for its report: maxReportMemory (%d bytes) in use", id, c.cfg.MaxReportMemory)
		}
	}
	c.next.ServeHTTP(rw, r)
	if rw.keep > 0 {
		if rw.overflow {
			c.memory.Add(rw.keep)
		} else {
			c.report(id, rw) // gives the memory back once sent
		}
	}
}

// webSocket tells whether r asks to become a WebSocket: a GET without a
// body whose Connection names "upgrade" and whose Upgrade is websocket.
func webSocket(r *http.Request) bool {
	return r.Method == http.MethodGet && r.ContentLength <= 0 && upgrading(r.Header) &&
		strings.EqualFold(strings.TrimSpace(r.Header.Get("Upgrade")), "websocket")
}

// acceptsGzip tells whether the client accepts gzip (with a q above 0).
func acceptsGzip(h http.Header) bool {
	for _, v := range h.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
				continue
			}
			q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
			return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
		}
	}
	return false
}

// readBody reads the request's body for the decision when SendBody is on,
// and gives the upstream a copy of it. A body over MaxBodyBytes is
// answered 413 (ok is false: answered).
//
// The upstream's copy never reads the original body again: Go's server
// closes that body, once read to its end, when the response starts, and
// Traefik's transport, checking a body for bytes past its length as the
// response comes, would then fail and cut the response.
func (c *Cascade) readBody(w http.ResponseWriter, r *http.Request) (body []byte, ok bool) {
	// ContentLength 0 is a request without a body, even one Traefik
	// wrapped (its access log does).
	if !c.cfg.SendBody || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, true
	}
	tooLarge := func() {
		writeProblem(w, http.StatusRequestEntityTooLarge, "body-too-large", fmt.Sprintf(
			"the request's body is over %d bytes, the most the rate limit reads to price a request", c.cfg.MaxBodyBytes))
	}
	if r.ContentLength > c.cfg.MaxBodyBytes {
		tooLarge()
		return nil, false
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, c.cfg.MaxBodyBytes+1))
	if err != nil {
		c.logf("reading the body of %s %q: %v", r.Method, r.URL.Path, err)
		writeProblem(w, http.StatusBadRequest, "bad-body", "the request's body could not be read")
		return nil, false
	}
	if int64(len(b)) > c.cfg.MaxBodyBytes {
		tooLarge()
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(b)) // the server closes the original
	return b, true
}

// clientForwarded are the headers describing a forwarded request that the
// plugin does not set: a client's copies are removed, so that only the
// plugin's say which request Cascade decides.
var clientForwarded = []string{"X-Original-Uri", "X-Original-Method", "X-Original-Host", "Forwarded",
	"X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Server",
	// Other names of the client's address, which an endpoint's
	// client_ip_headers might read.
	"Cf-Connecting-Ip", "True-Client-Ip", "X-Client-Ip", "X-Cluster-Client-Ip", "Fastly-Client-Ip",
	// The refusal goes to the client as it is: never compressed.
	"Accept-Encoding"}

// decide asks Cascade about r with r's own method (a CONNECT as a GET: the
// endpoint is a URL), its body when one was read, and its method, URI,
// host, proto and client in the X-Forwarded-* headers, set (never added to
// a client's).
func (c *Cascade) decide(r *http.Request, body []byte) (*http.Response, error) {
	method := r.Method
	if method == http.MethodConnect {
		method = http.MethodGet
	}
	var rd io.Reader
	if len(body) > 0 {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(r.Context(), method, c.cfg.Endpoint, rd)
	if err != nil {
		return nil, fmt.Errorf("asking %s: %w", c.cfg.Endpoint, err)
	}
	copyHeaders(req.Header, r.Header)
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	for _, h := range clientForwarded {
		req.Header.Del(h)
	}
	req.Header.Set("X-Forwarded-Method", r.Method)
	req.Header.Set("X-Forwarded-Uri", r.URL.RequestURI())
	req.Header.Set("X-Forwarded-Host", r.Host)
	req.Header.Set("X-Forwarded-Proto", proto)
	client := c.clientIP(r)
	req.Header.Set("X-Forwarded-For", client)
	req.Header.Set("X-Real-Ip", client)
	return c.client.Do(req)
}

// clientIP is the address of r's client: its peer's, or, when the peer is
// one of TrustedIPs, the right-most address of X-Forwarded-For that is not
// (the left-most when all are), so that a client can name itself only to
// the left of what trusted proxies appended, where it is not read.
func (c *Cascade) clientIP(r *http.Request) string {
	ip := r.RemoteAddr
	if host, _, err := net.SplitHostPort(ip); err == nil {
		ip = host
	}
	if !c.trusts(ip) {
		return ip
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(v, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		hop := strings.TrimSpace(hops[i])
		if host, _, err := net.SplitHostPort(hop); err == nil {
			hop = host
		}
		if net.ParseIP(hop) == nil {
			break // not an address: the trusted proxy right of it is the client
		}
		ip = hop
		if !c.trusts(hop) {
			break
		}
	}
	return ip
}

// trusts tells whether ip is one of TrustedIPs.
func (c *Cascade) trusts(ip string) bool {
	parsed := net.ParseIP(ip)
	if parsed == nil {
		return false
	}
	for _, n := range c.trusted {
		if n.Contains(parsed) {
			return true
		}
	}
	return false
}

// refuse answers the client with Cascade's refusal res: its status, its
// problem+json body, and of its headers only Retry-After and the
// rate-limit families (nothing of the endpoint's own: Server,
// Cascade-Decision). An answer that is not Cascade's problem is an error:
// the endpoint is not Cascade's decision endpoint, or a proxy between
// failed.
func (c *Cascade) refuse(w http.ResponseWriter, res *http.Response) error {
	if mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); mt != "application/problem+json" {
		return fmt.Errorf("%s answered %s, not a decision", c.cfg.Endpoint, res.Status)
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, maxProblemBytes+1))
	if err != nil {
		return fmt.Errorf("reading the refusal of %s: %w", c.cfg.Endpoint, err)
	}
	if len(body) > maxProblemBytes {
		return fmt.Errorf("%s answered %s with a body over %d bytes, not a decision", c.cfg.Endpoint, res.Status, maxProblemBytes)
	}
	h := w.Header()
	for k, vs := range rateLimitHeaders(res.Header) {
		h[k] = vs
	}
	// How long to wait, whether to retry at all, and the request's id, as
	// the LLM providers' SDKs read them.
	for _, k := range []string{"Retry-After", "Retry-After-Ms", "X-Should-Retry", "X-Request-Id", "Request-Id"} {
		if v := res.Header.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(res.StatusCode)
	_, _ = w.Write(body)
	return nil
}

// writeProblem answers a problem+json of the plugin's own, of type
// problemBase+kind.
func writeProblem(w http.ResponseWriter, status int, kind, detail string) {
	body := fmt.Sprintf(`{"type":%q,"title":%q,"status":%d,"detail":%q}`,
		problemBase+kind, http.StatusText(status), status, detail)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// report sends the kept response body to the report endpoint in the
// background: no response waits for it. At most maxReports are in flight;
// past that a report is dropped and its decision keeps its estimate.
func (c *Cascade) report(id string, rw *responseWriter) {
	// Read now: the writer's header is Traefik's until ServeHTTP returns.
	hdr := http.Header{}
	hdr.Set(decisionHeader, id)
	hdr.Set("Content-Type", rw.ResponseWriter.Header().Get("Content-Type"))
	if enc := rw.ResponseWriter.Header().Get("Content-Encoding"); enc != "" {
		hdr.Set("Content-Encoding", enc)
	}
	body := rw.body()
	select {
	case c.reports <- struct{}{}:
	default:
		c.memory.Add(rw.keep)
		c.logf("report of decision %s dropped: %d reports in flight already", id, maxReports)
		return
	}
	go func() {
		defer func() { <-c.reports; c.memory.Add(rw.keep) }()
		req, err := http.NewRequest(http.MethodPost, c.cfg.ReportEndpoint, bytes.NewReader(body))
		if err != nil {
			c.logf("report of decision %s: %v", id, err)
			return
		}
		req.Header = hdr
		res, err := c.reporter.Do(req)
		if err != nil {
			c.logf("report of decision %s: %v", id, err)
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<16))
		res.Body.Close()
		if res.StatusCode/100 != 2 {
			c.logf("report of decision %s: %s answered %s", id, c.cfg.ReportEndpoint, res.Status)
		}
	}()
}

// logf writes to standard error, Traefik's, at most once every 10 s: a
// failing endpoint fails every request.
func (c *Cascade) logf(format string, args ...any) {
	now, last := time.Now().UnixNano(), c.logged.Load()
	if now-last < int64(10*time.Second) || !c.logged.CompareAndSwap(last, now) {
		return
	}
	fmt.Fprintf(os.Stderr, "cascade plugin %s: %s\n", c.name, fmt.Sprintf(format, args...))
}

func copyHeaders(dst, src http.Header) {
	for k, vs := range src {
		if hopHeaders[http.CanonicalHeaderKey(k)] {
			continue
		}
		for _, v := range vs {
			dst.Add(k, v)
		}
	}
}

// upgrading tells whether a request asks to switch protocols (a WebSocket):
// Connection names "upgrade" and Upgrade says to what.
func upgrading(h http.Header) bool {
	if h.Get("Upgrade") == "" {
		return false
	}
	for _, v := range h.Values("Connection") {
		for _, token := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(token), "upgrade") {
				return true
			}
		}
	}
	return false
}

// rateLimitHeaders are the headers of an admitting decision to add to the
// response: the rate-limit families.
func rateLimitHeaders(h http.Header) http.Header {
	out := http.Header{}
	for k, vs := range h {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "ratelimit") || strings.HasPrefix(lk, "x-ratelimit-") || strings.HasPrefix(lk, "anthropic-ratelimit-") {
			out[k] = vs
		}
	}
	return out
}

// responseWriter adds the rate-limit headers to the upstream's response,
// flushes it when it streams, and keeps its body for a report.
type responseWriter struct {
	http.ResponseWriter
	add   http.Header
	wrote bool
	flush bool  // flush each write (see WriteHeader)
	keep  int64 // the most to keep; 0: keep nothing
	kept  bytes.Buffer
	// An event stream, not encoded, keeps its head (where Anthropic's
	// message_start reports the input tokens) and its tail (where the
	// last usage is), up to keep in all, as whole events.
	tail     bool
	head     []byte // the stream's first events, when it is longer than keep
	cut      bool   // events between head and kept were not kept
	overflow bool   // a body too long to report
}

// headShare is the part of keep an event stream's head may take.
const headShare = 4

func (w *responseWriter) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		w.ResponseWriter.WriteHeader(code) // informational: the response is to come
		return
	}
	if !w.wrote {
		w.wrote = true
		h := w.ResponseWriter.Header()
		for k, vs := range w.add {
			h[k] = vs
		}
		mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
		enc := h.Get("Content-Encoding")
		// As Go's reverse proxy, which would flush these itself and cannot
		// through Yaegi's wrapper: an event stream, or a body of unknown
		// length.
		w.flush = mt == "text/event-stream" || h.Get("Content-Length") == ""
		// The tail of an encoded stream cannot be decoded.
		w.tail = mt == "text/event-stream" && (enc == "" || enc == "identity")
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.keep > 0 && !w.overflow {
		w.kept.Write(b)
		if over := int64(len(w.head)+w.kept.Len()) - w.keep; over > 0 {
			if !w.tail {
				w.overflow, w.kept = true, bytes.Buffer{}
			} else {
				if w.head == nil {
					// The first events, whole, up to a share of keep.
					start := w.kept.Bytes()
					if n := w.keep / headShare; int64(len(start)) > n { // no min: Yaegi lacks it
						start = start[:n]
					}
					end := bytes.LastIndex(start, []byte("\n\n"))
					w.head = append([]byte{}, start[:end+2]...) // end -1: no whole event; head is then empty, not nil
					w.kept.Next(len(w.head))
					over = int64(len(w.head)+w.kept.Len()) - w.keep
				}
				if over > 0 {
					w.kept.Next(int(over)) // the tail, where the last usage is
					w.cut = true
				}
			}
		}
	}
	n, err := w.ResponseWriter.Write(b)
	if err == nil && w.flush {
		w.Flush()
	}
	return n, err
}

// body is what to report: what was kept, and of a long event stream its
// head and the whole events of its tail.
func (w *responseWriter) body() []byte {
	if !w.cut {
		return append(w.head, w.kept.Bytes()...)
	}
	tail := w.kept.Bytes()
	if i := bytes.Index(tail, []byte("\n\n")); i >= 0 {
		tail = tail[i+2:] // the first event was cut
	}
	return append(w.head, tail...)
}

// Flush sends what was written to the client: Traefik's writer, a compiled
// value, offers Flush to the plugin even though the plugin's writer cannot
// offer it to Traefik's proxy.
func (w *responseWriter) Flush() {
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}
