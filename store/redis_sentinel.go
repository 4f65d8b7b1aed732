package store

import (
	"context"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// masterRoute follows a Sentinel master set through failovers as soon as
// any one Sentinel announces the new master. go-redis's failover client
// asks one Sentinel where the master is each time it dials, and the others
// learn a failover from its leader only through their hello messages,
// every 2 s: a client whose Sentinel has not heard yet would dial the dead
// master for up to that long. masterRoute's dialer sends such a dial to
// the master announced after it instead, for redirectFor after the
// announcement: by then every Sentinel has heard, and a redirect that a
// missed announcement left stale (a failback, a master set re-pointed by
// hand) ends by itself.
type masterRoute struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	now  func() time.Time

	mu       sync.RWMutex
	replaced map[string]redirect // by a former master's address
}

// redirect is the master announced after a former one, until when.
type redirect struct {
	to    string
	until time.Time
}

// redirectFor is how long a dial to a former master goes to the one
// announced after it: several hello periods of the Sentinels (2 s).
const redirectFor = 10 * time.Second

func newMasterRoute(opts *redis.Options) *masterRoute {
	return &masterRoute{dial: redis.NewDialer(opts), now: time.Now, replaced: map[string]redirect{}}
}

// dialer is the failover client's Dialer: it dials addr, or the master
// announced after it.
func (m *masterRoute) dialer(ctx context.Context, network, addr string) (net.Conn, error) {
	return m.dial(ctx, network, m.resolve(addr))
}

// resolve follows the recent announcements from addr to the latest master.
func (m *masterRoute) resolve(addr string) string {
	now := m.now()
	m.mu.RLock()
	defer m.mu.RUnlock()
	for range len(m.replaced) { // no cycle: each announcement removes its new master's entry
		next, ok := m.replaced[addr]
		if !ok || now.After(next.until) {
			break
		}
		addr = next.to
	}
	return addr
}

// announce records that to replaced from as the master; it reports
// whether that was news.
func (m *masterRoute) announce(from, to string) bool {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for addr, r := range m.replaced { // the map holds the last few failovers
		if now.After(r.until) {
			delete(m.replaced, addr)
		}
	}
	if r, ok := m.replaced[from]; ok && r.to == to {
		return false
	}
	delete(m.replaced, to) // to is a master now, whatever it was before
	if from != to {
		m.replaced[from] = redirect{to: to, until: now.Add(redirectFor)}
	}
	return true
}

// watchSentinels listens to every Sentinel of addrs for the announcement
// of a new master of opts.MasterName (+switch-master). It trusts the
// Sentinels as go-redis does (a Sentinel that names a master is believed),
// and any one of them: protect them (and the hello channel of the servers
// they watch) with a password. On the first one
// of each failover, route sends the next dials to the new master, and the
// breaker br (nil: none) pings at once, then again shortly after: the next
// decisions go to the new master as soon as it answers, not at the
// breaker's next tick, nor once the client's own Sentinel has heard.
func (r *Redis) watchSentinels(opts RedisOptions, addrs []string, route *masterRoute, br *breaker) {
	for _, addr := range addrs {
		sc := redis.NewSentinelClient(&redis.Options{
			Addr:            addr,
			Username:        opts.SentinelUsername,
			Password:        opts.SentinelPassword,
			TLSConfig:       opts.TLS,
			DialTimeout:     opts.DialTimeout,
			DialerRetries:   dialAttempts,
			DisableIdentity: true,
		})
		// Subscribed in the background: an unreachable Sentinel must not
		// hold up provisioning for its dial timeout.
		ps := sc.Subscribe(context.Background())
		r.sentinels = append(r.sentinels, ps, sc)
		go func() {
			if err := ps.Subscribe(context.Background(), "+switch-master"); err != nil && r.logger != nil {
				r.logger.Warn("redis sentinel: cannot subscribe to its announcements of a new master; go-redis still asks the Sentinels on each dial",
					zap.String("sentinel", addr), zap.Error(err))
			}
			for msg := range ps.Channel() {
				// "<name> <old ip> <old port> <new ip> <new port>"
				f := strings.Fields(msg.Payload)
				if len(f) != 5 || f[0] != opts.MasterName {
					continue
				}
				from, to := net.JoinHostPort(f[1], f[2]), net.JoinHostPort(f[3], f[4])
				if !route.announce(from, to) {
					continue // another Sentinel's word for the same failover
				}
				if r.logger != nil {
					r.logger.Info("redis sentinel: a new master was announced; decisions go to it",
						zap.String("master_name", f[0]), zap.String("old", from), zap.String("new", to), zap.String("sentinel", addr))
				}
				if br == nil {
					continue
				}
				br.probeNow()
				// Should the first ping race the client's switch, ask
				// again before the breaker's next tick.
				for _, after := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond} {
					time.AfterFunc(after, br.probeNow)
				}
			}
		}()
	}
}
