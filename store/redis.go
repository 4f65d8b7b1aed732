package store

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/lua"
	"github.com/caddy-cascade/cascade/rate"
)

// DefaultRedisTimeout bounds one Redis decision when RedisOptions.Timeout is
// zero. A healthy Redis answers a decision in well under a millisecond, even
// under load; an unreachable one costs each request at most this long
// before the handler applies its failure policy.
const DefaultRedisTimeout = 250 * time.Millisecond

// redisStartTimeout bounds NewRedis's script loading when ctx has no
// earlier deadline: provisioning may dial every master afresh, TLS
// included, so it gets more room than one decision.
const redisStartTimeout = 5 * time.Second

// RedisOptions configure a Redis store. The connection fields are those of
// go-redis's UniversalOptions, which picks the client:
//
//   - MasterName set: a Sentinel-backed failover client (Addrs are the sentinels);
//   - several Addrs, or Cluster: a Redis Cluster client (Addrs are seed nodes);
//   - otherwise: a client of the single server Addrs[0].
type RedisOptions struct {
	// Addrs are host:port addresses. Empty means 127.0.0.1:6379. A single
	// server on the same machine may instead be reached by the absolute
	// path of its Unix socket (/run/redis/redis.sock), which spares both
	// sides the TCP stack; Sentinel and Cluster need host:port.
	Addrs []string
	// MasterName is the Sentinel master set's name; set it to use Sentinel.
	MasterName string
	// Cluster forces a Cluster client even with a single seed address
	// (e.g. a managed cluster's configuration endpoint).
	Cluster bool

	// Username and Password authenticate to Redis (ACL user, or only a
	// password for requirepass).
	Username string
	Password string
	// SentinelUsername and SentinelPassword authenticate to the sentinels.
	SentinelUsername string
	SentinelPassword string
	// DB is the database number; it must be 0 on a Cluster.
	DB int
	// TLS enables TLS with this configuration when non-nil.
	TLS *tls.Config

	// DialTimeout, ReadTimeout and WriteTimeout bound single network
	// operations (go-redis defaults when zero). Timeout bounds a whole
	// decision, and it is the one that matters to requests.
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	// PoolSize is the number of connections per node (go-redis default,
	// 10 per CPU, when zero).
	PoolSize int

	// KeyPrefix is prepended to every bucket key, to share a Redis with
	// other applications or to separate environments. It must not contain
	// '{' or '}': the bucket key's own hash tag must choose the Cluster slot.
	KeyPrefix string
	// Timeout bounds each Decide and Adjust, including waiting for a
	// pooled connection, dialing and the reply: a request never hangs on
	// Redis. Zero means DefaultRedisTimeout.
	Timeout time.Duration
	// LazyLoad skips contacting Redis in NewRedis. The scripts are then
	// loaded by the first decisions (EVALSHA answers NOSCRIPT, the store
	// sends the script once), so a Caddy whose Redis is down at start-up
	// can still start and apply its failure policy until Redis is back.
	LazyLoad bool
	// Logger receives what cannot be returned: a refund that failed after
	// a partial denial on a Cluster. Nil discards it.
	Logger *zap.Logger
	// Breaker stops waiting on a Redis that keeps failing (see
	// BreakerOptions); its zero value has none.
	Breaker BreakerOptions
	// SlotTTL is how long a concurrency slot lasts without its holder
	// renewing it (see slots); zero means DefaultSlotTTL.
	SlotTTL time.Duration
	// TenantInFlight caps the decisions of one tenant queued for or on
	// their way to Redis, per Redis server (per master of a Cluster); a
	// decision beyond it fails at once with ErrOverloaded. Zero is no cap:
	// tenants still take turns (see fairQueue), so a flood delays its own
	// decisions, not others'; a cap also sheds the flood's excess at once
	// rather than at its timeout.
	TenantInFlight int

	// Clock, for tests only, replaces Redis TIME with an injected clock
	// (see package lua). Production leaves it nil so that every Caddy
	// instance reads the same clock: Redis's.
	Clock Clock
}

