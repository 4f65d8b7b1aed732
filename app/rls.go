package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/internal/promreg"
	"github.com/caddy-cascade/cascade/rls"
	"github.com/caddy-cascade/cascade/running"
	"github.com/caddy-cascade/cascade/storeconfig"
)

// RLSConfig serves Envoy's rate limit service (gRPC,
// envoy.service.ratelimit.v3.RateLimitService) on its own listener, deciding
// on the trees of this configuration's rate_limit handlers. See package rls
// for how descriptors map to a tree's tiers.
type RLSConfig struct {
	// Listen is the listener's network address, e.g. "127.0.0.1:8081" or
	// "unix//run/cascade-rls.sock". Keep it where only Envoy reaches it:
	// whoever reaches it can charge any bucket the domains name.
	Listen string `json:"listen"`
	// TLS serves the listener over TLS, mutual TLS when it names a
	// client_ca: then only clients with a certificate from that CA may
	// call. Without it the listener is plaintext, and a listener on an
	// address other than loopback is warned about at start.
	TLS *rls.TLSFiles `json:"tls,omitempty"`
	// Domains maps Envoy's rate limit domains to trees. Without any, every
	// tree of every rate_limit handler is served under its own name.
	Domains []RLSDomain `json:"domains,omitempty"`
	// Config serves envoyproxy/ratelimit's YAML configuration as it is,
	// beside the trees: its domains win over trees of the same names.
	Config *RLSRules `json:"config,omitempty"`

	rules *rls.Rules // Config's, read by validate
}

// RLSRules is envoyproxy/ratelimit's configuration, served with its
// semantics (see package rls, Envoy).
type RLSRules struct {
	// Paths are YAML files, or directories whose *.yaml and *.yml files
	// (in subdirectories too; any other file is an error) are read; each
	// file is one domain. Read again on every reload of Caddy's
	// configuration.
	Paths []string `json:"paths"`
	// Store is where the rules' counters live: the memory store (the
	// default) or Redis, as a rate_limit handler's store.
	Store *storeconfig.Config `json:"store,omitempty"`
	// Atomic, false, decides each descriptor of a call alone, as
	// envoyproxy/ratelimit does (Caddyfile: atomic off). By default (nil or
	// true) a call refused by any descriptor is charged for none.
	Atomic *bool `json:"atomic,omitempty"`
	// DescriptorLimits honours the limit a descriptor carries (Envoy's
	// limit override); by default such a call is INVALID_ARGUMENT.
	DescriptorLimits bool `json:"descriptor_limits,omitempty"`
	// MaxHitsAddend is the largest hits_addend taken; default 4294967295.
	MaxHitsAddend int64 `json:"max_hits_addend,omitempty"`
	// Shadow answers every call OK overall, its statuses, metrics and
	// counters as if it enforced (envoyproxy/ratelimit's
	// GLOBAL_SHADOW_MODE): for running beside it before switching.
	Shadow bool `json:"shadow,omitempty"`
	// Headers, when set, adds the RateLimit-Limit, -Remaining and -Reset
	// headers (or the names it gives) of the status with the least left,
	// as envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED does.
	Headers *rls.EnvoyHeaders `json:"headers,omitempty"`
	// Watch, when set, reads the files again this often, and serves
	// their rules when they changed and load (as envoyproxy/ratelimit
	// watches its runtime directory); rules that do not load are logged,
	// and the rules before them go on. Without it the files are read at
	// each load of Caddy's configuration only.
	Watch caddy.Duration `json:"watch,omitempty"`
}

