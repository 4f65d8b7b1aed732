package app

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/adaptive"
	"github.com/caddy-cascade/cascade/storeconfig"
)

func init() {
	caddy.RegisterModule(App{})
	httpcaddyfile.RegisterGlobalOption("cascade", parseGlobalOption)
}

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)

// controllers holds the adaptive controller of this process across config
// reloads: a reload must not forget that the upstream is drowning.
var controllers = caddy.NewUsagePool()

// App is the part of Cascade that is one per Caddy process: the adaptive
// controller that every rate_limit handler with an `adaptive` tier shares.
// It is configured with the `cascade` global option.
type App struct {
	// Adaptive configures the controller: sampling interval, floor, the
	// warn and critical thresholds of each signal.
	Adaptive *AdaptiveConfig `json:"adaptive,omitempty"`

	// Share publishes this process's adaptive factor through Redis and
	// applies the lowest fresh factor of every instance sharing it, so
	// instances that share limits converge on one factor.
	Share *storeconfig.Redis `json:"share,omitempty"`

	// RLS serves Envoy's rate limit service on the trees of this
	// configuration's rate_limit handlers.
	RLS *RLSConfig `json:"rls,omitempty"`

	controller *adaptive.Controller
	poolKey    string
	shareKey   string // the shared Redis client's place in the stores pool
	rlsKey     string // the rate limit service's place in rlsServers
	ctx        caddy.Context
	logger     *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "cascade", New: func() caddy.Module { return new(App) }}
}

// AdaptiveConfig is adaptive.Config as Caddy's JSON writes it: each
// duration is a number of nanoseconds or, as everywhere in Caddy's config,
// a string such as "2s", "1m30s" or "1d" (package adaptive does not depend
// on Caddy, so its Config takes numbers only).
type AdaptiveConfig struct {
	adaptive.Config
}

// UnmarshalJSON turns the duration strings of the JSON into nanoseconds,
// then decodes it strictly, as Caddy decodes modules.
func (c *AdaptiveConfig) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	if err := durationsToNanos(raw, reflect.TypeOf(c.Config), "adaptive"); err != nil {
		return err
	}
	fixed, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	dec = json.NewDecoder(bytes.NewReader(fixed))
	dec.DisallowUnknownFields()
	return dec.Decode(&c.Config)
}