// Redis is the store shared by many Caddy instances. Each decision is ONE
// EVALSHA of lua.Decide on a standalone or Sentinel-managed Redis, whatever
// the number of buckets, so it is atomic across instances; time comes from
// Redis TIME inside the script. Under load, the decisions that queue up
// while others are on the wire share one EVALSHA (see batcher): still one
// round trip and one atomic step each, at a fraction of Redis's time.
//
// On a Redis Cluster, a script can only touch keys of one hash slot. Keys
// built by package hierarchy give a tenant's whole subtree one hash tag, so
// most decisions still take one script. When a path spans slots (a global
// ceiling above the tenants), Decide first runs the script of the slot that
// holds the path's last bucket (the tenant's subtree); only if it admits
// are the other slots charged, one script each, in parallel, and if one of
// them denies, the slots that admitted are refunded (lua.Adjust with the
// negated costs). If the tenant's slot denies, the others are only asked
// (a dry run that writes nothing), so remaining counts and Retry-After
// still cover every limit. That never over-admits; for the moment between a
// charge and its refund, other requests may see a ceiling fuller than it
// is, so it may briefly under-admit — but a request its own tenant refuses
// never holds a ceiling's capacity. It costs two round trips.
//
// Every error wraps ErrUnavailable.
type Redis struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // the same client, when it is a cluster client
	prefix  string
	timeout time.Duration
	clock   Clock // nil: Redis TIME
	logger  *zap.Logger
	batch   *batchers // send decisions, batched under load, each master's with its breaker
	slots   *slots    // the concurrency slots this instance holds
	// breakerOpts are the breakers' options, shared by every breaker.
	breakerOpts BreakerOptions
	// loaded are the Cluster masters whose script caches NewRedis filled.
	loaded sync.Map
	// sentinels watch for a new Sentinel master (see watchSentinels).
	sentinels []io.Closer
	// adjusts bounds the corrections (refunds, debts, give-backs) on the
	// wire at once below the connection pool's size: a flood of one
	// tenant's refunds never takes the connections decisions need.
	adjusts chan struct{}

	// onReset, when set, is told of each reset once it has returned
	// (failed too: some keys may have been deleted): its keys, or the
	// glob of a reset by pattern.
	onReset func(keys []string, glob string)

	busState *busState // how its Pub/Sub messages are signed and checked

	refunding sync.WaitGroup // refunds after a partial denial on a Cluster
	closing   sync.Mutex     // orders starting a refund before Close's wait
	closed    bool
}

// dialAttempts is how many times a connection is dialled before a call
// fails: once. go-redis would try five times, 100 ms apart, so that in the
// first moments of an outage each decision waited out its whole timeout
// instead of going straight to the failure policy; the next decision dials
// again anyway.
const dialAttempts = 1

// ValidateRedisAddress checks that a is an address the store can dial:
// host:port (the host may be empty, for localhost), or the absolute path of
// a Unix socket. Its error says what to write instead.
func ValidateRedisAddress(a string) error {
	if strings.HasPrefix(a, "/") {
		return nil
	}
	fix := "write host:port (e.g. 127.0.0.1:6379) or the absolute path of a Unix socket"
	switch {
	case strings.Contains(a, "://"):
		return fmt.Errorf("redis address %q is a URL: %s", a, fix)
	case strings.Contains(a, ","):
		return fmt.Errorf("redis address %q holds a comma: give several addresses as separate arguments", a)
	}
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		why := err.Error()
		var ae *net.AddrError
		if errors.As(err, &ae) {
			why = ae.Err
		}
		return fmt.Errorf("redis address %q: %s: %s", a, why, fix)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("redis address %q: port %q is not a number from 1 to 65535", a, port)
	}
	return nil
}

