// Package traefik is a Traefik middleware plugin that has Cascade decide
// every request: exact, hierarchical, cost-weighted rate limits shared by
// every proxy in front of an API.
//
// For each request it asks Cascade's decision endpoint (a Caddy running
// Cascade) with the request's method, URI, host and client address in the
// X-Forwarded-* headers, its own headers, and optionally its body (for LLM
// or GraphQL costs). A 2xx answer admits the request: the plugin passes it
// on and adds the rate-limit headers Cascade returned to the response
// (which Traefik's ForwardAuth cannot do). Any other answer is the refusal
// (429 with Retry-After and a problem+json body, or 503): the plugin sends
// it to the client as it is. When Cascade names the decision
// (Cascade-Decision) and a report endpoint is configured, the plugin keeps
// the upstream's response body (bounded) and reports it after the
// response, so that Cascade reconciles the charge with the usage the
// upstream reports (LLM tokens).
//
// Cascade believes those forwarded headers only from the peers its server
// trusts (Caddy's trusted_proxies) and refuses anyone else (403): bind the
// decision endpoint to loopback, or to an address only Traefik reaches, and
// list Traefik's address in trusted_proxies. The plugin overwrites every
// forwarded header a client could send (the URI, method, host and proto
// Cascade reads, and removes the others: X-Original-URI, Forwarded, ...).
// The client's address is appended to the X-Forwarded-For Traefik kept,
// which Traefik empties for a client its entryPoint does not trust
// (forwardedHeaders.trustedIPs); Caddy takes the client from it as its
// client_ip_headers and trusted_proxies say.
//
// It uses the standard library only: Traefik interprets plugins with Yaegi.
package traefik

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
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
	// SendBody sends the request's body (up to MaxBodyBytes) with the
	// decision, for costs read from it; the upstream still gets all of it.
	SendBody     bool  `json:"sendBody,omitempty"`
	MaxBodyBytes int64 `json:"maxBodyBytes,omitempty"`
	// MaxReportBytes bounds the response body kept for a report (default
	// 1 MiB): a JSON body longer than that is not reported; of an event
	// stream the last MaxReportBytes are, where the final usage is.
	MaxReportBytes int64 `json:"maxReportBytes,omitempty"`
}

// CreateConfig returns the default configuration.
func CreateConfig() *Config {
	return &Config{Timeout: "250ms", MaxBodyBytes: 1 << 20, MaxReportBytes: 1 << 20}
}

// Cascade is the middleware.
type Cascade struct {
	next    http.Handler
	name    string
	cfg     Config
	timeout time.Duration
	client  *http.Client
}

// New creates the middleware.
func New(_ context.Context, next http.Handler, cfg *Config, name string) (http.Handler, error) {
	if cfg.Endpoint == "" {
		return nil, fmt.Errorf("cascade: endpoint is required: the URL of Cascade's decision endpoint, e.g. http://cascade:8080/decide")
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
	return &Cascade{next: next, name: name, cfg: *cfg, timeout: timeout,
		client: &http.Client{Transport: transport, Timeout: timeout}}, nil
}

// hopHeaders are not forwarded in either direction.
var hopHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
}

// decisionHeader names the decision for a report.
const decisionHeader = "Cascade-Decision"