// RLSDomain is one domain Envoy's calls name.
type RLSDomain struct {
	// Domain is the domain of Envoy's ratelimit filter.
	Domain string `json:"domain"`
	// Tree is the name of the tree that decides its calls; default Domain.
	Tree string `json:"tree,omitempty"`
	// Dimension is what a call's hits_addend counts: requests (default) or
	// a dimension the tree limits, such as tokens.
	Dimension string `json:"dimension,omitempty"`
	// AllowRefunds lets descriptors with is_negative_hits give hits back.
	// Off (the default), such a call is refused with INVALID_ARGUMENT:
	// whoever may refund can reset any bucket it names.
	AllowRefunds bool `json:"allow_refunds,omitempty"`
	// MaxHitsAddend is the largest hits_addend a call may carry (its own,
	// or a descriptor's); a larger one is refused with INVALID_ARGUMENT.
	// Default 4294967295, the most Envoy's call-level field carries.
	MaxHitsAddend int64 `json:"max_hits_addend,omitempty"`
}

// rlsServers holds the rate limit services by listen address, across
// reloads: a reload swaps the routes and TLS of the running server instead
// of closing and re-opening its listener under Envoy's feet. It also holds
// each configuration's lease on its server (see startRLS).
var rlsServers = caddy.NewUsagePool()

// rlsServer is one gRPC server and its listener.
type rlsServer struct {
	svc   *rls.Server
	grpc  *grpc.Server
	creds *rls.Credentials

	mu sync.Mutex
	// states holds what each configuration using the server gives it, in
	// the order they started: the newest one serves. A configuration that
	// fails to start, or is unloaded, leaves, and the one before it serves
	// again (its TLS included).
	states []*rlsState
}

// rlsLease is one configuration's use of a server: given back, its state
// leaves the server, and the server is released.
type rlsLease struct {
	srv    *rlsServer
	st     *rlsState
	listen string
}

func (l *rlsLease) Destruct() error {
	l.srv.leave(l.st)
	_, err := rlsServers.Delete(l.listen)
	if err2 := l.st.release(); err == nil {
		err = err2
	}
	return err
}

// rlsState is what one configuration gives its rate limit service.
type rlsState struct {
	routes   map[string]rls.Route
	envoy    *rls.Envoy // envoyproxy/ratelimit's rules, nil for none
	storeKey string     // the rules' store in the stores pool, "" for none
	// stopWatch stops the watcher of the rules' files; nil for none.
	stopWatch chan struct{}
	observe   rls.Observer
	tls       *tls.Config // nil: plaintext
}

// release stops watching the rules' files and gives back their store.
func (st *rlsState) release() error {
	if st.stopWatch != nil {
		close(st.stopWatch)
		st.stopWatch = nil
	}
	if st.storeKey == "" {
		return nil
	}
	key := st.storeKey
	st.storeKey = ""
	return storeconfig.Release(key)
}

// serve makes st the state served until it leaves.
func (s *rlsServer) serve(st *rlsState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states = append(s.states, st)
	s.apply()
}

// leave drops st, and serves the newest state left.
func (s *rlsServer) leave(st *rlsState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.states, st)
	if i < 0 {
		return
	}
	s.states = slices.Delete(s.states, i, i+1)
	if i == len(s.states) && i > 0 {
		s.apply()
	}
}

func (s *rlsServer) apply() {
	st := s.states[len(s.states)-1]
	s.creds.Set(st.tls)
	s.svc.Set(st.routes, st.envoy, st.observe)
}

// Destruct stops the server when no configuration uses its address any
// more: calls under way get a few seconds to finish.
func (s *rlsServer) Destruct() error {
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.grpc.Stop()
	}
	return nil
}

// validate checks what can be checked without the handlers, and reads the
// rules of Config.
func (c *RLSConfig) validate() error {
	if err := c.check(); err != nil {
		return err
	}
	if c.Config == nil {
		return nil
	}
	rules, err := rls.LoadRules(c.Config.Paths...)
	if err != nil {
		return fmt.Errorf("cascade rls: config: %w", err)
	}
	if err := c.checkRules(rules); err != nil {
		return err
	}
	c.rules = rules
	return nil
}

// checkRules refuses rules a domain line's tree has a domain of: when the
// configuration loads, and when watch reads the files again.
func (c *RLSConfig) checkRules(rules *rls.Rules) error {
	for _, d := range c.Domains {
		if slices.Contains(rules.Domains(), d.Domain) {
			return fmt.Errorf("cascade rls: domain %s is a tree's and the domain of a file of config too: one of them", d.Domain)
		}
	}
	return nil
}