// NewRedis connects to Redis and, unless opts.LazyLoad, loads the scripts
// (SCRIPT LOAD on every master of a Cluster). It fails on invalid options,
// and with an error wrapping ErrUnavailable when Redis cannot be reached
// within ctx (and at most five seconds).
func NewRedis(ctx context.Context, opts RedisOptions) (*Redis, error) {
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return nil, fmt.Errorf("redis store: key prefix %q must not contain '{' or '}': the bucket key's hash tag must choose the cluster slot", opts.KeyPrefix)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("redis store: timeout must not be negative, got %v", opts.Timeout)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultRedisTimeout
	}
	if opts.SlotTTL != 0 && opts.SlotTTL < time.Second {
		return nil, fmt.Errorf("redis store: slot TTL must be at least 1s (the instance renews its slots every third of it), got %v", opts.SlotTTL)
	}
	addrs := opts.Addrs
	if len(addrs) == 0 {
		addrs = []string{"127.0.0.1:6379"}
	}
	isCluster := opts.MasterName == "" && (opts.Cluster || len(addrs) > 1)
	if isCluster && opts.DB != 0 {
		return nil, fmt.Errorf("redis store: a Redis Cluster has only database 0, got db %d", opts.DB)
	}
	if opts.MasterName != "" && opts.Cluster {
		return nil, errors.New("redis store: master_name (Sentinel) and cluster are exclusive")
	}
	for _, a := range addrs {
		if err := ValidateRedisAddress(a); err != nil {
			return nil, fmt.Errorf("redis store: %w", err)
		}
		if strings.HasPrefix(a, "/") && (isCluster || opts.MasterName != "") {
			return nil, fmt.Errorf("redis store: %q is a Unix socket, which reaches a single server: Sentinel and Cluster addresses are host:port", a)
		}
	}

	uo := &redis.UniversalOptions{
		Addrs:            addrs,
		MasterName:       opts.MasterName,
		IsClusterMode:    opts.Cluster,
		ClientName:       "cascade",
		Username:         opts.Username,
		Password:         opts.Password,
		SentinelUsername: opts.SentinelUsername,
		SentinelPassword: opts.SentinelPassword,
		DB:               opts.DB,
		TLSConfig:        opts.TLS,
		DialTimeout:      opts.DialTimeout,
		ReadTimeout:      opts.ReadTimeout,
		WriteTimeout:     opts.WriteTimeout,
		PoolSize:         opts.PoolSize,
		// Let the per-decision deadline reach the socket: without this,
		// go-redis would wait out ReadTimeout whatever the context says.
		ContextTimeoutEnabled: true,
		// Never resend a script on its own: a reply lost after the script
		// ran would charge the request twice, and a resent refund would
		// refund twice. A failed decision goes to the failure policy;
		// dead pooled connections are already weeded out by go-redis's
		// health check before use.
		MaxRetries: -1,
	}
	var client redis.UniversalClient
	var route *masterRoute // Sentinel only
	if isCluster {
		co := uo.Cluster()
		// A command whose reply is lost after Redis ran it (a reset
		// connection) must not be sent again, on a Cluster as anywhere:
		// the cluster client would otherwise resend it up to MaxRedirects
		// times, charging a request or applying a refund several times.
		// The price: a MOVED or ASK reply (a slot being migrated, the
		// script not run) fails the decision to on_store_error instead of
		// following the redirect; the client reloads the slot map at once.
		co.MaxRedirects = -1
		// Route each script by its first key, as Redis Cluster wants. The
		// newer policy router would first fetch COMMAND info from a node
		// with a fixed five-second timeout of its own, which a decision's
		// deadline cannot shorten: a hung node would hang requests.
		co.DisableRoutingPolicies = true
		co.DialerRetries = dialAttempts
		client = redis.NewClusterClient(co)
	} else if opts.MasterName != "" {
		fo := uo.Failover()
		fo.DialerRetries = dialAttempts
		dialTimeout := opts.DialTimeout
		if dialTimeout == 0 {
			dialTimeout = 5 * time.Second // go-redis's default
		}
		route = newMasterRoute(&redis.Options{DialTimeout: dialTimeout, TLSConfig: opts.TLS})
		fo.Dialer = route.dialer
		client = redis.NewFailoverClient(fo)
	} else {
		so := uo.Simple()
		so.DialerRetries = dialAttempts
		client = redis.NewClient(so)
	}
	pool := opts.PoolSize
	if pool <= 0 {
		pool = 10 * runtime.GOMAXPROCS(0) // go-redis's default
	}
	r := &Redis{
		client:  client,
		prefix:  opts.KeyPrefix,
		timeout: opts.Timeout,
		clock:   opts.Clock,
		logger:  opts.Logger,
		adjusts: make(chan struct{}, max(1, pool-batchWorkers-1)),
	}
	r.busState = newBusState()
	r.cluster, _ = client.(*redis.ClusterClient)
	r.slots = newSlots(r, opts.SlotTTL)
	r.breakerOpts = opts.Breaker
	if r.breakerOpts.Cooldown <= 0 {
		r.breakerOpts.Cooldown = time.Second
	}
	var single *breaker
	if r.cluster == nil {
		node := addrs[0]
		if opts.MasterName != "" {
			node = opts.MasterName
		}
		single = newBreaker(node, &r.breakerOpts, r.Ping)
	}
	r.batch = newBatchers(client, lua.Decide, opts.Timeout, opts.TenantInFlight, single, r.newMaster)
	if !opts.LazyLoad {
		if err := r.load(ctx); err != nil {
			r.Close()
			return nil, err
		}
	}
	if route != nil {
		r.watchSentinels(opts, addrs, route, single)
	}
	return r, nil
}

