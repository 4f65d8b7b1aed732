package entitle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// HTTPOptions configure an HTTP source.
type HTTPOptions struct {
	// Client makes the requests; nil is a client of the source's own with
	// bounded dial, TLS handshake, response header and overall times.
	Client *http.Client
	// Header is sent with every request (an Authorization for the billing
	// service, say).
	Header http.Header
}

// maxBody is the most of a response body an HTTP source reads.
const maxBody = 1 << 20

// HTTP is a Source that GETs each value's entry from a service: 200 with a
// JSON object is the entry, 404 a negative answer, anything else a
// failure.
type HTTP struct {
	template string // the URL, {value} where the value goes
	path     string // the template before its '?': a value there is path-escaped
	query    string // after it: a value there is query-escaped
	client   *http.Client
	owned    bool // client is the source's own: Close closes its connections
	header   http.Header
}

// NewHTTP returns a Source that GETs urlTemplate with {value} replaced by
// the value, escaped for where it goes: in the path ("https://billing.
// internal/orgs/{value}/plan") path-escaped — "." and ".." are no value —
// in the query ("…/plan?org={value}") query-escaped. The template must be
// an http or https URL with a host, without {value} in its host or a
// fragment. Redirects are not followed.
func NewHTTP(urlTemplate string, opts HTTPOptions) (*HTTP, error) {
	if !strings.Contains(urlTemplate, valuePlaceholder) {
		return nil, fmt.Errorf("entitle: URL template %q: say where the value goes with %s, as in \"https://billing.internal/orgs/%s\"",
			urlTemplate, valuePlaceholder, valuePlaceholder)
	}
	u, err := url.Parse(strings.ReplaceAll(urlTemplate, valuePlaceholder, "value"))
	if err != nil {
		return nil, fmt.Errorf("entitle: URL template %q: %w", urlTemplate, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("entitle: URL template %q: want an http:// or https:// URL", urlTemplate)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("entitle: URL template %q: the URL has no host", urlTemplate)
	}
	path, query, _ := strings.Cut(urlTemplate, "?")
	if strings.Contains(query, "#") || strings.Contains(path, "#") {
		return nil, fmt.Errorf("entitle: URL template %q: no fragment: the value goes in the path or the query", urlTemplate)
	}
	if i := strings.Index(path, "://"); i >= 0 && strings.Contains(strings.SplitN(path[i+3:], "/", 2)[0], valuePlaceholder) {
		return nil, fmt.Errorf("entitle: URL template %q: the value goes in the path or the query, not the host", urlTemplate)
	}
	h := &HTTP{template: urlTemplate, path: path, query: query, client: opts.Client, header: opts.Header.Clone()}
	if h.client == nil {
		h.client, h.owned = defaultClient(), true
	}
	return h, nil
}

// defaultClient is a client whose every step is bounded, for a service on
// the request path. A Cache bounds each lookup more tightly still.
func defaultClient() *http.Client {
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: 10 * time.Second,
		MaxConnsPerHost:       64, // as many as a Cache's lookups in flight
	}
	// No redirects: an entitlement is at its URL, and a redirect would
	// carry the source's credentials (its Header) elsewhere.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &http.Client{Transport: t, Timeout: 30 * time.Second, CheckRedirect: noRedirect}
}

// target is the URL of value's entry: the value escaped where it goes
// ("" for a value that would name another path: "." or "..").
func (h *HTTP) target(value string) string {
	if value == "." || value == ".." {
		return ""
	}
	t := strings.ReplaceAll(h.path, valuePlaceholder, url.PathEscape(value))
	if h.query != "" {
		t += "?" + strings.ReplaceAll(h.query, valuePlaceholder, url.QueryEscape(value))
	}
	return t
}

// Lookup GETs value's entry.
func (h *HTTP) Lookup(ctx context.Context, value string) (Entitlement, bool, error) {
	target := h.target(value)
	if target == "" {
		return Entitlement{}, false, nil // no such value
	}
	// Errors name the template, not the URL: a value may be a secret (an
	// API key), and errors reach the logs.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return Entitlement{}, false, fmt.Errorf("entitle: GET %s: the value makes no URL", h.template)
	}
	for name, values := range h.header {
		req.Header[name] = values
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // it names the URL
		}
		return Entitlement{}, false, fmt.Errorf("entitle: GET %s: %w", h.template, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return Entitlement{}, false, nil
	case resp.StatusCode != http.StatusOK:
		return Entitlement{}, false, fmt.Errorf("entitle: GET %s: status %s", h.template, resp.Status)
	case err != nil:
		return Entitlement{}, false, fmt.Errorf("entitle: GET %s: reading the body: %w", h.template, err)
	case len(body) > maxBody:
		return Entitlement{}, false, fmt.Errorf("entitle: GET %s: the body is over %d bytes", h.template, maxBody)
	}
	e, err := parseEntry(body)
	if err != nil {
		return Entitlement{}, false, fmt.Errorf("entitle: GET %s: %w", h.template, err)
	}
	return e, true, nil
}

// Close closes the idle connections of the source's own client (not of
// one given in HTTPOptions).
func (h *HTTP) Close() error {
	if h.owned {
		h.client.CloseIdleConnections()
	}
	return nil
}