// check checks what can be checked without reading files: what adapting
// a Caddyfile reports.
// minWatch is the shortest interval at which watch reads the rules' files.
const minWatch = 10 * time.Millisecond

func (c *RLSConfig) check() error {
	if c.Listen == "" {
		return errors.New("cascade rls: listen is required, e.g. listen 127.0.0.1:8081")
	}
	na, err := caddy.ParseNetworkAddress(c.Listen)
	if err != nil {
		return fmt.Errorf("cascade rls: listen %q: %w", c.Listen, err)
	}
	if na.PortRangeSize() > 1 {
		return fmt.Errorf("cascade rls: listen %q: give one port, not a range", c.Listen)
	}
	if c.TLS != nil {
		if err := c.TLS.Validate(); err != nil {
			return fmt.Errorf("cascade rls: %w", err)
		}
	}
	seen := map[string]bool{}
	for _, d := range c.Domains {
		if d.Domain == "" {
			return errors.New("cascade rls: a domain needs a name: domain <name> [tree <tree>] [dimension <dimension>]")
		}
		if seen[d.Domain] {
			return fmt.Errorf("cascade rls: domain %q configured twice", d.Domain)
		}
		seen[d.Domain] = true
		if err := rls.ValidAddend(d.MaxHitsAddend); err != nil {
			return fmt.Errorf("cascade rls: domain %s: %w", d.Domain, err)
		}
	}
	if c.Config != nil {
		if len(c.Config.Paths) == 0 {
			return errors.New("cascade rls: config needs a file or directory of envoyproxy/ratelimit's YAML, e.g. config /etc/ratelimit/config")
		}
		if err := rls.ValidAddend(c.Config.MaxHitsAddend); err != nil {
			return fmt.Errorf("cascade rls: config: %w", err)
		}
		if w := time.Duration(c.Config.Watch); w != 0 && w < minWatch {
			return fmt.Errorf("cascade rls: config: watch %v: look at the files at most every %v (e.g. watch 2s)", w, minWatch)
		}
	}
	return nil
}

// routes finds each domain's tree among engines (those of this
// configuration).
func (c *RLSConfig) routes(engines []*engine.Engine, logger *zap.Logger) (map[string]rls.Route, error) {
	var all []string
	find := func(name string) (rls.Route, int) {
		var found rls.Route
		n := 0
		for _, e := range engines {
			if t := e.Tree(name); t != nil {
				if n == 0 {
					found = rls.Route{Engine: e, Tree: t}
				}
				n++
			}
		}
		return found, n
	}
	for _, e := range engines {
		for _, t := range e.Config().Trees {
			if !slices.Contains(all, t.Name) {
				all = append(all, t.Name)
			}
		}
	}
	routes := map[string]rls.Route{}
	if len(c.Domains) == 0 {
		for _, name := range all {
			r, n := find(name)
			if n > 1 {
				logger.Warn("rls: several rate_limit handlers have this tree; Envoy's calls are decided by the first (on its store)", zap.String("tree", name))
			}
			if r.Tree.Concurrent() {
				// Envoy never says when a request ends: its slots would
				// never be given back.
				logger.Warn("rls: a tree with a concurrency limit is not served to Envoy, which never says when a request ends", zap.String("tree", name))
				continue
			}
			routes[name] = r
		}
		if c.rules != nil {
			for _, d := range c.rules.Domains() {
				if _, ok := routes[d]; ok {
					logger.Warn("rls: a tree has the name of a domain of the rls config, whose rules decide its calls", zap.String("domain", d))
					delete(routes, d)
				}
			}
		}
		if len(routes) == 0 && c.rules == nil {
			return nil, errors.New("cascade rls: no rate_limit handler in this configuration has a tree to serve (serve envoyproxy/ratelimit's YAML with config <file>)")
		}
		return routes, nil
	}
	for _, d := range c.Domains {
		tree := d.Tree
		if tree == "" {
			tree = d.Domain
		}
		r, n := find(tree)
		if n == 0 {
			return nil, fmt.Errorf("cascade rls: domain %s: no rate_limit handler has a tree %q (the trees are: %s)", d.Domain, tree, strings.Join(all, ", "))
		}
		if n > 1 {
			logger.Warn("rls: several rate_limit handlers have this tree; Envoy's calls are decided by the first (on its store)", zap.String("tree", tree))
		}
		if dim := d.Dimension; dim != "" && dim != hierarchy.Requests && !slices.Contains(r.Tree.Dimensions(), dim) {
			return nil, fmt.Errorf("cascade rls: domain %s: tree %s limits no %s (its dimensions: %s)", d.Domain, tree, dim, strings.Join(r.Tree.Dimensions(), ", "))
		}
		if r.Tree.Concurrent() {
			return nil, fmt.Errorf("cascade rls: domain %s: tree %s has a concurrency limit, which Envoy cannot use: it never says when a request ends, so its slots would never be given back (limit concurrency in a rate_limit in front of the upstream)", d.Domain, tree)
		}
		r.Dimension, r.AllowRefunds, r.MaxAddend = d.Dimension, d.AllowRefunds, d.MaxHitsAddend
		routes[d.Domain] = r
	}
	return routes, nil
}