// newMaster is told of each Cluster master a decision first goes to (a
// promoted replica among them): it loads the scripts there in the
// background unless NewRedis did, so that its first decisions find them,
// and returns the master's breaker.
func (r *Redis) newMaster(addr string, c *redis.Client) *breaker {
	if _, done := r.loaded.Load(addr); !done {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), max(r.timeout, redisStartTimeout))
			defer cancel()
			if err := loadScripts(ctx, c); err != nil && r.logger != nil {
				// Not fatal: a decision that meets NOSCRIPT sends the script.
				r.logger.Debug("loading the scripts on a new Cluster master failed", zap.String("node", addr), zap.Error(err))
			}
		}()
	}
	return newBreaker(addr, &r.breakerOpts, r.pingMaster(addr))
}

// pingMaster is the probe of the breaker of the Cluster master at addr:
// it reloads the slot map and pings that master; it succeeds too once the
// node serves no slot (a replica took its place), since its slots'
// decisions then go to their new master, whose breaker is its own.
func (r *Redis) pingMaster(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, r.timeout)
		defer cancel()
		var masters atomic.Int64
		err := r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			masters.Add(1)
			if c.Options().Addr != addr {
				return nil
			}
			return c.Ping(ctx).Err()
		})
		if err == nil && masters.Load() == 0 {
			err = errors.New("the slot map names no master")
		}
		if err != nil {
			return fmt.Errorf("redis store: ping %s: %w: %w", addr, ErrUnavailable, err)
		}
		return nil
	}
}

// loadScripts puts every script in c's script cache.
func loadScripts(ctx context.Context, c redis.Scripter) error {
	for _, s := range []*redis.Script{lua.Decide, lua.Adjust, lua.Lease, lua.Renew} {
		if err := s.Load(ctx, c).Err(); err != nil {
			return err
		}
	}
	return nil
}

// load puts both scripts in the script cache of every master, so that
// decisions find them with EVALSHA.
func (r *Redis) load(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, max(r.timeout, redisStartTimeout))
	defer cancel()
	var err error
	if r.cluster != nil {
		err = r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := loadScripts(ctx, c); err != nil {
				return fmt.Errorf("%s: %w", c.Options().Addr, err)
			}
			r.loaded.Store(c.Options().Addr, true)
			return nil
		})
	} else {
		err = loadScripts(ctx, r.client)
	}
	if err != nil {
		return fmt.Errorf("redis store: loading scripts: %w: %w", ErrUnavailable, err)
	}
	return nil
}

// Client is the underlying go-redis client, for health checks and
// administration. Decisions must go through Decide and Adjust.
func (r *Redis) Client() redis.UniversalClient { return r.client }

// Ping checks that Redis answers (every master, on a Cluster) within the
// store's Timeout.
func (r *Redis) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	var err error
	if r.cluster != nil {
		err = r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	} else {
		err = r.client.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("redis store: ping: %w: %w", ErrUnavailable, err)
	}
	return nil
}

// Close closes the client and its connections.
func (r *Redis) Close() error {
	r.slots.close()
	for _, s := range r.sentinels {
		s.Close()
	}
	r.batch.close()
	r.closing.Lock()
	r.closed = true
	r.closing.Unlock()
	r.refunding.Wait()
	return r.client.Close()
}