func (c *Cascade) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body []byte
	if c.cfg.SendBody && r.Body != nil && r.Body != http.NoBody {
		// Read up to the limit, then give the upstream the whole body:
		// what was read, followed by the rest.
		b, err := io.ReadAll(io.LimitReader(r.Body, c.cfg.MaxBodyBytes))
		if err != nil {
			http.Error(w, "cascade: reading the request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		body = b
		r.Body = readCloser{io.MultiReader(bytes.NewReader(b), r.Body), r.Body}
	}
	res, err := c.decide(r, body)
	if err != nil {
		if c.cfg.FailOpen {
			c.next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Retry-After", "1")
		http.Error(w, "rate limit unavailable: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		copyHeaders(w.Header(), res.Header)
		w.WriteHeader(res.StatusCode)
		_, _ = io.Copy(w, io.LimitReader(res.Body, 1<<20))
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20)) // reuse the connection
	id := res.Header.Get(decisionHeader)
	rw := &responseWriter{ResponseWriter: w, add: rateLimitHeaders(res.Header)}
	if id != "" && c.cfg.ReportEndpoint != "" {
		rw.keep = c.cfg.MaxReportBytes
	}
	c.next.ServeHTTP(rw, r)
	if rw.keep > 0 && !rw.overflow {
		c.report(id, rw)
	}
}

// clientForwarded are the headers describing a forwarded request that the
// plugin does not set: a client's copies are removed, so that only the
// plugin's say which request Cascade decides.
var clientForwarded = []string{"X-Original-Uri", "X-Original-Method", "X-Original-Host", "Forwarded",
	"X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Server"}

// decide asks Cascade about r: its method, URI, host and proto in the
// X-Forwarded-* headers, set (never added to a client's).
func (c *Cascade) decide(r *http.Request, body []byte) (*http.Response, error) {
	method := http.MethodGet
	var rd io.Reader
	if body != nil {
		method, rd = http.MethodPost, bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(r.Context(), method, c.cfg.Endpoint, rd)
	if err != nil {
		return nil, err
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
	// The peer Traefik saw, after the addresses Traefik kept (every line).
	ip := r.RemoteAddr
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		ip = host
	}
	if prior := strings.Join(r.Header.Values("X-Forwarded-For"), ", "); prior != "" {
		ip = prior + ", " + ip
	}
	req.Header.Set("X-Forwarded-For", ip)
	return c.client.Do(req)
}

// report sends the kept response body to the report endpoint, in the
// background of nothing: the response has been sent already.
func (c *Cascade) report(id string, rw *responseWriter) {
	req, err := http.NewRequest(http.MethodPost, c.cfg.ReportEndpoint, bytes.NewReader(rw.kept.Bytes()))
	if err != nil {
		return
	}
	req.Header.Set(decisionHeader, id)
	req.Header.Set("Content-Type", rw.Header().Get("Content-Type"))
	res, err := c.client.Do(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<16))
	res.Body.Close()
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

// rateLimitHeaders are the headers of an admitting decision to add to the
// response: the rate-limit families.
func rateLimitHeaders(h http.Header) http.Header {
	out := http.Header{}
	for k, vs := range h {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "ratelimit") || strings.HasPrefix(lk, "x-ratelimit-") {
			out[k] = vs
		}
	}
	return out
}

// readCloser reads what was read ahead, then the rest, and closes the
// original body. Its methods are spelled out: Yaegi, which runs this
// plugin, does not promote the methods of embedded interfaces reliably.
type readCloser struct {
	r io.Reader
	c io.Closer
}

func (rc readCloser) Read(p []byte) (int, error) { return rc.r.Read(p) }
func (rc readCloser) Close() error               { return rc.c.Close() }

// responseWriter adds the rate-limit headers to the upstream's response and
// keeps its body for a report.
type responseWriter struct {
	http.ResponseWriter
	add      http.Header
	wrote    bool
	keep     int64 // the most to keep; 0: keep nothing
	kept     bytes.Buffer
	stream   bool // an event stream: keep its tail
	overflow bool // a body too long to report
}

func (w *responseWriter) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		for k, vs := range w.add {
			w.ResponseWriter.Header()[k] = vs
		}
		w.stream = strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream")
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if w.keep > 0 && !w.overflow {
		w.kept.Write(b)
		if over := int64(w.kept.Len()) - w.keep; over > 0 {
			if w.stream {
				w.kept.Next(int(over)) // the tail, where the last usage is
			} else {
				w.overflow, w.kept = true, bytes.Buffer{}
			}
		}
	}
	return w.ResponseWriter.Write(b)
}

// Flush lets streams through as they come.
func (w *responseWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
