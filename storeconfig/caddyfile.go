package storeconfig

import (
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-cascade/cascade/internal/caddyfileopt"
	"github.com/caddy-cascade/cascade/store"
)

// The options each block of a store redis takes, as its parser reads them:
// its error messages list them, and a test holds the reference to them.
// Read only.
var (
	redisOptions = []string{"address", "master_name", "cluster", "username", "password", "sentinel_username", "sentinel_password", "db", "tls", "dial_timeout", "read_timeout", "write_timeout", "pool_size", "key_prefix", "bus_secret", "insecure_bus", "timeout", "breaker", "slot_ttl", "tenant_in_flight", "lease"}
	tlsOptions   = []string{"server_name", "ca"}
	leaseOptions = []string{"max_share", "min_remaining", "ttl", "max_paths"}
)

// CaddyfileOptions are the options of each block of a store redis, by
// block ("store redis", "tls", "lease"): for a reference to be checked
// against.
func CaddyfileOptions() map[string][]string {
	return map[string][]string{"store redis": redisOptions, "tls": tlsOptions, "lease": leaseOptions}
}

func ParseRedis(d *caddyfile.Dispenser, r *Redis) error {
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch opt := d.Val(); opt {
		case "address", "addresses":
			for _, a := range d.RemainingArgs() {
				if !strings.Contains(a, "{") { // a placeholder is checked once resolved
					if err := store.ValidateRedisAddress(a); err != nil {
						return d.Err(err.Error())
					}
				}
				r.Addresses = append(r.Addresses, a)
			}
			if len(r.Addresses) == 0 {
				return d.Errf("address needs host:port, or the path of a Unix socket")
			}
		case "master_name":
			err = caddyfileopt.Str(d, &r.MasterName)
		case "cluster":
			r.Cluster = true
		case "username":
			err = caddyfileopt.Str(d, &r.Username)
		case "password":
			err = caddyfileopt.Str(d, &r.Password)
		case "sentinel_username":
			err = caddyfileopt.Str(d, &r.SentinelUsername)
		case "sentinel_password":
			err = caddyfileopt.Str(d, &r.SentinelPassword)
		case "db":
			r.DB, err = caddyfileopt.Int(d)
		case "pool_size":
			r.PoolSize, err = caddyfileopt.Int(d)
		case "tenant_in_flight":
			r.TenantInFlight, err = caddyfileopt.Int(d)
		case "key_prefix":
			err = caddyfileopt.Str(d, &r.KeyPrefix)
		case "bus_secret", "insecure_bus":
			err = parseRedisBus(d, r)
		case "dial_timeout", "read_timeout", "write_timeout", "timeout", "slot_ttl":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, perr := caddy.ParseDuration(d.Val())
			if perr != nil || dur <= 0 {
				return d.Errf("%s %q: use a positive duration such as 250ms", opt, d.Val())
			}
			switch opt {
			case "dial_timeout":
				r.DialTimeout = caddy.Duration(dur)
			case "read_timeout":
				r.ReadTimeout = caddy.Duration(dur)
			case "write_timeout":
				r.WriteTimeout = caddy.Duration(dur)
			case "slot_ttl":
				r.SlotTTL = caddy.Duration(dur)
			default:
				r.Timeout = caddy.Duration(dur)
			}
		case "breaker":
			args := d.RemainingArgs()
			switch {
			case len(args) == 1 && args[0] == "off":
				r.Breaker = &Breaker{}
			case len(args) == 1 || len(args) == 2:
				n, cerr := strconv.Atoi(args[0])
				if cerr != nil || n < 1 {
					return d.Errf("breaker %q: give the failures in a row that open it (a positive number), e.g. breaker 3 1s, or breaker off", args[0])
				}
				r.Breaker = &Breaker{Failures: n}
				if len(args) == 2 {
					dur, perr := caddy.ParseDuration(args[1])
					if perr != nil || dur <= 0 {
						return d.Errf("breaker cooldown %q: use a positive duration such as 1s", args[1])
					}
					r.Breaker.Cooldown = caddy.Duration(dur)
				}
			default:
				return d.Errf("usage: breaker <failures> [<cooldown>], or breaker off")
			}
		case "lease":
			err = parseLease(d, r)
		case "tls":
			r.TLS = &TLS{}
			for _, a := range d.RemainingArgs() {
				if a != "insecure" {
					return d.Errf("tls: unexpected %q (only insecure)", a)
				}
				r.TLS.InsecureSkipVerify = true
			}
			for n := d.Nesting(); d.NextBlock(n); {
				switch d.Val() {
				case "server_name":
					err = caddyfileopt.Str(d, &r.TLS.ServerName)
				case "ca":
					err = caddyfileopt.Str(d, &r.TLS.CA)
				default:
					return caddyfileopt.Unknown(d, "tls", d.Val(), tlsOptions, "")
				}
				if err != nil {
					return err
				}
			}
		default:
			return caddyfileopt.Unknown(d, "store redis", opt, redisOptions, "")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parseLease reads `lease [{ max_share … min_remaining … ttl … max_paths … }]`.
func parseLease(d *caddyfile.Dispenser, r *Redis) error {
	if d.NextArg() {
		return d.Errf("lease takes no arguments: write its options in a block (max_share, min_remaining, ttl, max_paths)")
	}
	r.Lease = &Lease{}
	for n := d.Nesting(); d.NextBlock(n); {
		opt := d.Val()
		args := d.RemainingArgs()
		if len(args) != 1 {
			return d.Errf("lease %s takes one value", opt)
		}
		switch opt {
		case "max_share":
			v, err := parseFraction(args[0])
			if err != nil || v <= 0 || v > 1 {
				return d.Errf("lease max_share %q: give a fraction of what remains above 0 and at most 1, e.g. 0.1 or 10%%", args[0])
			}
			r.Lease.MaxShare = v
		case "min_remaining":
			v, err := parseFraction(args[0])
			if err != nil || v < 0 || v >= 1 {
				return d.Errf("lease min_remaining %q: give a fraction of the capacity from 0 up to (not including) 1, e.g. 0.05 or 5%%", args[0])
			}
			r.Lease.MinRemaining = v
		case "ttl":
			dur, err := caddy.ParseDuration(args[0])
			if err != nil || dur <= 0 || dur > time.Minute {
				return d.Errf("lease ttl %q: give a positive duration of at most a minute, e.g. 1s", args[0])
			}
			r.Lease.TTL = caddy.Duration(dur)
		case "max_paths":
			n, err := strconv.Atoi(args[0])
			if err != nil || n <= 0 {
				return d.Errf("lease max_paths %q: give a positive number of paths, e.g. 100000", args[0])
			}
			r.Lease.MaxPaths = n
		default:
			return caddyfileopt.Unknown(d, "lease", opt, leaseOptions, "")
		}
	}
	return nil
}

// parseFraction reads 0.05 or 5%.
func parseFraction(s string) (float64, error) {
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		return v / 100, err
	}
	return strconv.ParseFloat(s, 64)
}

// parseRedisBus parses the bus options of a redis store block (its
// caller, parseRedis, is on the option's name):
//
//	bus_secret <secret>|<placeholder>   # authenticate Pub/Sub messages between instances
//	insecure_bus                        # send and accept them unauthenticated
func parseRedisBus(d *caddyfile.Dispenser, r *Redis) error {
	opt := d.Val()
	switch opt {
	case "bus_secret":
		if !d.NextArg() {
			return d.Errf("bus_secret needs a value: a secret of at least %d bytes, the same on every instance, or a placeholder such as {env.CASCADE_BUS_SECRET}", minBusSecret)
		}
		r.BusSecret = d.Val()
		if !strings.Contains(r.BusSecret, "{") && len(r.BusSecret) < minBusSecret {
			return d.Errf("bus_secret is %d bytes: give at least %d (e.g. the output of openssl rand -base64 32), or a placeholder such as {env.CASCADE_BUS_SECRET}", len(r.BusSecret), minBusSecret)
		}
	case "insecure_bus":
		r.InsecureBus = true
	default:
		return d.Errf("store redis: %q is not a bus option (bus_secret, insecure_bus)", opt)
	}
	if d.NextArg() {
		if opt == "insecure_bus" {
			return d.Errf("insecure_bus takes no value")
		}
		return d.Errf("bus_secret takes one value (quote a secret with spaces)")
	}
	if r.BusSecret != "" && r.InsecureBus {
		return d.Errf("bus_secret and insecure_bus contradict each other: keep bus_secret (messages authenticated) or insecure_bus (not)")
	}
	return nil
}