// Decide implements Store.
func (r *Redis) Decide(ctx context.Context, buckets []Bucket) (Decision, error) {
	if len(buckets) == 0 {
		return Combine([]rate.Result{}), nil
	}
	now, wall := r.now()
	if r.cluster != nil {
		if groups := slotGroups(r.prefix, buckets); groups != nil {
			ctx, cancel := context.WithTimeout(ctx, r.timeout)
			defer cancel()
			d, err := r.decideSlots(ctx, buckets, groups, now, wall)
			if d.Allowed {
				r.slots.took(buckets)
			}
			return d, err
		}
	}
	// The common case bounds its wait with a deadline rather than a
	// context.WithTimeout: a derived context costs a request more than the
	// rest of its Redis client work.
	results := make([]rate.Result, len(buckets))
	at, err := r.decide(ctx, time.Now().Add(r.timeout), "", buckets, now, wall, results)
	if err != nil {
		if errors.Is(err, ErrBreakerOpen) {
			return Decision{}, err
		}
		return Decision{}, fmt.Errorf("redis store: decide: %w: %w", ErrUnavailable, err)
	}
	d := Combine(results)
	d.At = at
	if d.Allowed {
		r.slots.took(buckets)
	}
	return d, nil
}

// Adjust implements Store. On a Cluster, buckets of different slots are
// adjusted by one script per slot, each atomic on its own.
func (r *Redis) Adjust(ctx context.Context, buckets []Bucket) error {
	if len(buckets) == 0 {
		return nil
	}
	// Slots given back are no longer renewed, whether or not the give-back
	// reaches Redis (if it does not, they expire).
	r.slots.gone(buckets)
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	select {
	case r.adjusts <- struct{}{}:
		defer func() { <-r.adjusts }()
	case <-ctx.Done():
		// This instance's own corrections filled its share of the pool:
		// nothing is said of Redis (the breaker does not count it).
		return fmt.Errorf("redis store: adjust: %w: %d corrections already on the wire: %w", ErrOverloaded, cap(r.adjusts), ctx.Err())
	}
	now, wall := r.now()
	var groups [][]int
	if r.cluster != nil {
		groups = slotGroups(r.prefix, buckets)
	}
	var err error
	if groups != nil {
		err = r.adjustSlots(ctx, buckets, groups, now, wall)
	} else {
		err = r.adjust(ctx, buckets, now, wall)
	}
	if err != nil {
		if errors.Is(err, ErrBreakerOpen) {
			return err
		}
		return fmt.Errorf("redis store: adjust: %w: %w", ErrUnavailable, err)
	}
	return nil
}

// guarded runs call, which sends a script whose keys are served by the
// master of key, unless that master's breaker is open, and counts its
// outcome there. On a Cluster, a failure may mean the master is gone: the
// slot map is reloaded.
func (r *Redis) guarded(key string, call func() error) error {
	br := r.breakerFor(key)
	if err := br.allow(); err != nil {
		r.batch.reload()
		return err
	}
	err := call()
	br.record(err)
	if r.cluster != nil && staleSlots(err) {
		r.batch.reload()
	}
	return err
}

// breakerFor is the breaker of the master serving key (with the store's
// prefix): the store's own but on a Cluster; there the breaker of the
// master the slot map names (nil when none can be found: the call then
// fails on its own).
func (r *Redis) breakerFor(key string) *breaker {
	if r.batch.single != nil {
		return r.batch.single.breaker
	}
	b, err := r.batch.forKey(context.Background(), time.Now().Add(r.timeout), key)
	if err != nil {
		return nil
	}
	return b.breaker
}

// now returns the time to send to the scripts (the injected test clock, or
// 0 for Redis TIME) and the local time from which calendar windows are
// computed (the same injected clock, or the wall clock).
func (r *Redis) now() (now, wall int64) {
	if r.clock != nil {
		now = r.clock()
		return now, now
	}
	return 0, WallClock()
}

// decide decides buckets, which must share one slot on a Cluster, in one
// lua.Decide call — its own, or a batch's (see batcher) — fills results
// and returns the time Redis decided at. It waits until deadline at most.
func (r *Redis) decide(ctx context.Context, deadline time.Time, tenant string, buckets []Bucket, now, wall int64, results []rate.Result) (int64, error) {
	keys, logs, spec := r.encode(buckets, now, wall, false)
	b, err := r.batch.forKey(ctx, deadline, keys[0])
	if err != nil {
		return 0, err
	}
	if err := b.breaker.allow(); err != nil {
		// Its slots may have a new master by now: while decisions keep
		// coming, the map is reloaded every 100 ms at most.
		r.batch.reload()
		return 0, err
	}
	reply, err := b.do(ctx, deadline, tenant, keys, logs, spec)
	b.breaker.record(err)
	if err != nil {
		return 0, err
	}
	return decodeReply(reply, results)
}

