// Package storeconfig is where rate limit state lives, as a Caddy
// configuration says it: the memory store or Redis (standalone, Sentinel,
// Cluster), with its leases, circuit breaker and Pub/Sub settings; its
// Caddyfile; and the open stores, shared by every handler and app that
// names the same store and kept across config reloads. The rate_limit
// handler and the cascade app both open their stores here.
package storeconfig

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/lease"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/topk"
)

// stores holds the open stores, shared by every handler that configures the
// same store and carried across config reloads: a reload must not reset
// anyone's limits (nor drop Redis connections).
var stores = caddy.NewUsagePool()

// Config selects where limit state lives. Set at most one of Memory and
// Redis; neither means the default memory store.
type Config struct {
	Memory *Memory `json:"memory,omitempty"`
	Redis  *Redis  `json:"redis,omitempty"`
}

// Memory configures the embedded store. Its state is in this
// process only, and survives config reloads.
type Memory struct {
	// Name identifies the store: handlers naming the same store share its
	// state (and trees of the same name share buckets). Default "default".
	Name string `json:"name,omitempty"`
	// MaxKeys caps the buckets tracked (default 1,000,000). At the cap the
	// bucket nearest to expiry, among a sample, is evicted and counted.
	MaxKeys int `json:"max_keys,omitempty"`
	// MaxReplayBytes bounds, in bytes, the responses kept for idempotent
	// replay (default 64 MiB), apart from the buckets: past it the oldest
	// responses are cut to their first 64 bytes, then the oldest of those
	// dropped (see store.Memory.KeepResponse).
	MaxReplayBytes int64 `json:"max_replay_bytes,omitempty"`
}

// Redis configures the Redis store (standalone, Sentinel or Cluster).
type Redis struct {
	// Addresses of the Redis server, Sentinels or Cluster nodes
	// (host:port), or the absolute path of a single server's Unix socket;
	// placeholders such as {env.REDIS_ADDR} are resolved. Default
	// localhost:6379.
	Addresses []string `json:"addresses,omitempty"`
	// MasterName selects Sentinel: the name of the monitored master.
	MasterName string `json:"master_name,omitempty"`
	// Cluster forces a Redis Cluster client (otherwise chosen when
	// several addresses are given without a master name).
	Cluster  bool   `json:"cluster,omitempty"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	// SentinelUsername and SentinelPassword authenticate to the
	// Sentinels (master_name only).
	SentinelUsername string `json:"sentinel_username,omitempty"`
	SentinelPassword string `json:"sentinel_password,omitempty"`
	DB               int    `json:"db,omitempty"`
	// TLS, when set, connects with TLS.
	TLS *TLS `json:"tls,omitempty"`

	DialTimeout  caddy.Duration `json:"dial_timeout,omitempty"`
	ReadTimeout  caddy.Duration `json:"read_timeout,omitempty"`
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`
	PoolSize     int            `json:"pool_size,omitempty"`
	// KeyPrefix starts every key; default "cascade:". No braces.
	KeyPrefix string `json:"key_prefix,omitempty"`
	// Timeout bounds one decision, so a slow or dead Redis never hangs a
	// request (then on_store_error applies). Default 250ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	// Breaker stops waiting on a Redis that keeps failing: after Failures
	// calls in a row have failed, calls fail at once (on_store_error
	// applies in microseconds) while Redis is pinged every Cooldown in the
	// background, until it answers. Default 3 failures, 1s; failures 0
	// turns it off.
	Breaker *Breaker `json:"breaker,omitempty"`
	// SlotTTL is how long a concurrency slot (a `concurrent` limit) is
	// kept without its holder renewing it: an instance renews the slots of
	// its requests in flight every third of it, so the slots of an
	// instance that crashed come back within SlotTTL. Default 30s.
	SlotTTL caddy.Duration `json:"slot_ttl,omitempty"`
	// TenantInFlight caps one tenant's decisions queued for or on their
	// way to this Redis (per server; per master of a Cluster): beyond it a
	// decision fails at once, and on_store_error applies to it. Tenants
	// take turns in each batch of decisions whether or not it is set, so
	// one tenant's flood delays its own decisions, not others'; the cap
	// also sheds the flood's excess at once rather than at its timeout.
	// Default 0: no cap.
	TenantInFlight int `json:"tenant_in_flight,omitempty"`
	// Lease, when set, decides most requests in memory on capacity leased
	// from Redis (package lease): never more admitted than the limits,
	// bounded under-admission, strict decisions near exhaustion.
	Lease *Lease `json:"lease,omitempty"`
	// BusSecret authenticates the messages the instances sharing this
	// Redis send each other over Pub/Sub (lease resets, held requests):
	// each carries an HMAC-SHA256 under a key derived from it, and one
	// that does not verify is dropped and counted. At least 16 bytes,
	// the same on every instance; a placeholder such as
	// {env.CASCADE_BUS_SECRET} is resolved (and keeps the secret out of
	// the config Caddy shows). Without it, the key is derived from the
	// store's username and password when there is a password; with
	// neither, messages are not authenticated and provisioning warns.
	BusSecret string `json:"bus_secret,omitempty"`
	// InsecureBus sends and accepts the messages unauthenticated even
	// when a password could key them: for a fleet that mixes instances
	// with different credentials, or older ones, during a migration.
	InsecureBus bool `json:"insecure_bus,omitempty"`
}

