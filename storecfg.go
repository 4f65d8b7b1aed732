package cascade

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/store"
)

// stores holds the open stores, shared by every handler that configures the
// same store and carried across config reloads: a reload must not reset
// anyone's limits (nor drop Redis connections).
var stores = caddy.NewUsagePool()

// StoreConfig selects where limit state lives. Set at most one of Memory and
// Redis; neither means the default memory store.
type StoreConfig struct {
	Memory *MemoryStoreConfig `json:"memory,omitempty"`
	Redis  *RedisStoreConfig  `json:"redis,omitempty"`
}

// MemoryStoreConfig configures the embedded store. Its state is in this
// process only, and survives config reloads.
type MemoryStoreConfig struct {
	// Name identifies the store: handlers naming the same store share its
	// state (and trees of the same name share buckets). Default "default".
	Name string `json:"name,omitempty"`
	// MaxKeys caps the buckets tracked (default 1,000,000). At the cap the
	// bucket nearest to expiry, among a sample, is evicted and counted.
	MaxKeys int `json:"max_keys,omitempty"`
}

// RedisStoreConfig configures the Redis store (standalone, Sentinel or Cluster).
type RedisStoreConfig struct {
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
	DB       int    `json:"db,omitempty"`
	// TLS, when set, connects with TLS.
	TLS *RedisTLS `json:"tls,omitempty"`

	DialTimeout  caddy.Duration `json:"dial_timeout,omitempty"`
	ReadTimeout  caddy.Duration `json:"read_timeout,omitempty"`
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`
	PoolSize     int            `json:"pool_size,omitempty"`
	// KeyPrefix starts every key; default "cascade:". No braces.
	KeyPrefix string `json:"key_prefix,omitempty"`
	// Timeout bounds one decision, so a slow or dead Redis never hangs a
	// request (then on_store_error applies). Default 250ms.
	Timeout caddy.Duration `json:"timeout,omitempty"`
}

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	ServerName         string `json:"server_name,omitempty"`
	InsecureSkipVerify bool   `json:"insecure_skip_verify,omitempty"`
	// CA is a PEM file of the authorities to trust (default: the system's).
	CA string `json:"ca,omitempty"`
}

// pooled is a store in the usage pool.
type pooled struct {
	store.Store
	// config identifies the configuration that opened the store (the
	// Done channel of its context, which every server's context of that
	// configuration shares, and no other configuration's): its other
	// handlers apply their settings at once, a later configuration's wait
	// until it is live (see open).
	config <-chan struct{}
}

func (p pooled) Destruct() error { return p.Close() }

// open returns the configured store from the pool, opening it if needed.
//
// For a memory store a previous configuration opened (a reload), the
// settings this configuration gives explicitly are returned as apply, for
// the handler to apply when it serves its first request: a configuration
// that fails to load then changes nothing. Settings left unset never reset
// another handler's.
func (c *StoreConfig) open(ctx caddy.Context, sweep time.Duration) (s store.Store, poolKey string, apply func(), err error) {
	if c.Memory != nil && c.Redis != nil {
		return nil, "", nil, errors.New("configure one store: memory or redis")
	}
	if c.Redis != nil {
		opts, err := c.Redis.options(ctx.Logger())
		if err != nil {
			return nil, "", nil, err
		}
		key, _ := json.Marshal(c.Redis)
		poolKey = "redis/" + string(key)
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
			return pooled{Store: s}, nil
		})
		if err != nil {
			return nil, "", nil, err
		}
		return v.(pooled).Store, poolKey, nil, nil
	}
	m := c.Memory
	if m == nil {
		m = &MemoryStoreConfig{}
	}
	if m.MaxKeys < 0 {
		return nil, "", nil, fmt.Errorf("memory max_keys %d must not be negative", m.MaxKeys)
	}
	name := m.Name
	if name == "" {
		name = "default"
	}
	poolKey = "memory/" + name
	opts := store.MemoryOptions{MaxKeys: m.MaxKeys, SweepInterval: sweep}
	v, loaded, err := stores.LoadOrNew(poolKey, func() (caddy.Destructor, error) {
		return pooled{Store: store.NewMemory(opts), config: ctx.Done()}, nil
	})
	if err != nil {
		return nil, "", nil, err
	}
	if mem, ok := v.(pooled).Store.(*store.Memory); ok && loaded && (opts.MaxKeys > 0 || opts.SweepInterval > 0) {
		// The store outlives reloads, with its state; the newest
		// configuration that sets its cap or sweep interval sets them:
		// at once when it opened the store itself (another handler of
		// it came first), else once it is live.
		apply = func() { mem.Reconfigure(opts) }
		if v.(pooled).config == ctx.Done() {
			apply()
			apply = nil
		}
	}
	return v.(pooled).Store, poolKey, apply, nil
}

// options translates the JSON config into store.RedisOptions.
func (c *RedisStoreConfig) options(logger *zap.Logger) (store.RedisOptions, error) {
	repl := caddy.NewReplacer()
	opts := store.RedisOptions{
		Logger:       logger,
		MasterName:   repl.ReplaceAll(c.MasterName, ""),
		Cluster:      c.Cluster,
		Username:     repl.ReplaceAll(c.Username, ""),
		Password:     repl.ReplaceAll(c.Password, ""),
		DB:           c.DB,
		DialTimeout:  time.Duration(c.DialTimeout),
		ReadTimeout:  time.Duration(c.ReadTimeout),
		WriteTimeout: time.Duration(c.WriteTimeout),
		PoolSize:     c.PoolSize,
		KeyPrefix:    c.KeyPrefix,
		Timeout:      time.Duration(c.Timeout),
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
