package cascade

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rls"
	"github.com/caddy-cascade/cascade/running"
)

// RLSConfig serves Envoy's rate limit service (gRPC,
// envoy.service.ratelimit.v3.RateLimitService) on its own listener, deciding
// on the trees of this configuration's rate_limit handlers. See package rls
// for how descriptors map to a tree's tiers.
type RLSConfig struct {
	// Listen is the listener's network address, e.g. "127.0.0.1:8081" or
	// "unix//run/cascade-rls.sock". Keep it where only Envoy reaches it.
	Listen string `json:"listen"`
	// Domains maps Envoy's rate limit domains to trees. Without any, every
	// tree of every rate_limit handler is served under its own name.
	Domains []RLSDomain `json:"domains,omitempty"`
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
}

// rlsServers holds the rate limit services by listen address, across
// reloads: a reload swaps the routes of the running server instead of
// closing and re-opening its listener under Envoy's feet.
var rlsServers = caddy.NewUsagePool()

// rlsServer is one gRPC server and its listener.
type rlsServer struct {
	svc  *rls.Server
	grpc *grpc.Server
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

// validate checks what can be checked without the handlers.
func (c *RLSConfig) validate() error {
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
	seen := map[string]bool{}
	for _, d := range c.Domains {
		if d.Domain == "" {
			return errors.New("cascade rls: a domain needs a name: domain <name> [tree <tree>] [dimension <dimension>]")
		}
		if seen[d.Domain] {
			return fmt.Errorf("cascade rls: domain %q configured twice", d.Domain)
		}
		seen[d.Domain] = true
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
		for _, t := range e.Trees() {
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
		if len(routes) == 0 {
			return nil, errors.New("cascade rls: no rate_limit handler in this configuration has a tree to serve")
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
		r.Dimension = d.Dimension
		routes[d.Domain] = r
	}
	return routes, nil
}

// startRLS serves the configuration's routes on the listener, opening it
// unless a configuration before this one already did.
func (a *App) startRLS() error {
	routes, err := a.RLS.routes(running.EnginesOf(a.ctx.Done()), a.logger)
	if err != nil {
		return err
	}
	v, _, err := rlsServers.LoadOrNew(a.RLS.Listen, func() (caddy.Destructor, error) {
		na, err := caddy.ParseNetworkAddress(a.RLS.Listen)
		if err != nil {
			return nil, err
		}
		ln, err := na.Listen(context.Background(), 0, net.ListenConfig{})
		if err != nil {
			return nil, err
		}
		s := &rlsServer{svc: rls.New(a.logger), grpc: grpc.NewServer()}
		s.svc.Register(s.grpc)
		go func() {
			if err := s.grpc.Serve(ln.(net.Listener)); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				a.logger.Error("rls: serving stopped", zap.Error(err))
			}
		}()
		a.logger.Info("rls: serving Envoy's rate limit service", zap.String("listen", a.RLS.Listen))
		return s, nil
	})
	if err != nil {
		return fmt.Errorf("cascade rls: listen %s: %w", a.RLS.Listen, err)
	}
	a.rlsKey = a.RLS.Listen
	observe, err := rlsMetrics(a.ctx.GetMetricsRegistry())
	if err != nil {
		return fmt.Errorf("cascade rls: metrics: %w", err)
	}
	v.(*rlsServer).svc.SetRoutes(routes, observe)
	return nil
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
		if calls, err = register(reg, calls); err != nil {
			return nil, err
		}
		if duration, err = register(reg, duration); err != nil {
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
//	    listen <address>
//	    domain <name> [tree <tree>] [dimension <dimension>]
//	}
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
		case "domain":
			args := d.RemainingArgs()
			if len(args) == 0 || len(args)%2 == 0 {
				return nil, d.Errf("rls domain: expected domain <name> [tree <tree>] [dimension <dimension>]")
			}
			dom := RLSDomain{Domain: args[0]}
			for i := 1; i < len(args); i += 2 {
				switch args[i] {
				case "tree":
					dom.Tree = args[i+1]
				case "dimension":
					dom.Dimension = args[i+1]
				default:
					return nil, d.Errf("rls domain %s: unknown setting %q: expected tree or dimension", args[0], args[i])
				}
			}
			c.Domains = append(c.Domains, dom)
		default:
			return nil, d.Errf("rls: unknown option %q: expected listen or domain", d.Val())
		}
	}
	if err := c.validate(); err != nil {
		return nil, d.Errf("%v", err)
	}
	return c, nil
}
