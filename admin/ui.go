package admin

import (
	"embed"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddy-cascade/cascade/adaptive"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/storeconfig"
)

// The status page, GET /rate_limit/ui: a page embedded in the binary that
// reads the API's JSON routes every few seconds and shows them. It is
// served by this module, and so behind the admin endpoint's access control
// like every other route. Its script and style are routes of their own
// (ui/app.js, ui/app.css) so that its Content-Security-Policy allows no
// inline code; the script builds the page with text nodes only.
//
// Caddy's admin endpoint refuses a browser's request that carries
// Sec-Fetch-Mode but no Origin or Referer of an allowed origin
// (caddyserver/caddy#7633), which is what a navigation to a typed address
// sends: the page opens when its navigation carries the admin endpoint's
// origin as Referer (a proxy in front of the endpoint may set it). Once
// open, its own requests pass: they carry its address as Referer
// (Referrer-Policy same-origin) and are made in cors mode (a module
// script, a crossorigin stylesheet, fetch). A no-cors request (a classic
// script, a plain stylesheet, /favicon.ico) would be refused.

//go:embed ui
var uiFiles embed.FS

// uiCSP lets the page load its script and style from the admin endpoint
// and call it, and nothing else: no inline code, no frames, no forms.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// uiAssets are the files under /rate_limit/ui/, by name, with their type.
var uiAssets = map[string]string{
	"app.js":  "text/javascript; charset=utf-8",
	"app.css": "text/css; charset=utf-8",
}

func handleUI(w http.ResponseWriter, r *http.Request) error {
	if err := method(r, http.MethodGet); err != nil {
		return err
	}
	return serveUIFile(w, "index.html", "text/html; charset=utf-8")
}

func handleUIAsset(w http.ResponseWriter, r *http.Request) error {
	if err := method(r, http.MethodGet); err != nil {
		return err
	}
	name := strings.TrimPrefix(r.URL.Path, "/rate_limit/ui/")
	typ, ok := uiAssets[name]
	if !ok {
		return apiError(http.StatusNotFound, "no %s: the status page is /rate_limit/ui", r.URL.Path)
	}
	return serveUIFile(w, name, typ)
}

func serveUIFile(w http.ResponseWriter, name, typ string) error {
	body, err := uiFiles.ReadFile("ui/" + name)
	if err != nil {
		return err // embedded: cannot fail
	}
	h := w.Header()
	h.Set("Content-Type", typ)
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "same-origin")
	_, err = w.Write(body)
	return err
}

// Status is the answer of GET /rate_limit/status: the state of the stores
// and adaptive controllers of the running configuration, as the metrics
// export it (cascade_store_*, cascade_lease_*, cascade_adaptive_*).
type Status struct {
	Stores   []StoreStatus    `json:"stores"`
	Adaptive []AdaptiveStatus `json:"adaptive"`
}

// StoreStatus is the state of one store.
type StoreStatus struct {
	Name string `json:"name"`
	Kind string `json:"kind"` // "memory" or "redis"
	// Trees are the trees deciding on the store (a route's tenants'
	// trees included).
	Trees []string `json:"trees"`
	// Keys and Evictions are a memory store's buckets held and evicted.
	Keys      *int64 `json:"keys,omitempty"`
	Evictions *int64 `json:"evictions,omitempty"`
	// Breakers are a Redis store's circuit breakers: none when it has
	// none, else one, or one per master of a Cluster.
	Breakers []Breaker `json:"breakers,omitempty"`
	// Instances is how many Caddy instances share a Redis store, when
	// counted (on_store_error local).
	Instances *int64 `json:"instances,omitempty"`
	// Lease is the counts of a Redis store with leases.
	Lease *LeaseStatus `json:"lease,omitempty"`
}

// Breaker is the state of one master's circuit breaker: while Open, calls
// to it fail at once. Trips counts the times it opened.
type Breaker struct {
	Node  string `json:"node"`
	Open  bool   `json:"open"`
	Trips int64  `json:"trips"`
}

// LeaseStatus is the counts of a store with leases since it was opened
// (see lease.Stats).
type LeaseStatus struct {
	Local      int64 `json:"local"`
	Grants     int64 `json:"grants"`
	Leased     int64 `json:"leased"`
	Strict     int64 `json:"strict"`
	Released   int64 `json:"released"`
	Renewals   int64 `json:"renewals"`
	PeerResets int64 `json:"peer_resets"`
}

// AdaptiveStatus is one adaptive controller as of its last sample.
type AdaptiveStatus struct {
	At    time.Time `json:"at"`
	Level string    `json:"level"`
	// Factor scales the limits of adaptive tiers; Floor is the lowest it
	// goes. SharedFactor is set when a factor shared through Redis is
	// fresh enough to count.
	Factor       float64  `json:"factor"`
	LocalFactor  float64  `json:"local_factor"`
	SharedFactor *float64 `json:"shared_factor,omitempty"`
	Floor        float64  `json:"floor"`
	Requests     uint64   `json:"requests"`
	// Trees are the trees with an adaptive tier, each with its traffic
	// class's factor.
	Trees   []AdaptiveTree `json:"trees"`
	Signals []SignalStatus `json:"signals"`
}

