package cascade

// `caddy rate-limit simulate`: the rate_limit handlers of a configuration,
// provisioned on memory stores that run on a simulated clock, deciding
// the requests of access logs at their logged times (package simulate
// reads the logs and writes the report).

import (
	"container/heap"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/simulate"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/storeconfig"
)

// simBodySize is the header through which a simulated request gives its
// logged body size to a body_size cost (rewritten to read it).
const simBodySize = "Cascade-Simulated-Body-Size"

// simulation is one configuration's rate_limit handlers on simulated
// stores: a simulate.Decider. Its clock is the time of the request being
// decided.
type simulation struct {
	ctx      caddy.Context
	cancel   context.CancelFunc
	now      *atomic.Int64 // µs since the Unix epoch
	stores   map[string]*store.Memory
	servers  []*simServer
	handlers []*simHandler
	notes    []string // said of the configuration, once
	redacted map[string]int64
	cur      *simulate.Request // the request being decided
	inFlight inFlightHeap      // the decided requests holding a slot or record until their logged end
	mutates  bool              // a handler run before a rate_limit handler may change the request's header
	server   *caddyhttp.Server // the server of every request: one that is not shutting down
	// host is the Host of the requests logged without one (--host);
	// noHost counts them, byHost says a route matches on the host.
	host   string
	noHost int64
	byHost bool
	// maxInFlight bounds inFlight (a log may say every request ran for
	// days): past it, the request that ends first is ended at once,
	// counted in endedEarly.
	maxInFlight int
	endedEarly  int64
	// panics counts the requests whose handlers or matchers panicked,
	// panicked says where the first did.
	panics   int64
	panicked string
}

// simServer is one HTTP server of the configuration.
type simServer struct {
	name   string
	ports  []caddy.NetworkAddress
	routes []*simRoute
}

// simRoute is a route: its matchers, and its handlers in order.
type simRoute struct {
	matchers caddyhttp.MatcherSets
	group    string
	terminal bool
	handlers []*simStep
}

// simStep is one handler of a route, as the simulation runs it: a
// subroute's routes, a rate_limit handler, a handler that changes the
// request (run for real, with a next that takes the request over), or
// one that ends the chain (answers without calling next).
type simStep struct {
	routes []*simRoute
	rl     *simHandler
	mw     caddyhttp.MiddlewareHandler
	ends   bool
}

// simHandler is a rate_limit handler and what the simulation counts of it.
type simHandler struct {
	h         *Handler
	label     string
	decided   int64
	defaulted []string // costs charged their default: what the note says of each
	held      endHeap  // when the requests max_wait holds are released (µs)
}

// Handlers run as they are, before a rate_limit handler, for what they do
// to the request: its variables, URI and headers, which keys and matchers
// may read.
var simMiddleware = []string{"vars", "map", "rewrite", "headers"}

// Handlers that answer the request without calling the next one.
var simEnds = []string{"static_response", "reverse_proxy", "file_server", "error", "copy_response", "acme_server", "php_fastcgi"}

// newSimulation provisions the rate_limit handlers of a configuration (Caddy
// JSON) for simulation.
// errNotJSON says a configuration given without an adapter is not JSON.
var errNotJSON = errors.New("reading the configuration as Caddy's JSON")

