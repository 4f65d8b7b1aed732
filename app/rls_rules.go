package app

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/internal/caddyfileopt"
	"github.com/caddy-cascade/cascade/internal/promreg"
	"github.com/caddy-cascade/cascade/rls"
	"github.com/caddy-cascade/cascade/storeconfig"
)

// envoy opens the rules' store and returns what decides their calls, and
// the store's place in the pool (to release when the configuration is
// unloaded). validate has read the rules.
func (c *RLSConfig) envoy(ctx caddy.Context) (*rls.Envoy, string, error) {
	sc := c.Config.Store
	if sc == nil {
		sc = &storeconfig.Config{}
	}
	o, err := sc.Open(ctx, 0)
	if err != nil {
		return nil, "", fmt.Errorf("cascade rls: config: store: %w", err)
	}
	if o.Apply != nil {
		o.Apply()
	}
	return &rls.Envoy{
		Rules:            c.rules,
		Store:            o.Store,
		Atomic:           c.Config.Atomic == nil || *c.Config.Atomic,
		DescriptorLimits: c.Config.DescriptorLimits,
		Shadow:           c.Config.Shadow,
		Headers:          c.Config.Headers,
		MaxAddend:        c.Config.MaxHitsAddend,
	}, o.PoolKey, nil
}

// rlsRuleMetrics counts the hits of the rules' descriptors in reg, as
// envoyproxy/ratelimit's per-rule stats do: by domain, rule (its place in
// the configuration), the limit's name, detail (detailed_metric and
// value_to_metric's names with the call's values, bounded per rule) and
// outcome.
func rlsRuleMetrics(reg prometheus.Registerer) (rls.RuleObserver, error) {
	hits := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "cascade", Name: "rls_rule_hits_total",
		Help: "Hits of the descriptors decided under each rule of the rls config (envoyproxy/ratelimit's YAML), by outcome: within_limit, over_limit, shadow_mode.",
	}, []string{"domain", "rule", "name", "detail", "outcome"})
	if reg != nil {
		var err error
		if hits, err = promreg.Register(reg, hits); err != nil {
			return nil, err
		}
	}
	return func(domain, rule, name, detail, outcome string, n uint64) {
		hits.WithLabelValues(domain, rule, name, detail, outcome).Add(float64(n))
	}, nil
}

// parseRLSRules parses the config line of the rls block and its block:
//
//	config <file or directory>... {
//	    store memory [{ name <name>; max_keys <n> }] | redis { ... }
//	    atomic on|off
//	    descriptor_limits
//	    max_hits_addend <n>
//	    shadow
//	    headers [<limit> <remaining> <reset>]
//	    watch [<interval>]
//	}
func parseRLSRules(d *caddyfile.Dispenser) (*RLSRules, error) {
	r := &RLSRules{Paths: d.RemainingArgs()}
	if len(r.Paths) == 0 {
		return nil, d.Errf("rls config: give envoyproxy/ratelimit's YAML, a file or a directory of them, e.g. config /etc/ratelimit/config")
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch opt := d.Val(); opt {
		case "store":
			if r.Store != nil {
				return nil, d.Errf("rls config store: configured twice")
			}
			sc, err := parseRLSStore(d)
			if err != nil {
				return nil, err
			}
			r.Store = sc
		case "atomic":
			v, err := caddyfileopt.OneOf(d, "on", "off")
			if err != nil {
				return nil, err
			}
			on := v == "on"
			r.Atomic = &on
		case "descriptor_limits", "shadow":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			if opt == "shadow" {
				r.Shadow = true
			} else {
				r.DescriptorLimits = true
			}
		case "headers":
			h := &rls.EnvoyHeaders{}
			switch args := d.RemainingArgs(); len(args) {
			case 0:
			case 3:
				h.Limit, h.Remaining, h.Reset = args[0], args[1], args[2]
			default:
				return nil, d.Errf("rls config headers: no names (RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset), or three: headers <limit> <remaining> <reset>")
			}
			r.Headers = h
		case "watch":
			r.Watch = caddy.Duration(defaultWatch)
			if d.NextArg() {
				v, err := caddy.ParseDuration(d.Val())
				if err != nil || v <= 0 {
					return nil, d.Errf("rls config watch %q: give how often to look at the files, e.g. watch 5s", d.Val())
				}
				r.Watch = caddy.Duration(v)
				if d.NextArg() {
					return nil, d.ArgErr()
				}
			}
		case "max_hits_addend":
			if !d.NextArg() {
				return nil, d.ArgErr()
			}
			n, err := strconv.ParseInt(d.Val(), 10, 64)
			if err == nil && n == 0 {
				err = errors.New("0 would refuse every call")
			}
			if err == nil {
				err = rls.ValidAddend(n)
			}
			if err != nil {
				return nil, d.Errf("rls config max_hits_addend %q: give a whole number from 1 to %d (%v)", d.Val(), rls.MaxMaxAddend, err)
			}
			r.MaxHitsAddend = n
		default:
			return nil, d.Errf("rls config: unknown option %q: expected store, atomic, descriptor_limits, max_hits_addend, shadow, headers or watch", opt)
		}
	}
	return r, nil
}

// parseRLSStore parses store memory [{ name; max_keys }] or store redis
// { ... } (the options of a rate_limit handler's store redis).
func parseRLSStore(d *caddyfile.Dispenser) (*storeconfig.Config, error) {
	if !d.NextArg() {
		return nil, d.Errf("rls config store: memory or redis { ... }")
	}
	switch d.Val() {
	case "memory":
		m := &storeconfig.Memory{}
		if d.NextArg() {
			return nil, d.ArgErr()
		}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			var err error
			switch d.Val() {
			case "name":
				if !d.NextArg() {
					return nil, d.ArgErr()
				}
				m.Name = d.Val()
			case "max_keys":
				m.MaxKeys, err = caddyfileopt.Int(d)
			default:
				return nil, d.Errf("rls config store memory: unknown option %q: expected name or max_keys", d.Val())
			}
			if err != nil {
				return nil, err
			}
		}
		return &storeconfig.Config{Memory: m}, nil
	case "redis":
		if d.NextArg() {
			return nil, d.ArgErr()
		}
		r := &storeconfig.Redis{}
		if err := storeconfig.ParseRedis(d, r); err != nil {
			return nil, err
		}
		return &storeconfig.Config{Redis: r}, nil
	default:
		return nil, d.Errf("rls config store: unknown store %q: use memory (default) or redis", d.Val())
	}
}

// defaultWatch is how often watch looks at the files unless told.
const defaultWatch = 2 * time.Second

// watchRules reads the files of paths every interval until stop is
// closed, and gives e their rules when they changed, load and pass check
// (a domain line's tree keeps its domain). Rules that do not are logged
// (once for each error) and the rules before them go on serving.
func watchRules(e *rls.Envoy, paths []string, every time.Duration, check func(*rls.Rules) error, stop <-chan struct{}, logger *zap.Logger) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	lastErr := ""
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		changed, err := e.CurrentRules().Changed(paths...)
		if err == nil && !changed {
			continue
		}
		var r *rls.Rules
		if err == nil {
			r, err = rls.LoadRules(paths...)
		}
		if err == nil && check != nil {
			err = check(r)
		}
		if err != nil {
			if err.Error() != lastErr {
				lastErr = err.Error()
				logger.Error("rls: the rls config's files changed and do not load: the rules before go on serving", zap.Error(err))
			}
			continue
		}
		lastErr = ""
		e.SetRules(r)
		logger.Info("rls: the rls config's files changed: their rules serve", zap.Strings("files", r.Files()), zap.Int("rules", r.Len()))
	}
}