// durationsToNanos replaces, in v (decoded JSON of a value of type t), each
// string given to a time.Duration field by its nanoseconds.
func durationsToNanos(v any, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if arr, ok := v.([]any); ok && t.Kind() == reflect.Slice { // adaptive.signals
		for i, e := range arr {
			if err := durationsToNanos(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		return nil
	}
	obj, ok := v.(map[string]any)
	if t.Kind() != reflect.Struct || !ok {
		return nil // the strict decode reports a wrong type
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		val, ok := obj[name]
		if !ok {
			continue
		}
		if s, isString := val.(string); isString && f.Type == reflect.TypeOf(time.Duration(0)) {
			d, err := caddy.ParseDuration(s)
			if err != nil {
				return fmt.Errorf("%s.%s: %w", path, name, err)
			}
			obj[name] = int64(d)
			continue
		}
		if err := durationsToNanos(val, f.Type, path+"."+name); err != nil {
			return err
		}
	}
	return nil
}

type pooledController struct{ *adaptive.Controller }

func (p pooledController) Destruct() error { p.Stop(); return nil }

// Provision gets the process's controller: the running one when the
// configuration did not change, else a new one that inherits the running
// one's state (so a reload mid-incident keeps throttling).
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx, a.logger = ctx, ctx.Logger()
	if a.RLS != nil {
		if err := a.RLS.validate(); err != nil {
			return err
		}
	}
	cfg := adaptive.Config{}
	if a.Adaptive != nil {
		cfg = a.Adaptive.Config
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	var publisher adaptive.Publisher
	if a.Share != nil {
		o, err := (&storeconfig.Config{Redis: a.Share}).Open(ctx, 0)
		if err != nil {
			return fmt.Errorf("cascade: adaptive share: %w", err)
		}
		a.shareKey = o.PoolKey
		prefix := a.Share.KeyPrefix
		if prefix == "" {
			prefix = "cascade:"
		}
		publisher = newRedisPublisher(o.Redis.Client(), prefix, cfg.SharedMaxAge)
	}
	key, _ := json.Marshal(struct {
		adaptive.Config
		Share *storeconfig.Redis
	}{cfg, a.Share})
	a.poolKey = "adaptive/" + string(key)
	// The running controller, if any, to inherit from (looked up first:
	// the pool is locked while LoadOrNew constructs).
	var previous *adaptive.Controller
	controllers.Range(func(_, v any) bool {
		previous = v.(pooledController).Controller
		return false
	})
	v, _, err := controllers.LoadOrNew(a.poolKey, func() (caddy.Destructor, error) {
		c, err := adaptive.New(cfg, adaptive.Options{Logger: ctx.Logger(), Inherit: previous, Publisher: publisher})
		if err != nil {
			return nil, err
		}
		return pooledController{c}, nil
	})
	if err != nil {
		return fmt.Errorf("cascade: adaptive controller: %w", err)
	}
	a.controller = v.(pooledController).Controller
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := a.controller.Register(reg); err != nil {
			return fmt.Errorf("cascade: adaptive metrics: %w", err)
		}
	}
	return nil
}

// Start starts the controller's sampling (a no-op when it already runs)
// and Envoy's rate limit service, if configured: the handlers it decides
// with are all provisioned by now.
func (a *App) Start() error {
	a.controller.Start()
	if a.RLS != nil {
		return a.startRLS()
	}
	return nil
}

// Stop does nothing: the controller outlives configs, and stops when the
// last config using it is cleaned up.
func (a *App) Stop() error { return nil }

// Cleanup releases this config's hold on the controller.
func (a *App) Cleanup() error {
	var err error
	if a.poolKey != "" {
		_, err = controllers.Delete(a.poolKey)
	}
	if a.shareKey != "" {
		if err2 := storeconfig.Release(a.shareKey); err == nil {
			err = err2
		}
	}
	if a.rlsKey != "" {
		if _, err2 := rlsServers.Delete(a.rlsKey); err == nil {
			err = err2
		}
	}
	return err
}

// Controller is the process's adaptive controller.
func (a *App) Controller() *adaptive.Controller { return a.controller }

// parseGlobalOption parses the `cascade` global option:
//
//	{
//	    cascade {
//	        adaptive {
//	            interval       <duration>              # sampling, default 1s
//	            floor          <fraction>              # lowest factor, default 0.1
//	            cpu            <warn%> <critical%>|off # default 70 85
//	            memory         <warn%> <critical%>|off # off unless set
//	            error_rate     <warn%> <critical%>|off # default 1 5
//	            latency        <warn> <critical>|off   # p99, default 500ms 2s
//	            latency_window <duration>              # default 30s
//	            min_requests   <n>                     # default 100
//	            recovery_delay <duration>              # calm needed before recovering, default 5s
//	            recovery_time  <duration>              # from floor back to 1, default 60s
//	            signal <name> {                        # an external signal (any number of them)
//	                # exactly one of:
//	                prometheus <url> <selector> [/ <selector>] # a gauge, or the ratio of two, from an
//	                                                   # exposition; selector: name or name{label="value",...}
//	                http <url> <field>                 # a number in a JSON document: dotted.path.0.to.it
//	                response_header <name>             # a number on the upstream's responses,
//	                                                   # averaged over latency_window
//	                in_flight <max>                    # requests in flight, in percent of max
//	                warn     <value>                   # required, in the signal's unit
//	                critical <value>                   # required, above warn
//	                on_error ignore|critical           # required but for in_flight: an unreadable
//	                                                   # signal drops out, or counts as critical
//	                interval  <duration>               # prometheus and http: read every 5s
//	                timeout   <duration>               # prometheus and http: default 2s (≤ interval)
//	                smoothing <duration>               # moving average, default 2s (not response_header)
//	            }
//	            share {                                # converge on one factor with the
//	                address <host:port...>             # instances sharing this Redis
//	                ...                                # (the options of store redis)
//	            }
//	        }
//	        rls {                                      # Envoy's rate limit service (gRPC)
//	            listen <address>                       # e.g. 127.0.0.1:8081: only Envoy should reach it
//	            tls {                                  # default plaintext (WARN at start off loopback)
//	                cert      <file>
//	                key       <file>
//	                client_ca <file>                   # mutual TLS: only clients of these CAs
//	            }
//	            domain <name> [tree <tree>] [dimension <dim>] [max_hits_addend <n>] [allow_refunds] # default: every tree, by its name
//	            config <file or directory>... {        # envoyproxy/ratelimit's YAML, as it is
//	                store memory|redis { ... }         # where its counters live (default memory)
//	                atomic on|off                      # off: each descriptor alone (default on)
//	                descriptor_limits                  # honour a descriptor's own limit
//	                max_hits_addend <n>
//	                shadow                             # never refuse: statuses and metrics only
//	                headers [<limit> <remaining> <reset>]
//	                watch [<interval>]                 # read the files again when they change
//	            }
//	        }
//	    }
//	}
func parseGlobalOption(d *caddyfile.Dispenser, _ any) (any, error) {
	app := &App{Adaptive: &AdaptiveConfig{}}
	d.Next()
	for d.NextBlock(0) {
		if d.Val() == "rls" {
			if app.RLS != nil {
				return nil, d.Errf("cascade: rls configured twice")
			}
			rc, err := parseRLS(d)
			if err != nil {
				return nil, err
			}
			app.RLS = rc
			continue
		}
		if d.Val() != "adaptive" {
			return nil, d.Errf("cascade: unknown option %q: expected adaptive or rls", d.Val())
		}
		cfg := &app.Adaptive.Config
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			opt := d.Val()
			if opt == "signal" {
				sc, err := parseSignal(d)
				if err != nil {
					return nil, err
				}
				cfg.Signals = append(cfg.Signals, sc)
				continue
			}
			if opt == "share" {
				app.Share = &storeconfig.Redis{}
				if err := storeconfig.ParseRedis(d, app.Share); err != nil {
					return nil, err
				}
				continue
			}
			args := d.RemainingArgs()
			dur := func(i int) (time.Duration, error) {
				v, err := caddy.ParseDuration(args[i])
				if err != nil || v <= 0 {
					return 0, d.Errf("adaptive %s: %q is not a positive duration", opt, args[i])
				}
				return v, nil
			}
			num := func(i int) (float64, error) {
				v, err := strconv.ParseFloat(args[i], 64)
				if err != nil || v < 0 {
					return 0, d.Errf("adaptive %s: %q is not a non-negative number", opt, args[i])
				}
				return v, nil
			}
			want := map[string]int{"interval": 1, "floor": 1, "cpu": 2, "memory": 2, "error_rate": 2, "latency": 2,
				"latency_window": 1, "min_requests": 1, "recovery_delay": 1, "recovery_time": 1}[opt]
			if want == 0 {
				return nil, d.Errf("adaptive: unknown option %q: expected interval, floor, cpu, memory, error_rate, latency, latency_window, min_requests, recovery_delay, recovery_time, signal or share", opt)
			}
			if want == 2 && len(args) == 1 && args[0] == "off" {
				switch opt {
				case "latency":
					cfg.Latency.Disabled = true
				default:
					map[string]*adaptive.Thresholds{"cpu": &cfg.CPU, "memory": &cfg.Memory, "error_rate": &cfg.ErrorRate}[opt].Disabled = true
				}
				continue
			}
			if len(args) != want {
				return nil, d.Errf("adaptive %s takes %d value(s), got %d", opt, want, len(args))
			}
			var err error
			switch opt {
			case "interval":
				cfg.Interval, err = dur(0)
			case "latency_window":
				cfg.LatencyWindow, err = dur(0)
			case "recovery_time":
				cfg.RecoveryTime, err = dur(0)
			case "recovery_delay":
				cfg.RecoveryDelay, err = dur(0)
			case "floor":
				cfg.Floor, err = num(0)
			case "min_requests":
				var n float64
				n, err = num(0)
				cfg.MinRequests = int(n)
			case "latency":
				if cfg.Latency.Warn, err = dur(0); err == nil {
					cfg.Latency.Critical, err = dur(1)
				}
			default:
				t := map[string]*adaptive.Thresholds{"cpu": &cfg.CPU, "memory": &cfg.Memory, "error_rate": &cfg.ErrorRate}[opt]
				if t.Warn, err = num(0); err == nil {
					t.Critical, err = num(1)
				}
			}
			if err != nil {
				return nil, err
			}
		}
		if err := cfg.WithDefaults().Validate(); err != nil {
			return nil, d.Errf("%v", err)
		}
	}
	return httpcaddyfile.App{Name: "cascade", Value: caddyconfig.JSON(app, nil)}, nil
}
