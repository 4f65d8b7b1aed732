package cascade

import (
	"runtime"
	"runtime/debug"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/entitle"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/running"
	"github.com/caddy-cascade/cascade/store"
	"github.com/caddy-cascade/cascade/storeconfig"
)

// stateCollector exports the state Cascade keeps, read when Prometheus
// scrapes (nothing is counted on the request path): each memory store's
// bucket count and evictions and its kept responses' bytes and evictions,
// the runtime overrides in force per store, the mode of each tree of the
// running configuration and the capacity of its configured limits, and
// the build.
type stateCollector struct {
	keys, evictions, overrides, mode, breakerOpen, breakerTrips *prometheus.Desc
	replayBytes, replayEvictions                                *prometheus.Desc
	leaseDecisions, leaseGrants, leaseRenewals, leaseReleases   *prometheus.Desc
	instances                                                   *prometheus.Desc
	leasePeerResets, leasePeerRejected, busDropped              *prometheus.Desc
	entRequests, entLookups, entCached                          *prometheus.Desc
	capacity, buildInfo                                         *prometheus.Desc
}

func newStateCollector() *stateCollector {
	return &stateCollector{
		keys: prometheus.NewDesc("cascade_store_keys", "Buckets held by a memory store (its max_keys caps them).",
			[]string{"store"}, nil),
		evictions: prometheus.NewDesc("cascade_store_evictions_total", "Buckets a memory store evicted at its max_keys cap (each may over-admit a little).",
			[]string{"store"}, nil),
		replayBytes: prometheus.NewDesc("cascade_store_replay_bytes", "Bytes a memory store's responses kept for idempotent replay count against its max_replay_bytes (keys and a fixed overhead each included).",
			[]string{"store"}, nil),
		replayEvictions: prometheus.NewDesc("cascade_store_replay_evictions_total", "Responses kept for idempotent replay that a memory store cut to their first 64 bytes, or dropped, at its max_replay_bytes.",
			[]string{"store"}, nil),
		overrides: prometheus.NewDesc("cascade_overrides", "Runtime overrides in force (set through the admin API), per store.",
			[]string{"store"}, nil),
		mode: prometheus.NewDesc("cascade_tree_mode", "The mode each tree is in: 1 for its mode, 0 for the others.",
			[]string{"tree", "mode"}, nil),
		breakerOpen: prometheus.NewDesc("cascade_store_breaker_open", "1 while the circuit breaker of a Redis store's master (node: its address on a Cluster, else the store's address or Sentinel master name) is open (its calls fail at once), else 0.",
			[]string{"store", "node"}, nil),
		breakerTrips: prometheus.NewDesc("cascade_store_breaker_trips_total", "Times the circuit breaker of a Redis store's master has opened.",
			[]string{"store", "node"}, nil),
		leaseDecisions: prometheus.NewDesc("cascade_lease_decisions_total", "Decisions of a Redis store with leases, by where they were made: local (in memory, on a lease), grant (in Redis, taking a lease), strict (in Redis, without one).",
			[]string{"store", "where"}, nil),
		leaseGrants: prometheus.NewDesc("cascade_lease_grants_total", "Leases a Redis store granted (grant decisions that leased capacity).",
			[]string{"store"}, nil),
		instances: prometheus.NewDesc("cascade_store_instances", "Caddy instances sharing a Redis store, as last counted from their heartbeats (on_store_error local divides each limit by it while Redis is away).",
			[]string{"store"}, nil),
		leaseRenewals: prometheus.NewDesc("cascade_lease_renewals_total", "Leases a Redis store with leases asked for ahead of a busy path's lease ending, with no request of their own (several in one round trip).",
			[]string{"store"}, nil),
		leaseReleases: prometheus.NewDesc("cascade_lease_releases_total", "Leases that ended and gave back their unspent capacity.",
			[]string{"store"}, nil),
		leasePeerRejected: prometheus.NewDesc("cascade_lease_peer_rejected_total", "Messages on the leases' channel refused as malformed (sizes, shapes), unapplied.",
			[]string{"store"}, nil),
		busDropped: prometheus.NewDesc("cascade_bus_messages_dropped_total", "Pub/Sub messages between instances dropped, by reason: unpublished (not sent), oversized, unauthenticated (no valid HMAC under the bus key), replayed.",
			[]string{"store", "reason"}, nil),
		entRequests: prometheus.NewDesc("cascade_entitlement_requests_total", "Requests whose entitlement an entitlements block answered, by answer: cached (fresh in memory), stale (the source failing), looked_up (not in memory: looked up, the request waiting at most the block's timeout, then on the default plan).",
			[]string{"entitlements", "answer"}, nil),
		entLookups: prometheus.NewDesc("cascade_entitlement_lookups_total", "Lookups of an entitlements block's source: started, failed (its error, or out of time), shed (not started: 64 were in flight).",
			[]string{"entitlements", "result"}, nil),
		entCached: prometheus.NewDesc("cascade_entitlement_cached", "Values an entitlements block holds an answer for.",
			[]string{"entitlements"}, nil),
		capacity: prometheus.NewDesc("cascade_limit_capacity", "The capacity of each configured limit of each tree's tiers (its burst, else its count; money in micro-units), before any adaptive scaling: a tier's own limits (plan \"\") and its plan blocks'. Overrides of single values are not exported.",
			[]string{"tree", "tier", "plan", "policy", "dimension"}, nil),
		buildInfo: prometheus.NewDesc("cascade_build_info", "1, labelled with Cascade's module version (\"(devel)\" when unknown) and the Go version it was built with.",
			[]string{"version", "go_version"}, nil),
		leasePeerResets: prometheus.NewDesc("cascade_lease_peer_resets_total", "Resets made through other instances sharing a Redis store with leases, which revoked this instance's leases on the reset buckets.",
			[]string{"store"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.keys
	ch <- c.evictions
	ch <- c.replayBytes
	ch <- c.replayEvictions
	ch <- c.overrides
	ch <- c.mode
	ch <- c.breakerOpen
	ch <- c.breakerTrips
	ch <- c.leaseDecisions
	ch <- c.leaseGrants
	ch <- c.leaseRenewals
	ch <- c.leaseReleases
	ch <- c.leasePeerResets
	ch <- c.leasePeerRejected
	ch <- c.busDropped
	ch <- c.instances
	ch <- c.entRequests
	ch <- c.entLookups
	ch <- c.entCached
	ch <- c.capacity
	ch <- c.buildInfo
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	// Stores are labelled by Name, which two stores on one Redis (other
	// key prefixes, a route's store) share: the first of a name is
	// exported, a duplicate series would fail the whole scrape.
	seenStores := map[string]bool{}
	storeconfig.Each(func(_ string, p storeconfig.Pooled) bool {
		if seenStores[p.Name] {
			return true
		}
		seenStores[p.Name] = true
		if m, ok := p.Store.(*store.Memory); ok {
			ch <- prometheus.MustNewConstMetric(c.keys, prometheus.GaugeValue, float64(m.Len()), p.Name)
			ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(m.Evictions()), p.Name)
			ch <- prometheus.MustNewConstMetric(c.replayBytes, prometheus.GaugeValue, float64(m.ReplayBytes()), p.Name)
			ch <- prometheus.MustNewConstMetric(c.replayEvictions, prometheus.CounterValue, float64(m.ReplayEvictions()), p.Name)
		}
		if r := p.Redis; r != nil {
			for _, b := range r.Breakers() {
				open := 0.0
				if b.Open {
					open = 1
				}
				ch <- prometheus.MustNewConstMetric(c.breakerOpen, prometheus.GaugeValue, open, p.Name, b.Node)
				ch <- prometheus.MustNewConstMetric(c.breakerTrips, prometheus.CounterValue, float64(b.Trips), p.Name, b.Node)
			}
			bs := r.BusStats()
			for reason, n := range map[string]int64{"unpublished": bs.Dropped, "oversized": bs.Oversized, "unauthenticated": bs.Unauthenticated, "replayed": bs.Replayed} {
				ch <- prometheus.MustNewConstMetric(c.busDropped, prometheus.CounterValue, float64(n), p.Name, reason)
			}
		}
		if pr := p.Presence; pr != nil && pr.Started() {
			ch <- prometheus.MustNewConstMetric(c.instances, prometheus.GaugeValue, float64(pr.Count()), p.Name)
		}
		if l := p.Lease; l != nil {
			st := l.Stats()
			ch <- prometheus.MustNewConstMetric(c.leaseDecisions, prometheus.CounterValue, float64(st.Local), p.Name, "local")
			ch <- prometheus.MustNewConstMetric(c.leaseDecisions, prometheus.CounterValue, float64(st.Grants), p.Name, "grant")
			ch <- prometheus.MustNewConstMetric(c.leaseDecisions, prometheus.CounterValue, float64(st.Strict), p.Name, "strict")
			ch <- prometheus.MustNewConstMetric(c.leaseGrants, prometheus.CounterValue, float64(st.Leased), p.Name)
			ch <- prometheus.MustNewConstMetric(c.leaseRenewals, prometheus.CounterValue, float64(st.Renewals), p.Name)
			ch <- prometheus.MustNewConstMetric(c.leaseReleases, prometheus.CounterValue, float64(st.Released), p.Name)
			ch <- prometheus.MustNewConstMetric(c.leasePeerResets, prometheus.CounterValue, float64(st.PeerResets), p.Name)
			ch <- prometheus.MustNewConstMetric(c.leasePeerRejected, prometheus.CounterValue, float64(l.PeerRejected()), p.Name)
		}
		if p.Runtime != nil {
			ch <- prometheus.MustNewConstMetric(c.overrides, prometheus.GaugeValue, float64(len(p.Runtime.Snapshot().Overrides())), p.Name)
		}
		return true
	})
	c.collectEntitlements(ch)
	seen := map[string]bool{}
	for _, e := range running.Engines() {
		for _, t := range e.Config().Trees {
			if seen[t.Name] {
				continue
			}
			seen[t.Name] = true
			for _, mode := range []string{engine.Enforce, engine.Warn, engine.Shadow} {
				v := 0.0
				if e.Mode(t) == mode {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(c.mode, prometheus.GaugeValue, v, t.Name, mode)
			}
			c.collectCapacities(ch, t.Tree)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.buildInfo, prometheus.GaugeValue, 1, moduleVersion(), runtime.Version())
}

// collectCapacities exports the capacity of each limit configured in t's
// tiers and their plan blocks. Two limits alike in every label (which
// compiling should not allow) are exported once: a repeated series would
// fail the whole scrape.
func (c *stateCollector) collectCapacities(ch chan<- prometheus.Metric, t *hierarchy.Tree) {
	seen := map[[4]string]bool{}
	each := func(tier, plan string, limits []*hierarchy.Limit) {
		for _, l := range limits {
			labels := [4]string{tier, plan, l.Policy(), l.Dimension}
			if seen[labels] {
				continue
			}
			seen[labels] = true
			ch <- prometheus.MustNewConstMetric(c.capacity, prometheus.GaugeValue, float64(l.Rate().Capacity()),
				t.Name, tier, plan, l.Policy(), l.Dimension)
		}
	}
	for _, tier := range t.Tiers {
		each(tier.Name, "", tier.Limits)
		plans := make([]string, 0, len(tier.Plans))
		for name := range tier.Plans {
			plans = append(plans, name)
		}
		slices.Sort(plans)
		for _, name := range plans {
			if o := tier.Plans[name]; o != nil {
				each(tier.Name, name, o.Limits)
			}
		}
	}
}

// cascadeModule is this module's path, as a build lists it.
const cascadeModule = "github.com/caddy-cascade/cascade"

// moduleVersion is the version of Cascade built in: its module's among
// the dependencies of a Caddy built with it (xcaddy), the main module's
// when it is Cascade, else "(devel)".
var moduleVersion = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(devel)"
	}
	v := ""
	if bi.Main.Path == cascadeModule {
		v = bi.Main.Version
	}
	for _, dep := range bi.Deps {
		if dep.Path != cascadeModule {
			continue
		}
		v = dep.Version
		if dep.Replace != nil {
			v = dep.Replace.Version // "" for a local directory
		}
	}
	if v == "" {
		return "(devel)"
	}
	return v
})

// collectEntitlements exports the entitlements blocks' caches, summed by
// name over the handlers that have one.
func (c *stateCollector) collectEntitlements(ch chan<- prometheus.Metric) {
	sums := map[string]*entitle.Stats{}
	for _, e := range running.Engines() {
		for _, b := range running.EntitlementsOf(e) {
			if b.Stats == nil {
				continue
			}
			st := b.Stats()
			sum := sums[b.Name]
			if sum == nil {
				sum = &entitle.Stats{}
				sums[b.Name] = sum
			}
			sum.Hits += st.Hits
			sum.Stale += st.Stale
			sum.Misses += st.Misses
			sum.Lookups += st.Lookups
			sum.Failures += st.Failures
			sum.Shed += st.Shed
			sum.Entries += st.Entries
		}
	}
	for name, st := range sums {
		ch <- prometheus.MustNewConstMetric(c.entRequests, prometheus.CounterValue, float64(st.Hits), name, "cached")
		ch <- prometheus.MustNewConstMetric(c.entRequests, prometheus.CounterValue, float64(st.Stale), name, "stale")
		ch <- prometheus.MustNewConstMetric(c.entRequests, prometheus.CounterValue, float64(st.Misses), name, "looked_up")
		ch <- prometheus.MustNewConstMetric(c.entLookups, prometheus.CounterValue, float64(st.Lookups), name, "started")
		ch <- prometheus.MustNewConstMetric(c.entLookups, prometheus.CounterValue, float64(st.Failures), name, "failed")
		ch <- prometheus.MustNewConstMetric(c.entLookups, prometheus.CounterValue, float64(st.Shed), name, "shed")
		ch <- prometheus.MustNewConstMetric(c.entCached, prometheus.GaugeValue, float64(st.Entries), name)
	}
}