// minBusSecret is the shortest bus_secret taken, in bytes.
const minBusSecret = 16

// busKey is the key that authenticates the store's Pub/Sub messages (see
// BusSecret), nil when they are not authenticated, and how it was chosen
// (for the log: never the secret).
func (c *Redis) busKey() (key []byte, how string, err error) {
	repl := caddy.NewReplacer()
	if c.BusSecret != "" {
		if c.InsecureBus {
			return nil, "", errors.New("redis: bus_secret and insecure_bus contradict each other: keep bus_secret (messages authenticated) or insecure_bus (not)")
		}
		secret := repl.ReplaceAll(c.BusSecret, "")
		name := "bus_secret" // never the secret itself
		if t := strings.TrimSpace(c.BusSecret); strings.HasPrefix(t, "{") && strings.HasSuffix(t, "}") && strings.Count(t, "{") == 1 {
			name = "bus_secret " + t // one placeholder: which variable to set
		}
		switch {
		case secret == "":
			return nil, "", fmt.Errorf("redis %s resolved to nothing: set what it names (e.g. the environment variable of {env.NAME})", name)
		case len(secret) < minBusSecret:
			return nil, "", fmt.Errorf("redis %s is %d bytes: give at least %d, the same on every instance (e.g. the output of openssl rand -base64 32)", name, len(secret), minBusSecret)
		}
		return store.BusKey(secret, false), "bus_secret", nil
	}
	if c.InsecureBus {
		return nil, "insecure_bus", nil
	}
	if password := repl.ReplaceAll(c.Password, ""); password != "" {
		return store.BusKey(repl.ReplaceAll(c.Username, "")+"\x00"+password, true), "credentials", nil
	}
	return nil, "", nil
}

// Lease configures capacity leases (see package lease for the
// defaults and what each bounds).
type Lease struct {
	// MaxShare is the largest fraction of what remains on a bucket that
	// one lease takes (default 0.1).
	MaxShare float64 `json:"max_share,omitempty"`
	// MinRemaining is the fraction of a bucket's capacity below which it
	// grants no lease (default 0.05).
	MinRemaining float64 `json:"min_remaining,omitempty"`
	// TTL is how long a lease may be spent (default 1s, at most 1m).
	TTL caddy.Duration `json:"ttl,omitempty"`
	// MaxPaths bounds the paths (a request's buckets) whose leases this
	// instance tracks (default 100,000); beyond it, a new path is decided
	// in Redis request by request until idle paths are forgotten. The room
	// set aside up front for leases' state is sized from it: 16 records
	// of 96 bytes a path, at most 16 MiB (the default's).
	MaxPaths int `json:"max_paths,omitempty"`
}

// Options translates the JSON config into lease.Options.
func (l *Lease) Options(logger *zap.Logger) (lease.Options, error) {
	o := lease.Options{MaxShare: l.MaxShare, MinRemaining: l.MinRemaining, TTL: time.Duration(l.TTL), MaxPaths: l.MaxPaths, Logger: logger}
	if err := o.Validate(); err != nil {
		return o, err
	}
	return o, nil
}

// Breaker configures the Redis store's circuit breaker.
type Breaker struct {
	Failures int            `json:"failures"`
	Cooldown caddy.Duration `json:"cooldown,omitempty"`
}

// TLS configures TLS to Redis.
type TLS struct {
	ServerName         string `json:"server_name,omitempty"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify,omitempty"`
	// CA is a PEM file of the authorities to trust (default: the system's).
	CA string `json:"ca,omitempty"`
}

