package cascade

import (
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-cascade/cascade/store"
)

func (h *Handler) parseStore(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("usage: store memory|redis { ... }")
	}
	kind := d.Val()
	if d.NextArg() { // store redis <name> { ... }: a store for routes
		name := d.Val()
		if kind != "redis" {
			return d.Errf("store %s %s: only redis stores are named (for route): a memory store is this process's", kind, name)
		}
		if h.Stores[name] != nil {
			return d.Errf("store redis %s given twice", name)
		}
		if h.Stores == nil {
			h.Stores = map[string]*StoreConfig{}
		}
		r := &RedisStoreConfig{}
		h.Stores[name] = &StoreConfig{Redis: r}
		return parseRedis(d, r)
	}
	if h.Store != nil {
		return d.Errf("store already configured")
	}
	switch kind {
	case "memory":
		m := &MemoryStoreConfig{}
		h.Store = &StoreConfig{Memory: m}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			var err error
			switch d.Val() {
			case "name":
				if !d.NextArg() {
					return d.ArgErr()
				}
				m.Name = d.Val()
			case "max_keys":
				m.MaxKeys, err = intArg(d)
			default:
				return unknownOption(d, "store memory", d.Val(), memoryOptions)
			}
			if err != nil {
				return err
			}
		}
	case "redis":
		r := &RedisStoreConfig{}
		h.Store = &StoreConfig{Redis: r}
		return parseRedis(d, r)
	default:
		return d.Errf("unknown store %q: use memory (default) or redis", d.Val())
	}
	return nil
}

func parseRedis(d *caddyfile.Dispenser, r *RedisStoreConfig) error {
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
			err = strArg(d, &r.MasterName)
		case "cluster":
			r.Cluster = true
		case "username":
			err = strArg(d, &r.Username)
		case "password":
			err = strArg(d, &r.Password)
		case "sentinel_username":
			err = strArg(d, &r.SentinelUsername)
		case "sentinel_password":
			err = strArg(d, &r.SentinelPassword)
		case "db":
			r.DB, err = intArg(d)
		case "pool_size":
			r.PoolSize, err = intArg(d)
		case "tenant_in_flight":
			r.TenantInFlight, err = intArg(d)
		case "key_prefix":
			err = strArg(d, &r.KeyPrefix)
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
				r.Breaker = &RedisBreaker{}
			case len(args) == 1 || len(args) == 2:
				n, cerr := strconv.Atoi(args[0])
				if cerr != nil || n < 1 {
					return d.Errf("breaker %q: give the failures in a row that open it (a positive number), e.g. breaker 3 1s, or breaker off", args[0])
				}
				r.Breaker = &RedisBreaker{Failures: n}
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
			r.TLS = &RedisTLS{}
			for _, a := range d.RemainingArgs() {
				if a != "insecure" {
					return d.Errf("tls: unexpected %q (only insecure)", a)
				}
				r.TLS.InsecureSkipVerify = true
			}
			for n := d.Nesting(); d.NextBlock(n); {
				switch d.Val() {
				case "server_name":
					err = strArg(d, &r.TLS.ServerName)
				case "ca":
					err = strArg(d, &r.TLS.CA)
				default:
					return unknownOption(d, "tls", d.Val(), tlsOptions)
				}
				if err != nil {
					return err
				}
			}
		default:
			return unknownOption(d, "store redis", opt, redisOptions)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parseLease reads `lease [{ max_share … min_remaining … ttl … max_paths … }]`.
func parseLease(d *caddyfile.Dispenser, r *RedisStoreConfig) error {
	if d.NextArg() {
		return d.Errf("lease takes no arguments: write its options in a block (max_share, min_remaining, ttl, max_paths)")
	}
	r.Lease = &RedisLease{}
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
			return unknownOption(d, "lease", opt, leaseOptions)
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
func parseRedisBus(d *caddyfile.Dispenser, r *RedisStoreConfig) error {
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