// startRLS serves the configuration's routes on the listener, opening it
// unless a configuration before this one already did, until the
// configuration is unloaded.
func (a *App) startRLS() error {
	routes, err := a.RLS.routes(running.EnginesOf(a.ctx.Done()), a.logger)
	if err != nil {
		return err
	}
	st := &rlsState{routes: routes}
	if a.RLS.rules != nil {
		if st.envoy, st.storeKey, err = a.RLS.envoy(a.ctx); err != nil {
			return err
		}
	}
	started := false
	defer func() {
		if !started {
			_ = st.release()
		}
	}()
	if a.RLS.TLS != nil {
		if st.tls, err = a.RLS.TLS.Config(); err != nil {
			return fmt.Errorf("cascade rls: %w", err)
		}
	}
	if st.observe, err = rlsMetrics(a.ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("cascade rls: metrics: %w", err)
	}
	if st.envoy != nil {
		if st.envoy.Observe, err = rlsRuleMetrics(a.ctx.GetMetricsRegistry()); err != nil {
			return fmt.Errorf("cascade rls: metrics: %w", err)
		}
		if every := time.Duration(a.RLS.Config.Watch); every > 0 {
			st.stopWatch = make(chan struct{})
			go watchRules(st.envoy, a.RLS.Config.Paths, every, a.RLS.checkRules, st.stopWatch, a.logger)
		}
	}
	na, err := caddy.ParseNetworkAddress(a.RLS.Listen)
	if err != nil {
		return fmt.Errorf("cascade rls: listen %q: %w", a.RLS.Listen, err)
	}
	v, _, err := rlsServers.LoadOrNew(a.RLS.Listen, func() (caddy.Destructor, error) {
		ln, err := na.Listen(context.Background(), 0, net.ListenConfig{})
		if err != nil {
			return nil, err
		}
		creds := &rls.Credentials{}
		creds.Set(st.tls) // before the first connection is accepted
		s := &rlsServer{svc: rls.New(a.logger), grpc: grpc.NewServer(rls.ServerOptions(creds)...), creds: creds}
		s.svc.Register(s.grpc)
		go func() {
			if err := s.grpc.Serve(ln.(net.Listener)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				a.logger.Error("rls: serving stopped", zap.Error(err))
			}
		}()
		a.logger.Info("rls: serving Envoy's rate limit service", zap.String("listen", a.RLS.Listen), zap.Bool("tls", st.tls != nil))
		return s, nil
	})
	if err != nil {
		return fmt.Errorf("cascade rls: listen %s: %w", a.RLS.Listen, err)
	}
	// This configuration's hold on the server is a lease of its own in
	// the pool, which the App's Cleanup gives back: the state leaves as
	// the configuration is unloaded (or fails to start), before Caddy
	// returns, and the previous configuration's TLS and routes serve again.
	srv := v.(*rlsServer)
	lease := &rlsLease{srv: srv, st: st, listen: a.RLS.Listen}
	key := fmt.Sprintf("%s#%p", a.RLS.Listen, st)
	if _, _, err := rlsServers.LoadOrNew(key, func() (caddy.Destructor, error) { return lease, nil }); err != nil {
		_, _ = rlsServers.Delete(a.RLS.Listen)
		return fmt.Errorf("cascade rls: %w", err)
	}
	a.rlsKey = key
	started = true // the lease releases the store from now on
	srv.serve(st)
	switch {
	case localOnly(na):
	case st.tls == nil:
		a.logger.Warn("rls: Envoy's rate limit service listens in plaintext on an address others may reach: anyone who reaches it can charge any bucket its domains name; listen on loopback or a unix socket, or set tls { cert, key, client_ca }",
			zap.String("listen", a.RLS.Listen))
	case st.tls.ClientCAs == nil:
		a.logger.Warn("rls: Envoy's rate limit service takes calls from any client on an address others may reach: set tls client_ca so that only Envoy's certificate may call",
			zap.String("listen", a.RLS.Listen))
	}
	return nil
}

