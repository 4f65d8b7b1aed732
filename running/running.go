// Package running keeps the engines of the running Caddy configuration,
// for the front ends that Caddy creates apart from the rate_limit handlers
// that own the engines: the admin API and Envoy's rate limit service find
// them here.
package running

import (
	"fmt"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/engine"
)

// engines holds the registered engines of every configuration loaded (the
// running one's, and during a reload the next one's), for the front ends
// created apart from the handlers that own them (the admin API, Envoy's
// rate limit service): a UsagePool, like reverse_proxy's upstreams.
var engines = caddy.NewUsagePool()

type registered struct {
	engine *engine.Engine
	done   <-chan struct{} // closed when its configuration is unloaded
	seq    string
}

func (registered) Destruct() error { return nil }

// Register makes an engine visible to Engines until the returned function
// is called (when its owner is cleaned up) or done is closed. done is the
// Done channel of the configuration's context: of the configurations
// loaded, Engines returns the running one's engines.
func Register(e *engine.Engine, done <-chan struct{}) (unregister func()) {
	key := fmt.Sprintf("%p", e)
	engines.LoadOrStore(key, registered{engine: e, done: done, seq: key})
	return func() { _, _ = engines.Delete(key) }
}

// Engines returns the engines of the running configuration (or, when none
// is known to be running, every live one), in a stable order.
func Engines() []*engine.Engine {
	var current <-chan struct{}
	if ctx := caddy.ActiveContext(); ctx.Context != nil {
		current = ctx.Done()
	}
	var live, running []registered
	engines.Range(func(_, v any) bool {
		r := v.(registered)
		select {
		case <-r.done:
			return true
		default:
		}
		live = append(live, r)
		if r.done == current {
			running = append(running, r)
		}
		return true
	})
	if len(running) > 0 {
		live = running
	}
	// Range's order is a map's: sort, so that answers are stable.
	slices.SortFunc(live, func(a, b registered) int { return strings.Compare(a.seq, b.seq) })
	out := make([]*engine.Engine, len(live))
	for i, r := range live {
		out[i] = r.engine
	}
	return out
}

// EnginesOf returns the live engines registered with done: those of the
// configuration whose context's Done channel it is (for a front end that
// belongs to that configuration), in a stable order.
func EnginesOf(done <-chan struct{}) []*engine.Engine {
	var of []registered
	engines.Range(func(_, v any) bool {
		if r := v.(registered); r.done == done {
			of = append(of, r)
		}
		return true
	})
	slices.SortFunc(of, func(a, b registered) int { return strings.Compare(a.seq, b.seq) })
	out := make([]*engine.Engine, len(of))
	for i, r := range of {
		out[i] = r.engine
	}
	return out
}