// decodeReply reads a decision's part of lua.Decide's reply (replySize):
// six little-endian float64s per bucket (whole numbers), into results,
// then the time the script decided at, which it returns.
func decodeReply(reply string, results []rate.Result) (int64, error) {
	if len(reply) != replySize(len(results)) {
		return 0, fmt.Errorf("decide script returned %d bytes for %d buckets", len(reply), len(results))
	}
	float := func(off int) int64 {
		return int64(math.Float64frombits(binary.LittleEndian.Uint64([]byte(reply[off : off+8]))))
	}
	for i := range results {
		results[i] = rate.Result{
			Allowed:    float(48*i) == 1,
			Impossible: float(48*i+8) == 1,
			Remaining:  float(48*i + 16),
			Before:     float(48*i + 24),
			RetryAfter: float(48*i + 32),
			Reset:      float(48*i + 40),
		}
	}
	return float(len(reply) - 8), nil
}

// replySize is the size of a decision's reply for n buckets: six float64s
// each, and the decision's time.
func replySize(n int) int { return 48*n + 8 }

// adjust runs lua.Adjust once over buckets, which must share one slot on a
// Cluster.
func (r *Redis) adjust(ctx context.Context, buckets []Bucket, now, wall int64) error {
	keys, logs, spec := r.encode(buckets, now, wall, true)
	return r.guarded(keys[0], func() error {
		return lua.Adjust.Run(ctx, r.client, interleave(keys, logs), spec).Err()
	})
}

// Algorithm codes of the packed script arguments (see package lua).
const (
	codeGCRA          = 0
	codeSlidingApprox = 1
	codeCalendar      = 2
	codeSliding       = 3
	codeConcurrent    = 4
	codeIdempotent    = 5
)

// encode lays out the keys and the packed numbers of one decision or, with
// adjust, one correction, as package lua documents: the clock, then per
// bucket its algorithm code and its numbers, as little-endian float64s. A
// correction sends, in the capacity's place, the window its cost was
// charged in (Limit.ChargeWindow of Bucket.Charged). An exact sliding
// window adds its tick; a calendar, its windows. keys holds each bucket's
// key; logs, when a bucket is an exact sliding window, its log key (see
// logKey; "" for the other buckets).
func (r *Redis) encode(buckets []Bucket, now, wall int64, adjust bool) (keys, logs []string, spec []byte) {
	keys = make([]string, len(buckets))
	spec = make([]byte, 0, 8+len(buckets)*(1+4*8))
	spec = appendFloat(spec, now)
	for i, b := range buckets {
		keys[i] = r.prefix + b.Key
		l := b.Limit
		capacity := l.Capacity()
		if adjust {
			capacity = l.ChargeWindow(b.Charged)
		}
		code := byte(codeGCRA)
		switch l.Algorithm {
		case rate.Sliding:
			code = codeSliding
		case rate.SlidingApprox:
			code = codeSlidingApprox
		case rate.Calendar:
			code = codeCalendar
		case rate.Concurrent:
			code = codeConcurrent
		case rate.Idempotent:
			code = codeIdempotent
		}
		spec = append(spec, code)
		spec = appendFloat(spec, l.Count)
		if code == codeConcurrent {
			spec = appendFloat(spec, r.slots.ttl.Microseconds())
		} else {
			spec = appendFloat(spec, l.Period.Microseconds())
		}
		spec = appendFloat(spec, capacity)
		spec = appendFloat(spec, b.Cost)
		if l.Algorithm == rate.Sliding {
			spec = appendFloat(spec, l.Tick())
			if logs == nil {
				logs = make([]string, len(buckets))
			}
			logs[i] = logKey(keys[i])
		}
		if code == codeConcurrent {
			spec = appendFloat(spec, b.Holder)
		}
		if l.Algorithm == rate.Calendar {
			// The previous, current and next windows around our clock: the
			// script picks the one holding Redis's time, so a skew between
			// the clocks at a boundary never resets a quota early or late.
			start, end := l.Window(wall)
			prev, _ := l.Window(start - 1)
			_, next := l.Window(end)
			spec = appendFloat(spec, prev)
			spec = appendFloat(spec, start)
			spec = appendFloat(spec, end)
			spec = appendFloat(spec, next)
		}
	}
	return keys, logs, spec
}

// logKeySuffix ends the key of an exact sliding window's log.
const logKeySuffix = "~log"