// localOnly says whether a listener on na is reachable from this host
// only: a unix socket, or a loopback address. (A socket inherited as a file
// descriptor may be anything, so it is not.)
func localOnly(na caddy.NetworkAddress) bool {
	if na.IsUnixNetwork() {
		return true
	}
	if na.Host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(na.Host)
	return err == nil && ip.IsLoopback()
}

// rlsMetrics counts the rate limit service's calls by domain and outcome,
// and times them, in reg.
func rlsMetrics(reg prometheus.Registerer) (rls.Observer, error) {
	calls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "cascade", Name: "rls_calls_total",
		Help: "Calls to Envoy's rate limit service, by domain and outcome: ok, over_limit, invalid, unavailable.",
	}, []string{"domain", "outcome"})
	duration := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "cascade", Name: "rls_call_duration_seconds",
		Help:    "Time to decide one call to Envoy's rate limit service, store round trip included.",
		Buckets: []float64{.00001, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .05},
	})
	if reg != nil {
		var err error
		if calls, err = promreg.Register(reg, calls); err != nil {
			return nil, err
		}
		if duration, err = promreg.Register(reg, duration); err != nil {
			return nil, err
		}
	}
	return func(domain, outcome string, took time.Duration) {
		calls.WithLabelValues(domain, outcome).Inc()
		duration.Observe(took.Seconds())
	}, nil
}

// parseRLS parses
//
//	rls {
//	    listen <address>            # e.g. 127.0.0.1:8081: keep it where only Envoy reaches it
//	    tls {                       # serve over TLS (default: plaintext)
//	        cert      <file>        # PEM certificate chain, leaf first
//	        key       <file>        # its PEM private key
//	        client_ca <file>        # mutual TLS: only clients with a certificate from these CAs
//	    }
//	    domain <name> [tree <tree>] [dimension <dim>] [max_hits_addend <n>] [allow_refunds]
//	    config <file or directory>... {    # envoyproxy/ratelimit's YAML, as it is
//	        store memory|redis { ... }      # where its counters live (default memory)
//	        atomic on|off                   # off: each descriptor alone (default on)
//	        descriptor_limits               # honour a descriptor's own limit
//	        max_hits_addend <n>
//	        shadow                          # never refuse: statuses and metrics only
//	        headers [<limit> <remaining> <reset>] # RateLimit-Limit, -Remaining, -Reset
//	        watch [<interval>]              # read the files again when they change (default 2s)
//	    }
//	}
//
// A domain's max_hits_addend (default 4294967295) is the largest hits_addend
// a call may carry; allow_refunds lets its descriptors with
// is_negative_hits give hits back (refused by default: a caller that may
// refund can reset any bucket it names).
func parseRLS(d *caddyfile.Dispenser) (*RLSConfig, error) {
	c := &RLSConfig{}
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "listen":
			if !d.NextArg() {
				return nil, d.Errf("rls listen: give an address, e.g. listen 127.0.0.1:8081")
			}
			c.Listen = d.Val()
			if d.NextArg() {
				return nil, d.ArgErr()
			}
		case "tls":
			if c.TLS != nil {
				return nil, d.Errf("rls tls: configured twice")
			}
			t, err := parseRLSTLS(d)
			if err != nil {
				return nil, err
			}
			c.TLS = t
		case "domain":
			dom, err := parseRLSDomain(d)
			if err != nil {
				return nil, err
			}
			c.Domains = append(c.Domains, dom)
		case "config":
			if c.Config != nil {
				return nil, d.Errf("rls config: configured twice (give it several paths: config <path> <path>)")
			}
			rc, err := parseRLSRules(d)
			if err != nil {
				return nil, err
			}
			c.Config = rc
		default:
			return nil, d.Errf("rls: unknown option %q: expected listen, tls, domain or config", d.Val())
		}
	}
	if err := c.check(); err != nil {
		return nil, d.Errf("%v", err)
	}
	return c, nil
}