// Pooled is a store in the usage pool, with what lives as long as it: the
// runtime state kept in it (overrides and modes, package control) and the
// most-denied keys of its buckets.
type Pooled struct {
	store.Store
	Redis    *store.Redis    // the Redis store (under the leases, if any); nil for memory
	Lease    *lease.Store    // the lease store wrapping it, when leases are on
	LeaseBus *store.Bus      // tells the other instances' lease stores of resets
	Presence *store.Presence // the instances sharing the Redis store (started by on_store_error local)
	Runtime  *control.Runtime
	Top      *topk.Sketch
	Name     string // for logs, metrics and the admin API: "memory/default", "redis/host:port"

	settings *memorySettings // a memory store's, per configuration
}

// leaseChannel is the Redis Pub/Sub channel, after the key prefix, on
// which the lease stores of the instances sharing a Redis store tell each
// other of resets.
const leaseChannel = "leases"

// topKeys is how many of the most-denied keys a store's sketch tracks.
const topKeys = 1000

// Opened is a store as Open returns it.
type Opened struct {
	Pooled
	// PoolKey is its place in the pool: Release it when the configuration
	// that opened it is cleaned up.
	PoolKey string
	// Apply, when not nil, applies settings at the first request (see
	// memorySettings).
	Apply func()
}

// memorySettings are the settings each configuration gives a shared memory
// store. A configuration is identified by the Done channel of its context,
// which all its servers' contexts share and no other configuration's.
//
// The handlers of one configuration agree on the store's settings (a value
// set by one of them, the default when none does; two different values are
// a configuration error). They apply at once when the configuration opened
// the store, else when any of its handlers serves its first request: a
// configuration that fails to load changes nothing, and one that drops a
// setting restores its default.
type memorySettings struct {
	mem     *store.Memory
	created <-chan struct{} // the configuration that opened the store

	mu      sync.Mutex
	configs map[<-chan struct{}]*configSettings
}

// configSettings are one configuration's settings of a memory store.
type configSettings struct {
	maxKeys   int           // 0: not set
	maxReplay int64         // 0: not set
	sweep     time.Duration // 0: not set
	once      sync.Once
}

// options are the store options the settings mean, defaults filled in.
func (c *configSettings) options() store.MemoryOptions {
	o := store.MemoryOptions{MaxKeys: c.maxKeys, MaxReplayBytes: c.maxReplay, SweepInterval: c.sweep}
	if o.MaxKeys == 0 {
		o.MaxKeys = 1_000_000
	}
	if o.MaxReplayBytes == 0 {
		o.MaxReplayBytes = store.DefaultMaxReplayBytes
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = time.Minute
	}
	return o
}

// add merges one handler's settings into its configuration's, and returns
// what the handler must run at its first request (nil when nothing waits).
func (s *memorySettings) add(config <-chan struct{}, name string, maxKeys int, maxReplay int64, sweep time.Duration) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.configs[config]
	if c == nil {
		for done := range s.configs { // forget configurations no longer loaded
			select {
			case <-done:
				delete(s.configs, done)
			default:
			}
		}
		c = &configSettings{}
		s.configs[config] = c
	}
	if maxKeys > 0 {
		if c.maxKeys != 0 && c.maxKeys != maxKeys {
			return nil, fmt.Errorf("memory store %s: max_keys %d here, %d in another handler: give them one value", name, maxKeys, c.maxKeys)
		}
		c.maxKeys = maxKeys
	}
	if maxReplay > 0 {
		if c.maxReplay != 0 && c.maxReplay != maxReplay {
			return nil, fmt.Errorf("memory store %s: max_replay_bytes %d here, %d in another handler: give them one value", name, maxReplay, c.maxReplay)
		}
		c.maxReplay = maxReplay
	}
	if sweep > 0 {
		if c.sweep != 0 && c.sweep != sweep {
			return nil, fmt.Errorf("memory store %s: sweep_interval %v here, %v in another handler: give them one value", name, sweep, c.sweep)
		}
		c.sweep = sweep
	}
	if config == s.created {
		s.mem.Reconfigure(c.options()) // the store is this configuration's own
		return nil, nil
	}
	return func() { c.once.Do(func() { s.mem.Reconfigure(c.options()) }) }, nil
}

func (p Pooled) Destruct() error {
	if p.LeaseBus != nil {
		_ = p.LeaseBus.Close()
	}
	if p.Presence != nil {
		p.Presence.Close()
	}
	if p.Runtime != nil {
		_ = p.Runtime.Close()
	}
	return p.Close()
}