// logKey is the key of the list that holds the entries of the exact
// sliding window at key (see package lua): the key and a suffix, in the
// key's Cluster slot (the key's hash tag, or the key itself as one). A key
// with a broken tag ("{}", or a "}" of its own and no tag) may still find
// no name in its slot: never one of package hierarchy's, and on a Cluster
// its decisions then fail (CROSSSLOT) rather than split a log.
func logKey(key string) string {
	if k := key + logKeySuffix; RedisKeySlot(k) == RedisKeySlot(key) {
		return k
	}
	return "{" + key + "}" + logKeySuffix
}

// interleave lays keys out as the scripts take the keys of one call in
// order: each bucket's key, an exact sliding window's followed by its log
// key (logs, aligned with keys; nil when there is none).
func interleave(keys, logs []string) []string {
	if logs == nil {
		return keys
	}
	out := make([]string, 0, 2*len(keys))
	for i, k := range keys {
		out = append(out, k)
		if logs[i] != "" {
			out = append(out, logs[i])
		}
	}
	return out
}

// appendFloat appends n as a little-endian float64, exact below 2^53.
func appendFloat(dst []byte, n int64) []byte {
	return binary.LittleEndian.AppendUint64(dst, math.Float64bits(float64(n)))
}

// decideSlots decides a path whose buckets live in several Cluster slots:
// one script per slot, in parallel; if any slot denies (or fails), the
// slots that admitted are refunded, so the request is charged nowhere.
func (r *Redis) decideSlots(ctx context.Context, buckets []Bucket, groups [][]int, now, wall int64) (Decision, error) {
	// A master whose breaker is open fails the whole path (all or
	// nothing) before any slot is charged, and refunded.
	for _, idx := range groups {
		if err := r.breakerFor(r.prefix + buckets[idx[0]].Key).allow(); err != nil {
			r.batch.reload()
			return Decision{}, err
		}
	}
	results := make([]rate.Result, len(buckets))
	times := make([]int64, len(buckets)) // each bucket's slot's time
	errs := make([]error, len(groups))

	// The slot of the path's last bucket (the tenant's subtree, where the
	// tight limits are) decides first. Only if it admits are the other
	// slots (global ceilings) charged: a request its own tenant refuses
	// never inflates a ceiling that every tenant shares. If it refuses, the
	// other slots are asked without being charged (a dry run), so that
	// remaining counts and Retry-After still cover every limit.
	// Every slot's call is the path's tenant's (the hash tag of its last
	// bucket), a ceiling's too: a ceiling is not a tenant of its own.
	tenant := tenantOf([]string{r.prefix + buckets[len(buckets)-1].Key})
	leaf := 0
	for g, idx := range groups {
		if idx[len(idx)-1] == len(buckets)-1 {
			leaf = g
		}
	}
	run := func(g int, dry bool) {
		part := pick(buckets, groups[g])
		if dry {
			part = append(part, dryRun(part[0]))
		}
		res := make([]rate.Result, len(part))
		deadline, _ := ctx.Deadline()
		var at int64
		if at, errs[g] = r.decide(ctx, deadline, tenant, part, now, wall, res); errs[g] == nil {
			for i, j := range groups[g] {
				results[j], times[j] = res[i], at
			}
		}
	}
	run(leaf, false)
	leafAllowed := errs[leaf] == nil
	for _, j := range groups[leaf] {
		leafAllowed = leafAllowed && results[j].Allowed
	}
	var wg sync.WaitGroup
	for g := range groups {
		if g == leaf {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); run(g, !leafAllowed) }()
	}
	wg.Wait()

	if leafAllowed {
		allowed := true
		var charged []int // groups whose script admitted, and so charged
		for g, idx := range groups {
			if errs[g] != nil {
				allowed = false
				continue
			}
			groupAllowed := true
			for _, j := range idx {
				groupAllowed = groupAllowed && results[j].Allowed
			}
			if groupAllowed {
				charged = append(charged, g)
			} else {
				allowed = false
			}
		}
		if !allowed && len(charged) > 0 {
			// Wait for the refund while the decision's own deadline
			// allows (so a fast Redis has refunded by the time the
			// request is answered), and not a moment longer.
			select {
			case <-r.refund(buckets, times, groups, charged, now, wall):
			case <-ctx.Done():
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Decision{}, fmt.Errorf("redis store: decide across %d slots: %w: %w", len(groups), ErrUnavailable, err)
	}
	// On a refused leaf, Combine sees its denial: the decision is a denial,
	// and every bucket reports what it had before.
	d := Combine(results)
	d.At, d.Times = times[len(times)-1], times
	return d, nil
}

// dryRun is a bucket in b's hash slot that can never admit: added to a
// script's keys, it makes the script report every other bucket's verdict
// and write nothing (all or nothing). Its key is never written.
func dryRun(b Bucket) Bucket {
	tag := b.Key
	if i := strings.IndexByte(tag, '}'); i >= 0 {
		tag = tag[:i+1]
	}
	return Bucket{Key: tag + "#dry-run", Limit: rate.Limit{Algorithm: rate.GCRA, Count: 1, Period: time.Second}, Cost: 2}
}

// refund gives back what a decision charged to the slots that admitted it
// (charged) when another slot refused or failed, each bucket from the charge
// its slot logged at its own time (times). It runs in the
// background, bounded by its own timeout, so that it completes even when
// the decision's deadline has passed; the returned channel is closed when
// it is done. Close waits for it.
func (r *Redis) refund(buckets []Bucket, times []int64, groups [][]int, charged []int, now, wall int64) <-chan struct{} {
	var refunds []Bucket // copies: Decide must not keep buckets
	var sel [][]int
	for _, g := range charged {
		idx := make([]int, len(groups[g]))
		for i, j := range groups[g] {
			b := buckets[j]
			b.Cost, b.Charged = -b.Cost, times[j]
			idx[i] = len(refunds)
			refunds = append(refunds, b)
		}
		sel = append(sel, idx)
	}
	done := make(chan struct{})
	r.closing.Lock()
	defer r.closing.Unlock()
	if r.closed {
		close(done)
		return done
	}
	r.refunding.Add(1)
	go func() {
		defer r.refunding.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		defer cancel()
		if err := r.adjustSlots(ctx, refunds, sel, now, wall); err != nil && r.logger != nil {
			r.logger.Warn("refund after a partial denial failed; the admitted slots stay charged until they drain",
				zap.Error(err))
		}
	}()
	return done
}

// adjustSlots runs lua.Adjust once per slot group, in parallel.
func (r *Redis) adjustSlots(ctx context.Context, buckets []Bucket, groups [][]int, now, wall int64) error {
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for g, idx := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[g] = r.adjust(ctx, pick(buckets, idx), now, wall)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// pick returns the buckets at the given indexes.
func pick(buckets []Bucket, idx []int) []Bucket {
	out := make([]Bucket, len(idx))
	for i, j := range idx {
		out[i] = buckets[j]
	}
	return out
}

// slotGroups groups bucket indexes by the Cluster slot of their keys,
// keeping each group in path order. It returns nil when every bucket
// shares one slot, the common case, which needs no grouping (and no
// allocation).
func slotGroups(prefix string, buckets []Bucket) [][]int {
	first := RedisKeySlot(prefix + buckets[0].Key)
	same := true
	for _, b := range buckets[1:] {
		if RedisKeySlot(prefix+b.Key) != first {
			same = false
			break
		}
	}
	if same {
		return nil
	}
	return groupBySlot(len(buckets), func(i int) int { return RedisKeySlot(prefix + buckets[i].Key) })
}

// groupBySlot groups the indexes 0 … n-1 by their slot, keeping their
// order within each group, and the groups in the order of their first
// index.
func groupBySlot(n int, slot func(i int) int) [][]int {
	var slots []int
	var groups [][]int
	for i := 0; i < n; i++ {
		s := slot(i)
		g := 0
		for g < len(slots) && slots[g] != s {
			g++
		}
		if g == len(slots) {
			slots = append(slots, s)
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// RedisKeySlot is the Redis Cluster hash slot of key, computed as Redis
// does: CRC16 (XMODEM) of the key's hash tag — the part between the first
// '{' and the next '}', when that part is not empty — or else of the whole
// key, modulo 16384. Package hierarchy's tests can use it to check that a
// tenant's keys share a slot.
func RedisKeySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	return int(crc16(key) & 16383)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table is the byte-at-a-time table of CRC-16/XMODEM.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// Redis is a Store.
var _ Store = (*Redis)(nil)