// AdaptiveTree is a tree scaled by a controller.
type AdaptiveTree struct {
	Tree     string  `json:"tree"`
	Priority string  `json:"priority"`
	Factor   float64 `json:"factor"`
}

// SignalStatus is one signal's last reading: Value in Unit, and its
// Pressure against the thresholds (below 0 healthy, from 1 critical).
type SignalStatus struct {
	Name     string  `json:"name"`
	Unit     string  `json:"unit,omitempty"`
	Value    float64 `json:"value"`
	Measured bool    `json:"measured"`
	Counts   bool    `json:"counts"`
	Pressure float64 `json:"pressure"`
	Error    string  `json:"error,omitempty"`
}

func handleStatus(w http.ResponseWriter, r *http.Request) error {
	if err := method(r, http.MethodGet); err != nil {
		return err
	}
	all := active()
	return writeJSON(w, Status{Stores: storeStatus(all), Adaptive: adaptiveStatus(all)})
}

// storeStatus describes the pooled stores that the engines decide on.
func storeStatus(es []*engine.Engine) []StoreStatus {
	out := []StoreStatus{}
	storeconfig.Each(func(_ string, p storeconfig.Pooled) bool {
		var trees []string
		for _, e := range es {
			uses := e.Config().Store == p.Store
			for _, rt := range e.Config().Routes {
				uses = uses || rt.Store == p.Store
			}
			if uses {
				trees = addTrees(trees, e, false)
			}
		}
		if trees == nil {
			return true // another configuration's
		}
		st := StoreStatus{Name: p.Name, Kind: "memory", Trees: trees}
		if m, ok := p.Store.(*store.Memory); ok {
			keys, evictions := int64(m.Len()), m.Evictions()
			st.Keys, st.Evictions = &keys, &evictions
		}
		if p.Redis != nil {
			st.Kind = "redis"
			for _, b := range p.Redis.Breakers() {
				st.Breakers = append(st.Breakers, Breaker{Node: b.Node, Open: b.Open, Trips: b.Trips})
			}
		}
		if pr := p.Presence; pr != nil && pr.Started() {
			n := pr.Count()
			st.Instances = &n
		}
		if l := p.Lease; l != nil {
			s := l.Stats()
			st.Lease = &LeaseStatus{Local: s.Local, Grants: s.Grants, Leased: s.Leased, Strict: s.Strict,
				Released: s.Released, Renewals: s.Renewals, PeerResets: s.PeerResets}
		}
		out = append(out, st)
		return true
	})
	slices.SortFunc(out, func(a, b StoreStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// addTrees adds the names of e's trees to names, once each; with
// adaptive, only the trees that have an adaptive tier.
func addTrees(names []string, e *engine.Engine, adaptiveOnly bool) []string {
	if names == nil {
		names = []string{}
	}
	for _, t := range e.Config().Trees {
		if adaptiveOnly && !slices.ContainsFunc(t.Tiers, func(tier *hierarchy.Tier) bool { return tier.Adaptive }) {
			continue
		}
		if !slices.Contains(names, t.Name) {
			names = append(names, t.Name)
		}
	}
	return names
}

// adaptiveStatus describes the controllers the engines scale by.
func adaptiveStatus(es []*engine.Engine) []AdaptiveStatus {
	out := []AdaptiveStatus{}
	var seen []*adaptive.Controller
	for _, e := range es {
		c := e.Config().Controller
		if c == nil || slices.Contains(seen, c) {
			continue
		}
		seen = append(seen, c)
		s := c.Status()
		as := AdaptiveStatus{At: s.At, Level: s.Level.String(), Factor: finite(s.Factor), LocalFactor: finite(s.LocalFactor),
			Floor: c.Config().Floor, Requests: s.Requests, Trees: []AdaptiveTree{}}
		if s.Shared {
			shared := finite(s.SharedFactor)
			as.SharedFactor = &shared
		}
		for _, other := range es {
			if other.Config().Controller != c {
				continue
			}
			p := other.Config().Priority
			for _, name := range addTrees(nil, other, true) {
				at := AdaptiveTree{Tree: name, Priority: p.String(), Factor: finite(c.FactorFor(p))}
				if !slices.Contains(as.Trees, at) {
					as.Trees = append(as.Trees, at)
				}
			}
		}
		as.Signals = []SignalStatus{
			signalOf("cpu", "%", s.CPU, nil), signalOf("memory", "%", s.Memory, nil),
			signalOf("latency_p99", "s", s.LatencyP99, nil), signalOf("error_rate", "%", s.ErrorRate, nil),
		}
		for _, ext := range s.Signals {
			as.Signals = append(as.Signals, signalOf(ext.Name, "", ext.Signal, ext.Err))
		}
		out = append(out, as)
	}
	return out
}

func signalOf(name, unit string, s adaptive.Signal, err error) SignalStatus {
	out := SignalStatus{Name: name, Unit: unit, Value: finite(s.Value), Measured: s.Measured, Counts: s.Counts, Pressure: finite(s.Pressure)}
	if err != nil {
		out.Error = err.Error()
	}
	return out
}

// finite is f, or 0 for what JSON cannot hold (an unmeasured signal's
// reading may be NaN).
func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}