// Open returns the configured store from the pool, opening it if needed.
// For a memory store that a previous configuration opened (a reload), it
// returns apply, for the handler to run at its first request (see
// memorySettings).
func (c *Config) Open(ctx caddy.Context, sweep time.Duration) (Opened, error) {
	if c.Memory != nil && c.Redis != nil {
		return Opened{}, errors.New("configure one store: memory or redis")
	}
	if c.Redis != nil {
		opts, err := c.Redis.Options(ctx.Logger())
		if err != nil {
			return Opened{}, err
		}
		var leaseOpts *lease.Options
		if c.Redis.Lease != nil {
			lo, err := c.Redis.Lease.Options(ctx.Logger())
			if err != nil {
				return Opened{}, err
			}
			leaseOpts = &lo
		}
		busKey, busHow, err := c.Redis.busKey()
		if err != nil {
			return Opened{}, err
		}
		key, _ := json.Marshal(c.Redis)
		poolKey := "redis/" + string(key)
		v, _, err := stores.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
			s, err := store.NewRedis(ctx, opts)
			if errors.Is(err, store.ErrUnavailable) {
				// Start anyway: until Redis answers, on_store_error decides,
				// and the scripts load with the first decisions.
				ctx.Logger().Warn("redis unreachable at start-up; rate limits apply on_store_error until it answers",
					zap.Strings("addresses", opts.Addrs), zap.Error(err))
				opts.LazyLoad = true
				s, err = store.NewRedis(ctx, opts)
			}
			if err != nil {
				return nil, err
			}
			name := "redis/" + strings.Join(opts.Addrs, ",")
			if opts.MasterName != "" {
				name += "/" + opts.MasterName
			}
			if opts.DB != 0 {
				name += "/db" + strconv.Itoa(opts.DB)
			}
			logger := ctx.Logger().With(zap.String("store", name))
			// Before any Bus opens (the lease bus below, the waiting one
			// of max_wait): every message is signed and checked.
			s.SetBusKey(busKey)
			switch busHow {
			case "":
				logger.Warn("redis store: the messages instances send each other over Pub/Sub (lease resets, held requests) are not authenticated: anyone who may PUBLISH on this Redis can forge them; set bus_secret (or a password), or insecure_bus to say this is intended")
			case "insecure_bus":
				logger.Info("redis store: Pub/Sub messages between instances are not authenticated (insecure_bus)")
			default:
				logger.Debug("redis store: Pub/Sub messages between instances are authenticated", zap.String("key_from", busHow))
			}
			if opts.Breaker.Failures > 0 {
				// Set before any decision: the store is not shared yet.
				s.SetBreakerChange(func(node string, open bool, err error) {
					if open {
						logger.Warn("redis circuit breaker open: calls to this master fail at once (on_store_error applies) while it is probed in the background",
							zap.String("node", node), zap.Int("failures", opts.Breaker.Failures), zap.Error(err))
					} else {
						logger.Info("redis circuit breaker closed: the master answers again, or its slots have a new one",
							zap.String("node", node))
					}
				})
			}
			rt, err := control.New(control.NewRedisBackend(s.Client(), opts.KeyPrefix), control.Options{Logger: logger})
			if err != nil {
				s.Close()
				return nil, fmt.Errorf("runtime state: %w", err)
			}
			p := Pooled{Store: s, Redis: s, Runtime: rt, Top: topk.New(topKeys), Name: name,
				Presence: s.NewPresence(time.Second)}
			if leaseOpts != nil {
				leaseOpts.Logger = logger
				ls, err := lease.New(s, *leaseOpts)
				if err != nil {
					rt.Close()
					s.Close()
					return nil, err
				}
				p.Store, p.Lease = ls, ls
				// Another instance's reset revokes this one's leases on
				// the reset buckets at once, not at their TTL.
				p.LeaseBus = s.OpenBus(leaseChannel, ls.Receive)
				ls.Connect(p.LeaseBus)
			} else {
				// Without leases here, the resets made through this
				// instance still end the leases other instances hold
				// on the reset buckets.
				lease.TellResets(s, leaseChannel, logger)
			}
			return p, nil
		})
		if err != nil {
			return Opened{}, err
		}
		return Opened{Pooled: v.(Pooled), PoolKey: poolKey}, nil
	}
	m := c.Memory
	if m == nil {
		m = &Memory{}
	}
	if m.MaxKeys < 0 {
		return Opened{}, fmt.Errorf("memory max_keys %d must not be negative", m.MaxKeys)
	}
	if m.MaxReplayBytes < 0 {
		return Opened{}, fmt.Errorf("memory max_replay_bytes %d must not be negative: give a size in bytes, or 0 for the default (64 MiB)", m.MaxReplayBytes)
	}
	name := m.Name
	if name == "" {
		name = "default"
	}
	poolKey := "memory/" + name
	v, _, err := stores.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		mem := store.NewMemory(store.MemoryOptions{MaxKeys: m.MaxKeys, MaxReplayBytes: m.MaxReplayBytes, SweepInterval: sweep})
		rt, err := control.New(control.NewMemoryBackend(), control.Options{Logger: ctx.Logger().With(zap.String("store", poolKey))})
		if err != nil {
			mem.Close()
			return nil, fmt.Errorf("runtime state: %w", err)
		}
		return Pooled{
			Store: mem, Runtime: rt, Top: topk.New(topKeys), Name: poolKey,
			settings: &memorySettings{mem: mem, created: ctx.Done(), configs: map[<-chan struct{}]*configSettings{}},
		}, nil
	})
	if err != nil {
		return Opened{}, err
	}
	p := v.(Pooled)
	if p.settings == nil { // not a memory store: the pool key says it is
		return Opened{Pooled: p, PoolKey: poolKey}, nil
	}
	apply, err := p.settings.add(ctx.Done(), name, m.MaxKeys, m.MaxReplayBytes, sweep)
	if err != nil {
		stores.Delete(poolKey)
		return Opened{}, err
	}
	return Opened{Pooled: p, PoolKey: poolKey, Apply: apply}, nil
}

