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
// the master announced after it instead.
type masterRoute struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	mu       sync.RWMutex
	replaced map[string]string // a former master's address → the one announced after it
}

func newMasterRoute(opts *redis.Options) *masterRoute {
	return &masterRoute{dial: redis.NewDialer(opts), replaced: map[string]string{}}
}

// dialer is the failover client's Dialer: it dials addr, or the master
// announced after it.
func (m *masterRoute) dialer(ctx context.Context, network, addr string) (net.Conn, error) {
	return m.dial(ctx, network, m.resolve(addr))
}

// resolve follows the announcements from addr to the latest master.
func (m *masterRoute) resolve(addr string) string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for range len(m.replaced) { // no cycle: each announcement removes its new master's entry
		next, ok := m.replaced[addr]
		if !ok {
			break
		}
		addr = next
	}
	return addr
}

// announce records that to replaced from as the master; it reports
// whether that was news.
func (m *masterRoute) announce(from, to string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.replaced[from] == to {
		return false
	}
	delete(m.replaced, to) // to is a master now, whatever it was before
	if from != to {
		m.replaced[from] = to
	}
	return true
}

// watchSentinels listens to every Sentinel of addrs for the announcement
// of a new master of opts.MasterName (+switch-master), which only a
// Sentinel can make (a Sentinel takes PUBLISH on its hello channel only,
// from its peers, whose hello messages never reach this channel). On the first one
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
		ps := sc.Subscribe(context.Background(), "+switch-master")
		r.sentinels = append(r.sentinels, ps, sc)
		go func() {
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