func newSimulation(cfgJSON []byte) (*simulation, error) {
	var cfg struct {
		Apps struct {
			HTTP *struct {
				Servers map[string]*struct {
					Listen []string            `json:"listen"`
					Routes caddyhttp.RouteList `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotJSON, err)
	}
	if cfg.Apps.HTTP == nil || len(cfg.Apps.HTTP.Servers) == 0 {
		return nil, errors.New("the configuration has no HTTP server: nothing to simulate")
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	s := &simulation{ctx: ctx, cancel: cancel, now: new(atomic.Int64), stores: map[string]*store.Memory{}, redacted: map[string]int64{},
		maxInFlight: defaultMaxInFlight, server: new(caddyhttp.Server)}
	names := make([]string, 0, len(cfg.Apps.HTTP.Servers))
	for name := range cfg.Apps.HTTP.Servers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		srv := cfg.Apps.HTTP.Servers[name]
		ss := &simServer{name: name}
		for _, l := range srv.Listen {
			if a, err := caddy.ParseNetworkAddress(l); err == nil {
				ss.ports = append(ss.ports, a)
			}
		}
		routes, err := s.routes(srv.Routes, name)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("server %s: %w", name, err)
		}
		ss.routes = routes
		s.servers = append(s.servers, ss)
	}
	if len(s.handlers) == 0 {
		s.Close()
		return nil, errors.New("the configuration has no rate_limit handler: nothing to simulate")
	}
	return s, nil
}

// routes provisions a list of routes for simulation.
func (s *simulation) routes(list caddyhttp.RouteList, server string) ([]*simRoute, error) {
	var out []*simRoute
	for i := range list {
		rt := &list[i]
		for _, set := range rt.MatcherSetsRaw { // before provisioning, which drops them
			_, byHost := set["host"]
			s.byHost = s.byHost || byHost
		}
		if err := rt.ProvisionMatchers(s.ctx); err != nil {
			return nil, fmt.Errorf("route %d: %w", i, err)
		}
		sr := &simRoute{matchers: rt.MatcherSets, group: rt.Group, terminal: rt.Terminal}
		for j, raw := range rt.HandlersRaw {
			step, err := s.step(raw, server)
			if err != nil {
				return nil, fmt.Errorf("route %d, handler %d: %w", i, j, err)
			}
			sr.handlers = append(sr.handlers, step)
		}
		out = append(out, sr)
	}
	return out, nil
}

// step provisions one handler of a route for simulation.
func (s *simulation) step(raw json.RawMessage, server string) (*simStep, error) {
	var kind struct {
		Handler string              `json:"handler"`
		Routes  caddyhttp.RouteList `json:"routes"`
	}
	if err := json.Unmarshal(raw, &kind); err != nil {
		return nil, err
	}
	switch {
	case kind.Handler == "subroute":
		routes, err := s.routes(kind.Routes, server)
		return &simStep{routes: routes}, err
	case kind.Handler == "rate_limit":
		sh, err := s.handler(raw, fmt.Sprintf("#%d (%s)", len(s.handlers)+1, server))
		if err != nil {
			return nil, fmt.Errorf("rate_limit #%d: %w", len(s.handlers)+1, err)
		}
		s.handlers = append(s.handlers, sh)
		return &simStep{rl: sh}, nil
	case slices.Contains(simMiddleware, kind.Handler):
		mod, err := s.ctx.LoadModuleByID("http.handlers."+kind.Handler, withoutHandler(raw))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kind.Handler, err)
		}
		s.mutates = true
		return &simStep{mw: mod.(caddyhttp.MiddlewareHandler)}, nil
	case slices.Contains(simEnds, kind.Handler):
		return &simStep{ends: true}, nil
	}
	return &simStep{}, nil // passes the request on as it is
}

// handler provisions a rate_limit handler for simulation: its stores
// become memory stores on the simulated clock, and what a log cannot tell
// (a body, the upstream's health, usage reports) is set aside, each with a
// note.
func (s *simulation) handler(raw json.RawMessage, label string) (*simHandler, error) {
	h := new(Handler)
	if err := caddy.StrictUnmarshalJSON(withoutHandler(raw), h); err != nil {
		return nil, err
	}
	sh := &simHandler{h: h, label: label}
	note := func(format string, args ...any) {
		s.notes = append(s.notes, "rate_limit "+label+": "+fmt.Sprintf(format, args...))
	}
	storeKey, maxKeys := "memory default", 0
	switch st := h.Store; {
	case st != nil && st.Redis != nil:
		addrs, _ := json.Marshal(st.Redis)
		storeKey = "redis " + string(addrs)
	case st != nil && st.Memory != nil:
		storeKey, maxKeys = "memory "+st.Memory.Name, st.Memory.MaxKeys
	}
	// A store of its own in Caddy's pool, which Provision opens and the
	// simulation does not use (so it is as small as a store can be): a
	// running Caddy's stores are not touched.
	h.Store = &StoreConfig{Memory: &storeconfig.Memory{Name: fmt.Sprintf("simulate-%p-%d", s, len(s.handlers)), MaxKeys: 1}}
	if len(h.Routes) > 0 {
		note("its tenants routed to other stores are decided on one simulated store")
	}
	h.Stores, h.Routes, h.OnStoreError, h.LocalInstances = nil, nil, "", 0
	h.DisableMetrics, h.Alerts = true, nil
	adaptive := false
	for _, t := range h.Trees {
		for _, tier := range t.Tiers {
			adaptive = adaptive || tier.Adaptive
			tier.Adaptive = false
		}
	}
	if adaptive {
		note("adaptive tiers are simulated at their full limits (the upstream's health is not in the log)")
		h.ShedAtFloor = false
		if h.MaxWait <= 0 {
			h.Priority = ""
		}
	}
	if h.MaxWait > 0 && h.Priority == "batch" {
		note("its requests held by max_wait are released at their time: a batch request yielding to, or preempted by, interactive ones is not simulated")
	}
	if len(h.FallbackModels) > 0 {
		note("fallback models are not simulated (the model a request asks for is in its body, which the log does not have)")
		h.FallbackModels = nil
	}
	for _, c := range h.Costs {
		sh.simCost(c, note)
	}
	if h.Forwarded != nil {
		note("as a decision endpoint, it decides the logged requests as they are, not the requests they forward")
	}
	if err := h.Provision(s.ctx); err != nil {
		return nil, err
	}
	if h.readsModel {
		note("the keys and matchers that read the model a request asks for ({http.rate_limit.model}) found none: it is in the body, which a log does not have")
	}
	if slices.ContainsFunc(h.trees, func(t *Tree) bool { return t.Concurrent() }) {
		note("a concurrency limit's slot is held for its request's logged duration (a Combined log has none: given back at once)")
	}
	if h.ChargeOn != nil && len(h.ChargeOn.Headers) > 0 {
		note("charge_on reads the response's headers as the log has them (Caddy's resp_headers; none in other formats)")
	}
	if err := h.Validate(); err != nil {
		h.Cleanup()
		return nil, err
	}
	// The engine anew on the simulated store, alone: no runtime state, no
	// logs, no adaptive scale.
	cfg := h.engine.Config()
	h.engine.Close()
	cfg.Store, cfg.StoreName = s.store(storeKey, maxKeys), "simulated"
	cfg.Runtime, cfg.Top, cfg.Routes, cfg.Local, cfg.LocalInstances, cfg.OnError = nil, nil, nil, nil, nil, ""
	cfg.Controller, cfg.Logger, cfg.DenialLog = nil, zap.NewNop(), "off"
	h.engine = engine.New(cfg)
	h.controller, h.logger = nil, zap.NewNop()
	return sh, nil
}

// withoutHandler is a handler's configuration without its "handler" key
// (the module's name, which Caddy strips before decoding it).
func withoutHandler(raw json.RawMessage) json.RawMessage {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return raw // decoding it says what is wrong
	}
	delete(fields, "handler")
	out, _ := json.Marshal(fields)
	return out
}

// simCost rewrites a cost that reads the request's body: body_size reads
// the logged size instead, llm and graphql are charged their default.
func (sh *simHandler) simCost(c *Cost, note func(string, ...any)) {
	c.Reconcile = nil
	switch {
	case c.BodySize:
		c.BodySize, c.Value = false, "{http.request.header."+simBodySize+"}"
		zero := int64(0)
		c.Default = &zero
	case c.LLM != nil || c.GraphQL != nil:
		kind, def := "llm", int64(0)
		if c.LLM != nil {
			def = c.LLM.DefaultCost
		} else {
			kind, def = "graphql", c.GraphQL.DefaultCost
		}
		if c.Default != nil {
			def = *c.Default
		}
		c.LLM, c.GraphQL, c.Pricing, c.Value = nil, nil, nil, strconv.FormatInt(def, 10)
		sh.defaulted = append(sh.defaulted, fmt.Sprintf("cost %s (%s) reads the request body, which a log does not have: each request was charged its default, %d", c.Dimension, kind, def))
	}
}

// store returns the simulated store standing for the store named key.
func (s *simulation) store(key string, maxKeys int) *store.Memory {
	if m := s.stores[key]; m != nil {
		return m
	}
	m := store.NewMemory(store.MemoryOptions{MaxKeys: maxKeys, SweepInterval: -1, Clock: s.now.Load})
	s.stores[key] = m
	return m
}

// Close ends the requests still in flight and releases the handlers and
// stores.
func (s *simulation) Close() {
	s.endUntil(-1)
	for _, sh := range s.handlers {
		_ = sh.h.Cleanup()
	}
	for _, m := range s.stores {
		_ = m.Close()
	}
	s.cancel()
}

// Notes implements simulate.Decider.
func (s *simulation) Notes() []string {
	out := slices.Clone(s.notes)
	for _, sh := range s.handlers {
		for _, d := range sh.defaulted {
			out = append(out, fmt.Sprintf("rate_limit %s: %s (%d requests decided)", sh.label, d, sh.decided))
		}
	}
	if s.noHost > 0 && s.byHost {
		if s.host == "" {
			out = append(out, fmt.Sprintf("%d requests were logged without their Host (the Common and Combined Log Formats have none): the routes that match a host never matched them; give --host", s.noHost))
		} else {
			out = append(out, fmt.Sprintf("%d requests were logged without their Host: they were given %s (--host)", s.noHost, s.host))
		}
	}
	if s.panics > 0 {
		out = append(out, fmt.Sprintf("%d requests made a handler or matcher panic (Caddy answers them 500), the first at %s", s.panics, s.panicked))
	}
	if s.endedEarly > 0 {
		out = append(out, fmt.Sprintf("%d requests were ended before their logged end (their concurrency slots and idempotency records given back early): more than %d were in flight at once",
			s.endedEarly, s.maxInFlight))
	}
	names := make([]string, 0, len(s.redacted))
	for name := range s.redacted {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		out = append(out, fmt.Sprintf("a tier's key reads header %s, logged as REDACTED in %d requests (Caddy hides credentials unless its log has log_credentials): they shared one bucket",
			name, s.redacted[name]))
	}
	return out
}

// Decide implements simulate.Decider: it runs the request through the
// routes of its server, as Caddy would, deciding it in each rate_limit
// handler it reaches, until one refuses it or a handler answers it.
func (s *simulation) Decide(lr *simulate.Request, out *simulate.Outcome) (err error) {
	defer func() {
		// A handler or matcher that panics: Caddy's server recovers and
		// answers 500; the replay goes on.
		if p := recover(); p != nil {
			out.Undecided, out.Refused, err = "panic", false, nil
			if s.panics++; s.panicked == "" {
				s.panicked = fmt.Sprintf("%s:%d: %.200v", lr.File, lr.Line, p)
			}
		}
	}()
	s.endUntil(lr.Time.UnixMicro())
	s.now.Store(lr.Time.UnixMicro())
	s.cur = lr
	host := lr.Host
	if host == "" {
		s.noHost++
		host = s.host
	}
	r, err := simRequest(lr, host, s.mutates, s.server)
	if err != nil {
		out.Undecided = "unreadable_uri"
		return nil
	}
	_, err = s.walk(s.serverOf(lr, host).routes, r, out)
	return err
}

// serverOf is the server that answered a request: the only one, or the
// one listening on the request's port.
func (s *simulation) serverOf(lr *simulate.Request, host string) *simServer {
	if len(s.servers) == 1 {
		return s.servers[0]
	}
	port := uint64(80)
	if lr.TLS {
		port = 443
	}
	if _, p, err := net.SplitHostPort(host); err == nil {
		port, _ = strconv.ParseUint(p, 10, 16)
	}
	for _, srv := range s.servers {
		for _, a := range srv.ports {
			if uint64(a.StartPort) <= port && port <= uint64(a.EndPort) {
				return srv
			}
		}
	}
	return s.servers[0]
}

// simRequest is the request a log line describes, with what Caddy's
// server gives a request before its routes: the replacer, the variables
// (the client's IP as logged), the server. Its header is lr's, or a copy of it when
// private is set: a handler may change it, and the log's request is
// decided by another configuration too (--against).
func simRequest(lr *simulate.Request, host string, private bool, server *caddyhttp.Server) (*http.Request, error) {
	u, err := url.ParseRequestURI(lr.URI)
	if err != nil {
		return nil, err
	}
	proto := lr.Proto
	if proto == "" {
		proto = "HTTP/1.1"
	}
	major, minor, _ := http.ParseHTTPVersion(proto)
	hdr := lr.Header
	if hdr == nil {
		hdr = http.Header{}
	}
	if private {
		hdr = hdr.Clone()
	}
	if lr.BytesRead >= 0 {
		hdr[simBodySize] = []string{strconv.FormatInt(lr.BytesRead, 10)}
	} else {
		delete(hdr, simBodySize) // a logged header of that name is not a body size
	}
	r := &http.Request{Method: lr.Method, URL: u, RequestURI: lr.URI, Proto: proto, ProtoMajor: major, ProtoMinor: minor,
		Header: hdr, Host: host, Body: http.NoBody, ContentLength: max(lr.BytesRead, 0)}
	if lr.TLS {
		r.TLS = &tls.ConnectionState{HandshakeComplete: true}
	}
	r.RemoteAddr = lr.RemoteIP
	if lr.RemotePort != "" {
		r.RemoteAddr = net.JoinHostPort(lr.RemoteIP, lr.RemotePort)
	}
	client := lr.ClientIP
	if client == "" {
		client = lr.RemoteIP
	}
	ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: client})
	ctx = context.WithValue(ctx, caddyhttp.OriginalRequestCtxKey, *r)
	ctx = context.WithValue(ctx, caddyhttp.ServerCtxKey, server) // {http.shutting_down} reads it
	r = r.WithContext(ctx)
	base := caddyhttp.NewTestReplacer(r)
	// The request's time is the log's, for the placeholders that read the
	// clock ({time.now…}, {http.request.duration}): Caddy's replacer asks
	// its global provider, on the wall clock, first.
	now := lr.Time
	if now.Location() == time.UTC {
		now = now.Local() // Caddy's time.Now: the server's zone, this machine's standing for it
	}
	caddyhttp.SetVar(r.Context(), "start_time", now)
	repl := caddy.NewEmptyReplacer()
	repl.Map(func(key string) (any, bool) {
		if v, ok := simNow(key, now); ok {
			return v, true
		}
		return base.Get(key)
	})
	// In place, as NewTestReplacer does: base's placeholders read r, which
	// the handlers before a rate_limit handler may change (rewrite).
	*r = *r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	return r, nil
}

// simNow is what Caddy's global placeholders of the time say at now.
func simNow(key string, now time.Time) (any, bool) {
	switch key {
	case "time.now":
		return now, true
	case "time.now.http":
		return now.UTC().Format(http.TimeFormat), true
	case "time.now.rfc3339":
		return now.Format(time.RFC3339), true
	case "time.now.common_log":
		return now.Format("02/Jan/2006:15:04:05 -0700"), true
	case "time.now.year":
		return strconv.Itoa(now.Year()), true
	case "time.now.unix":
		return strconv.FormatInt(now.Unix(), 10), true
	case "time.now.unix_ms":
		return strconv.FormatInt(now.UnixMilli(), 10), true
	}
	return nil, false
}

// walk runs r through routes as Caddy's compiled routes would; ended is
// true when the chain ended (a handler answered, or a rate_limit handler
// refused), so that no later handler sees the request.
func (s *simulation) walk(routes []*simRoute, r *http.Request, out *simulate.Outcome) (ended bool, err error) {
	var groups []string
	for _, rt := range routes {
		if rt.group != "" && slices.Contains(groups, rt.group) {
			continue
		}
		if len(rt.matchers) > 0 {
			ok, err := rt.matchers.AnyMatchWithError(r)
			if err != nil {
				return true, nil // Caddy answers the matcher's error
			}
			if !ok {
				continue
			}
		}
		if rt.group != "" {
			groups = append(groups, rt.group)
		}
		for _, step := range rt.handlers {
			switch {
			case step.routes != nil:
				if ended, err := s.walk(step.routes, r, out); ended || err != nil {
					return ended, err
				}
			case step.rl != nil:
				if refused, err := s.decide(step.rl, r, out); refused || err != nil {
					return true, err
				}
			case step.mw != nil:
				var next *http.Request
				_ = step.mw.ServeHTTP(discardWriter{}, r, caddyhttp.HandlerFunc(func(_ http.ResponseWriter, nr *http.Request) error {
					next = nr
					return nil
				}))
				if next == nil {
					return true, nil
				}
				r = next
			case step.ends:
				return true, nil
			}
		}
		if rt.terminal {
			return true, nil
		}
	}
	return false, nil
}

// decide decides r in one rate_limit handler, as its ServeHTTP would,
// and adds what its trees did to out; refused is true when the client
// would have been refused.
func (s *simulation) decide(sh *simHandler, r *http.Request, out *simulate.Outcome) (refused bool, err error) {
	h := sh.h
	sh.decided++
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	s.countRedacted(h, r)
	d := new(decision) // it outlives the call when its request holds something until it ends
	status, derr := h.decide(r, repl, d)
	defer s.end(h, d)
	if d.Reason == engine.ReasonStoreError {
		return false, fmt.Errorf("the simulated store failed: %w", h.engine.ShowError(derr, d.Buckets)) // a sensitive value's fingerprint
	}
	if status != 0 {
		if !d.Enforcing {
			return false, nil
		}
		out.Undecided, out.Refused = d.Reason, true
		s.addTrees(sh, d, out)
		return true, nil
	}
	if d.Response != nil && d.Mode != engine.Shadow && (d.Allowed || d.Mode == engine.Warn) {
		// A retry answered with its first request's kept response (see
		// serveDecided), or refused when that response could not be kept.
		s.addTrees(sh, d, out)
		if k, err := decodeKept(d.Response); err != nil || !k.replayable() {
			out.Undecided, out.Refused = "idempotency_not_replayable", true
			return true, nil
		}
		return false, nil
	}
	if d.Allowed && d.Wait > 0 && d.Mode == engine.Enforce && !sh.hold(s.now.Load(), d.Wait, h.MaxQueued) {
		// max_queued requests already held: refused, its reservation
		// given back (waitTurn's queue_full).
		_ = d.Refund(r.Context())
		n := len(out.Trees)
		s.addTrees(sh, d, out)
		for i := n; i < len(out.Trees); i++ {
			out.Trees[i].Wait = 0
		}
		out.Undecided, out.Refused = "queue_full", true
		return true, nil
	}
	s.addTrees(sh, d, out)
	if h.ChargeOn != nil && d.Allowed && len(d.Limits) > 0 {
		// Given back as the response's status is written (chargeWriter),
		// here as the request is decided: the log has no time for it.
		if !h.ChargeOn.Match(s.cur.Status, s.cur.RespHeader) {
			_ = d.RefundServed(r.Context())
		}
	}
	refused = !d.Allowed && d.Mode == engine.Enforce && (d.Buckets != nil || d.Reason == engine.ReasonInFlight)
	out.Refused = out.Refused || refused
	return refused, nil
}

// hold counts a request max_wait holds from now (µs) for wait among the
// handler's held requests; it reports false, counting nothing, when limit
// requests are held already.
func (sh *simHandler) hold(now int64, wait time.Duration, limit int) bool {
	for len(sh.held) > 0 && sh.held[0] <= now {
		heap.Pop(&sh.held)
	}
	if len(sh.held) >= limit {
		return false
	}
	heap.Push(&sh.held, now+wait.Microseconds())
	return true
}

// endHeap is a min-heap of times (µs).
type endHeap []int64

func (q endHeap) Len() int           { return len(q) }
func (q endHeap) Less(i, j int) bool { return q[i] < q[j] }
func (q endHeap) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *endHeap) Push(x any)        { *q = append(*q, x.(int64)) }
func (q *endHeap) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// addTrees adds the outcome of each tree on d's path to out.
func (s *simulation) addTrees(sh *simHandler, d *decision, out *simulate.Outcome) {
	e := sh.h.engine
	decided := len(d.Results) == len(d.Buckets)
	for i := 0; i < len(d.Buckets); {
		tree := d.Buckets[i].Tree
		t := out.Next()
		t.Handler, t.Tree, t.Mode = sh.label, tree.Name, e.Mode(e.Tree(tree.Name))
		boxOnly := true
		j := i
		for ; j < len(d.Buckets) && d.Buckets[j].Tree == tree; j++ {
			b := &d.Buckets[j]
			if n := len(t.Tiers); n == 0 || t.Tiers[n-1] != b.Tier.Name {
				t.Tiers = append(t.Tiers, b.Tier.Name)
			}
			if !decided {
				continue
			}
			res := d.Results[j]
			box := b.Limit.Penalty() != nil
			if !res.Allowed {
				if !t.Denied || box && !t.Penalty {
					t.Tier, t.Value = b.Tier.Name, e.Show(b.Tier, b.Value)
				}
				t.Denied = true
				t.Penalty = t.Penalty || box
				boxOnly = boxOnly && box
			}
			if box || j >= len(d.Limits) {
				continue
			}
			if c := d.Limits[j].Limit.Capacity(); c > 0 {
				t.Usage = append(t.Usage, simulate.Usage{Tier: b.Tier.Name, Limit: b.Limit.String(), Value: e.Show(b.Tier, b.Value),
					Share: 1 - float64(min(res.Remaining, c))/float64(c)})
			}
		}
		t.Penalty = t.Denied && t.Penalty && boxOnly
		if t.Denied {
			t.Reason = d.Reason
		}
		if d.Allowed && d.Wait > 0 && d.Mode == engine.Enforce {
			t.Wait = d.Wait
		}
		i = j
	}
	if !d.Allowed && len(d.Results) == 0 && d.Blocked != "" {
		// Refused before any store call (a missing key): the tree named.
		treeName, tier, _ := strings.Cut(d.Blocked, "/")
		t := out.Next()
		t.Handler, t.Tree, t.Mode, t.Denied, t.Tier, t.Reason = sh.label, treeName, engine.Enforce, true, tier, d.Reason
		if et := e.Tree(treeName); et != nil {
			t.Tiers = append(t.Tiers, et.TierNames()...)
		}
	}
	for _, wt := range d.WouldBlock {
		// A tree not enforcing that denied, beside trees that admitted:
		// which of its tiers denied is not kept.
		t := out.Next()
		t.Handler, t.Tree, t.Mode, t.Denied, t.Reason = sh.label, wt.Name, e.Mode(wt), true, engine.ReasonLimited
		t.Tiers = append(t.Tiers, wt.TierNames()...)
	}
}

// end ends what d holds (concurrency slots, an idempotency record) when
// its request's response ended: at once, or, for a request whose log says
// how long it took, when that time comes (see Decide).
func (s *simulation) end(h *Handler, d *decision) {
	f := inFlight{end: s.cur.Time.Add(s.cur.Duration).UnixMicro(), h: h, d: d, status: s.cur.Status, size: s.cur.Size}
	if d.NeedsDone() && s.cur.Duration > 0 {
		heap.Push(&s.inFlight, f)
		if len(s.inFlight) > s.maxInFlight {
			heap.Pop(&s.inFlight).(inFlight).finish()
			s.endedEarly++
		}
		return
	}
	f.finish()
}

// defaultMaxInFlight is how many requests a simulation holds in flight
// until their logged ends (each holds its decision, a KiB or two).
const defaultMaxInFlight = 1 << 17

// endUntil ends the requests in flight whose responses ended by t (µs),
// each at its end on the simulated clock; t < 0 ends them all.
func (s *simulation) endUntil(t int64) {
	for len(s.inFlight) > 0 && (t < 0 || s.inFlight[0].end <= t) {
		f := heap.Pop(&s.inFlight).(inFlight)
		if f.end > s.now.Load() {
			s.now.Store(f.end)
		}
		f.finish()
	}
}

// inFlight is a decided request that holds a slot or a record until its
// response ends, and the logged response.
type inFlight struct {
	end    int64 // µs since the Unix epoch
	h      *Handler
	d      *decision
	status int
	size   int64
}

// finish ends f's request as its handler would once its response ended:
// under idempotency replay its response is kept (serveRecorded; a log has
// no body, so a retry's is not compared) or, after a server error, its
// record forgotten; then its slots and record are ended.
func (f inFlight) finish() {
	ctx := context.Background() // the request's: the memory store reads nothing of it
	if f.d.KeepsResponse() {
		if f.status >= 500 {
			f.d.Forget()
		} else {
			k := &kept{status: f.status, flags: replayUnchecked}
			if k.status == 0 {
				k.status = http.StatusOK
			}
			if f.size > f.h.Idempotency.MaxBody {
				k.flags |= replayStub // too large to keep: its retries are refused
			}
			_ = f.d.Keep(ctx, encodeKept(k))
		}
	}
	_ = f.d.Done(ctx)
	f.d.Release()
}

// inFlightHeap orders the requests in flight by their end.
type inFlightHeap []inFlight

func (q inFlightHeap) Len() int           { return len(q) }
func (q inFlightHeap) Less(i, j int) bool { return q[i].end < q[j].end }
func (q inFlightHeap) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *inFlightHeap) Push(x any)        { *q = append(*q, x.(inFlight)) }
func (q *inFlightHeap) Pop() any {
	old := *q
	f := old[len(old)-1]
	old[len(old)-1] = inFlight{}
	*q = old[:len(old)-1]
	return f
}

// countRedacted counts the requests whose key header Caddy's log redacted.
func (s *simulation) countRedacted(h *Handler, r *http.Request) {
	for _, t := range h.trees {
		for _, name := range t.header {
			if name != "" && len(r.Header[name]) == 1 && r.Header[name][0] == "REDACTED" {
				s.redacted[name]++
			}
		}
	}
}

// discardWriter is the response writer of the handlers the simulation
// runs for what they do to the request.
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (discardWriter) WriteHeader(int)             {}