// parseRLSTLS parses the rls block's tls block (see parseRLS).
func parseRLSTLS(d *caddyfile.Dispenser) (*rls.TLSFiles, error) {
	if d.NextArg() {
		return nil, d.Errf("rls tls: expected a block: tls { cert <file>; key <file>; client_ca <file> }")
	}
	t := &rls.TLSFiles{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		var into *string
		switch opt {
		case "cert":
			into = &t.Cert
		case "key":
			into = &t.Key
		case "client_ca":
			into = &t.ClientCA
		default:
			return nil, d.Errf("rls tls: unknown option %q: expected cert, key or client_ca", opt)
		}
		if !d.NextArg() {
			return nil, d.Errf("rls tls %s: give a PEM file, e.g. %s /etc/cascade/rls-%s.pem", opt, opt, opt)
		}
		*into = d.Val()
		if d.NextArg() {
			return nil, d.Errf("rls tls %s: one file only", opt)
		}
	}
	if err := t.Validate(); err != nil {
		return nil, d.Errf("rls %v", err)
	}
	return t, nil
}

// parseRLSDomain parses a domain line of the rls block (see parseRLS).
func parseRLSDomain(d *caddyfile.Dispenser) (RLSDomain, error) {
	const usage = "expected domain <name> [tree <tree>] [dimension <dimension>] [max_hits_addend <n>] [allow_refunds]"
	args := d.RemainingArgs()
	if len(args) == 0 {
		return RLSDomain{}, d.Errf("rls domain: %s", usage)
	}
	dom := RLSDomain{Domain: args[0]}
	for i := 1; i < len(args); i++ {
		if args[i] == "allow_refunds" {
			dom.AllowRefunds = true
			continue
		}
		if i+1 == len(args) {
			switch args[i] {
			case "tree", "dimension", "max_hits_addend":
				return RLSDomain{}, d.Errf("rls domain %s: %s needs a value: %s", args[0], args[i], usage)
			}
			return RLSDomain{}, d.Errf("rls domain %s: unknown setting %q: %s", args[0], args[i], usage)
		}
		switch v := args[i+1]; args[i] {
		case "tree":
			dom.Tree = v
		case "dimension":
			dom.Dimension = v
		case "max_hits_addend":
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil && n == 0 {
				err = errors.New("0 would refuse every call")
			}
			if err == nil {
				err = rls.ValidAddend(n)
			}
			if err != nil {
				return RLSDomain{}, d.Errf("rls domain %s: max_hits_addend %q: give a whole number from 1 to %d (%v)", args[0], v, rls.MaxMaxAddend, err)
			}
			dom.MaxHitsAddend = n
		default:
			return RLSDomain{}, d.Errf("rls domain %s: unknown setting %q: expected tree, dimension, max_hits_addend or allow_refunds", args[0], args[i])
		}
		i++
	}
	return dom, nil
}