// Options translates the JSON config into store.RedisOptions.
func (c *Redis) Options(logger *zap.Logger) (store.RedisOptions, error) {
	repl := caddy.NewReplacer()
	opts := store.RedisOptions{
		Logger:     logger,
		MasterName: repl.ReplaceAll(c.MasterName, ""),
		Cluster:    c.Cluster,
		Username:   repl.ReplaceAll(c.Username, ""),
		Password:   repl.ReplaceAll(c.Password, ""),
		DB:         c.DB,
		// Sentinels authenticate on their own (their requirepass).
		SentinelUsername: repl.ReplaceAll(c.SentinelUsername, ""),
		SentinelPassword: repl.ReplaceAll(c.SentinelPassword, ""),
		DialTimeout:      time.Duration(c.DialTimeout),
		ReadTimeout:      time.Duration(c.ReadTimeout),
		WriteTimeout:     time.Duration(c.WriteTimeout),
		PoolSize:         c.PoolSize,
		KeyPrefix:        c.KeyPrefix,
		Timeout:          time.Duration(c.Timeout),
		SlotTTL:          time.Duration(c.SlotTTL),
		Breaker:          store.BreakerOptions{Failures: 3, Cooldown: time.Second},

		TenantInFlight: c.TenantInFlight,
	}
	if c.TenantInFlight < 0 {
		return opts, fmt.Errorf("redis tenant_in_flight %d: give a positive number of decisions, or 0 for no cap", c.TenantInFlight)
	}
	if b := c.Breaker; b != nil {
		if b.Failures < 0 || b.Cooldown < 0 {
			return opts, errors.New("redis breaker: failures and cooldown must not be negative (failures 0 turns it off)")
		}
		opts.Breaker = store.BreakerOptions{Failures: b.Failures, Cooldown: time.Duration(b.Cooldown)}
	}
	for _, template := range c.Addresses {
		a := strings.TrimSpace(repl.ReplaceAll(template, ""))
		if a == "" {
			return opts, fmt.Errorf("redis address %q resolved to nothing: set what it names (e.g. the environment variable of {env.NAME})", template)
		}
		opts.Addrs = append(opts.Addrs, a)
	}
	if len(opts.Addrs) == 0 {
		opts.Addrs = []string{"localhost:6379"}
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = "cascade:"
	}
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return opts, fmt.Errorf("redis key_prefix %q must not contain braces: they would replace the hash tag", opts.KeyPrefix)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 250 * time.Millisecond
	}
	if c.TLS != nil {
		cfg := &tls.Config{ServerName: c.TLS.ServerName, InsecureSkipVerify: c.TLS.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
		if c.TLS.CA != "" {
			pem, err := os.ReadFile(c.TLS.CA)
			if err != nil {
				return opts, fmt.Errorf("redis tls ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return opts, fmt.Errorf("redis tls ca %s: no PEM certificates", c.TLS.CA)
			}
			cfg.RootCAs = pool
		}
		opts.TLS = cfg
	}
	return opts, nil
}

// Release gives back the configuration's hold on the store at key (an
// Opened's PoolKey): the last to let go closes it.
func Release(key string) error {
	_, err := stores.Delete(key)
	return err
}

// Each calls fn with every open store and its pool key, until fn returns
// false.
func Each(fn func(key string, p Pooled) bool) {
	stores.Range(func(k, v any) bool {
		p, ok := v.(Pooled)
		return !ok || fn(k.(string), p)
	})
}
