package cascade

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/internal/promreg"
)

// metrics are the handler's Prometheus collectors, registered in Caddy's
// metrics registry (served by Caddy's admin /metrics endpoint).
type metrics struct {
	decisions *prometheus.CounterVec
	ok        prometheus.Counter // decisions{result="ok"}, looked up once
	denied    *prometheus.CounterVec
	duration  prometheus.Histogram
	// wouldBlock counts, by tree and mode, the refusals a tree in warn or
	// shadow mode let pass; counted on refuse's path, not on every request.
	wouldBlock *prometheus.CounterVec

	reconciled      prometheus.Counter
	reconcileErrors prometheus.Counter
	local           prometheus.Counter
	held            *prometheus.CounterVec
	holding         prometheus.Gauge
	alerts          *prometheus.CounterVec
	// Per store, recorded only by handlers with routes (a label lookup
	// per request the others need not pay).
	storeDecisions *prometheus.CounterVec
	storeDuration  *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cascade", Name: "decisions_total",
			Help: "Rate limit decisions by result: the decision's reason (ok, limited, penalty, impossible, store_error, …).",
		}, []string{"result"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cascade", Name: "denied_total",
			Help: "Requests over a limit, by the tree/tier that denied them.",
		}, []string{"blocked_by"}),
		wouldBlock: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cascade", Name: "would_block_total",
			Help: "Requests a tree in warn or shadow mode would have refused (its limits denied them; they passed), by tree and mode; each denying tree counted once per request. Beside a tree that enforces, counted too (the request then is the enforcing trees' to answer).",
		}, []string{"tree", "mode"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "cascade", Name: "decision_duration_seconds",
			Help:    "Time to decide one request, store round trip included.",
			Buckets: []float64{.00001, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .05},
		}),
		reconciled: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "cascade", Name: "reconciled_total",
			Help: "Charges corrected from the upstream's reported usage.",
		}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "cascade", Name: "reconcile_errors_total",
			Help: "Corrections from reported usage that the store failed to apply.",
		}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cascade", Name: "held_requests_total",
			Help: "Requests admitted to wait their turn (max_wait), by how the wait ended: released, queue_full (refused, max_queued held), gone (the client left), yielded (a batch request refused while interactive ones wait on its limits), preempted (a held batch request whose place an interactive one took), redecided (decided again after preempting batch reservations, and not admitted to wait).",
		}, []string{"outcome"}),
		storeDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cascade", Name: "store_decisions_total",
			Help: "Decisions of handlers with routes, by the store that decided (the handler's or a route's) and result (ok, limited, store_error, …).",
		}, []string{"store", "result"}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "cascade", Name: "store_decision_duration_seconds",
			Help:    "Time to decide one request of a handler with routes, by the store that decided.",
			Buckets: []float64{.00001, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .05, .25, 1},
		}, []string{"store"}),
		alerts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "cascade", Name: "alerts_total",
			Help: "Budget alerts by outcome: crossed (a limit's threshold first crossed by a value this period, once for all instances), sent, failed or dropped (its webhook).",
		}, []string{"outcome"}),
		holding: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "cascade", Name: "held_requests",
			Help: "Requests held for their turn now (max_wait), each with its place in line.",
		}),
		local: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "cascade", Name: "local_decisions_total",
			Help: "Decisions made in memory on each limit's local share because Redis could not decide (on_store_error local).",
		}),
	}
	if reg != nil {
		var err error
		if m.decisions, err = promreg.Register(reg, m.decisions); err != nil {
			return nil, err
		}
		if m.denied, err = promreg.Register(reg, m.denied); err != nil {
			return nil, err
		}
		if m.wouldBlock, err = promreg.Register(reg, m.wouldBlock); err != nil {
			return nil, err
		}
		if m.duration, err = promreg.Register(reg, m.duration); err != nil {
			return nil, err
		}
		if m.reconciled, err = promreg.Register(reg, m.reconciled); err != nil {
			return nil, err
		}
		if m.reconcileErrors, err = promreg.Register(reg, m.reconcileErrors); err != nil {
			return nil, err
		}
		if m.local, err = promreg.Register(reg, m.local); err != nil {
			return nil, err
		}
		if m.held, err = promreg.Register(reg, m.held); err != nil {
			return nil, err
		}
		if m.holding, err = promreg.Register(reg, m.holding); err != nil {
			return nil, err
		}
		if m.alerts, err = promreg.Register(reg, m.alerts); err != nil {
			return nil, err
		}
		if m.storeDecisions, err = promreg.Register(reg, m.storeDecisions); err != nil {
			return nil, err
		}
		if m.storeDuration, err = promreg.Register(reg, m.storeDuration); err != nil {
			return nil, err
		}
		if _, err = promreg.Register(reg, newStateCollector()); err != nil {
			return nil, err
		}
	}
	m.ok = m.decisions.WithLabelValues("ok")
	return m, nil
}

