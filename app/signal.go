package app

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-cascade/cascade/adaptive"
)

// parseSignal parses an external signal of the `cascade { adaptive { … } }`
// global option, the dispenser on its `signal` token (see
// parseGlobalOption for the syntax and adaptive.SignalConfig for the
// meaning). What the config means is checked by adaptive.Config.Validate,
// after the whole block is read.
func parseSignal(d *caddyfile.Dispenser) (adaptive.SignalConfig, error) {
	var s adaptive.SignalConfig
	if !d.NextArg() {
		return s, d.Err("adaptive signal: give it a name: signal <name> { … }")
	}
	s.Name = d.Val()
	if d.NextArg() {
		return s, d.Errf("adaptive signal %s: unexpected %q: the signal's options go in a block", s.Name, d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		args := d.RemainingArgs()
		errf := func(format string, a ...any) error {
			return d.Errf("adaptive signal %s: %s: "+format, append([]any{s.Name, opt}, a...)...)
		}
		nargs := func(n int, usage string) error {
			if len(args) != n {
				return errf("want %s", usage)
			}
			return nil
		}
		num := func(usage string) (float64, error) {
			if err := nargs(1, usage); err != nil {
				return 0, err
			}
			v, err := strconv.ParseFloat(args[0], 64)
			if err != nil {
				return 0, errf("%q is not a number", args[0])
			}
			return v, nil
		}
		dur := func() (time.Duration, error) {
			if err := nargs(1, opt+" <duration>"); err != nil {
				return 0, err
			}
			v, err := caddy.ParseDuration(args[0])
			if err != nil || v <= 0 {
				return 0, errf("%q is not a positive duration", args[0])
			}
			return v, nil
		}
		var err error
		switch opt {
		case "prometheus":
			if len(args) == 4 && args[2] == "/" {
				s.Prometheus = &adaptive.PrometheusSignal{URL: args[0], Metric: args[1], DivideBy: args[3]}
			} else if err = nargs(2, `prometheus <url> <metric{label="value"}> [/ <metric{label="value"}>]`); err == nil {
				s.Prometheus = &adaptive.PrometheusSignal{URL: args[0], Metric: args[1]}
			}
		case "http":
			if err = nargs(2, "http <url> <dotted.json.field>"); err == nil {
				s.HTTP = &adaptive.HTTPSignal{URL: args[0], Field: args[1]}
			}
		case "response_header":
			if err = nargs(1, "response_header <header name>"); err == nil {
				s.ResponseHeader = args[0]
			}
		case "in_flight":
			var v float64
			if v, err = num("in_flight <maximum requests in flight>"); err == nil {
				if v != float64(int(v)) || v <= 0 {
					err = errf("%q: the maximum is a positive whole number of requests", args[0])
				}
				s.InFlight = int(v)
			}
		case "warn":
			s.Warn, err = num("warn <value>")
		case "critical":
			s.Critical, err = num("critical <value>")
		case "interval":
			s.Interval, err = dur()
		case "timeout":
			s.Timeout, err = dur()
		case "smoothing":
			s.Smoothing, err = dur()
		case "on_error":
			if err = nargs(1, "on_error ignore|critical"); err == nil {
				s.OnError = adaptive.OnError(args[0])
			}
		default:
			err = d.Errf("adaptive signal %s: unknown option %q: expected prometheus, http, response_header, in_flight, warn, critical, interval, timeout, smoothing or on_error", s.Name, opt)
		}
		if err != nil {
			return s, err
		}
	}
	return s, nil
}