// alert counts a budget alert by outcome: crossed (a threshold first
// crossed this period, for all instances), then sent, failed or dropped
// (its webhook).
func (m *metrics) alert(outcome string) {
	if m != nil {
		m.alerts.WithLabelValues(outcome).Inc()
	}
}

// observe counts one decision. A nil *metrics (disable_metrics) counts
// nothing, as do its other methods.
func (m *metrics) observe(d *decision, took time.Duration) {
	if m == nil {
		return
	}
	if d.Reason == engine.ReasonOK {
		m.ok.Inc()
	} else {
		m.decisions.WithLabelValues(d.Reason).Inc()
	}
	if d.Blocked != "" {
		m.denied.WithLabelValues(d.Blocked).Inc()
	}
	if d.Local {
		m.local.Inc()
	}
	if d.Reason != engine.ReasonMissingKey && d.Reason != reasonBadCost {
		m.duration.Observe(took.Seconds())
	}
}

// wouldBlocked counts a refusal that passes because the trees that denied
// it are in warn or shadow mode (refuse): once for each tree whose limits
// denied, with that tree's mode in force.
func (m *metrics) wouldBlocked(e *engine.Engine, d *decision) {
	if m == nil || (d.Reason != engine.ReasonLimited && d.Reason != engine.ReasonImpossible && d.Reason != engine.ReasonPenalty) {
		return
	}
	trees := e.Config().Trees
	for i := range min(len(d.Results), len(d.Buckets)) {
		if d.Results[i].Allowed || deniedEarlier(d, i) {
			continue
		}
		for _, t := range trees {
			if t.Tree != d.Buckets[i].Tree {
				continue
			}
			if mode := e.Mode(t); mode == engine.Warn || mode == engine.Shadow {
				m.wouldBlock.WithLabelValues(t.Name, mode).Inc()
			}
		}
	}
}

// wouldBlockedBeside counts the trees in warn or shadow mode that denied a
// request the enforcing trees beside them then decided alone.
//
//go:noinline
func (m *metrics) wouldBlockedBeside(e *engine.Engine, d *decision) {
	if m == nil {
		return
	}
	for _, t := range d.WouldBlock {
		if mode := e.Mode(t); mode == engine.Warn || mode == engine.Shadow {
			m.wouldBlock.WithLabelValues(t.Name, mode).Inc()
		}
	}
}

// deniedEarlier reports whether a bucket before i, of bucket i's tree,
// denied d: its tree is counted once.
func deniedEarlier(d *decision, i int) bool {
	for j := range i {
		if !d.Results[j].Allowed && d.Buckets[j].Tree == d.Buckets[i].Tree {
			return true
		}
	}
	return false
}

// observeStore counts one decision of a handler with routes by the store
// that decided it.
func (m *metrics) observeStore(store string, d *decision, took time.Duration) {
	if m == nil || d.Reason == engine.ReasonMissingKey || d.Reason == reasonBadCost || len(d.Buckets) == 0 {
		return
	}
	result := d.Reason
	if d.Local {
		result = "local" // the store failed: decided in memory (on_store_error local)
	}
	m.storeDecisions.WithLabelValues(store, result).Inc()
	m.storeDuration.WithLabelValues(store).Observe(took.Seconds())
}

// heldEnded counts a held request's wait, ended by outcome.
func (m *metrics) heldEnded(outcome waitOutcome) {
	if m != nil {
		m.held.WithLabelValues(string(outcome)).Inc()
	}
}

// holdingNow counts a request held with its place in line, until the
// returned func is called.
func (m *metrics) holdingNow() (done func()) {
	if m == nil {
		return func() {}
	}
	m.holding.Inc()
	return m.holding.Dec
}

// reconcile counts one reconciliation, failed (err) or done.
func (m *metrics) reconcile(err error) {
	switch {
	case m == nil:
	case err != nil:
		m.reconcileErrors.Inc()
	default:
		m.reconciled.Inc()
	}
}

func microseconds(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
