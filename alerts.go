package cascade

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/alert"
)

// AlertsConfig says where the budget alerts of limits with thresholds
// (limit 100 usd/month alert 50% 80% 100%) go: always a log line (INFO),
// and to Webhook when set.
type AlertsConfig struct {
	// Webhook receives each alert as a JSON POST (see alert.Event).
	Webhook string `json:"webhook,omitempty"`
	// Headers are added to each POST (e.g. Authorization); placeholders
	// such as {env.ALERT_TOKEN} are resolved. They are never logged.
	Headers map[string]string `json:"headers,omitempty"`
	// Timeout bounds each attempt (default 5s); Retries is how many times
	// a failed POST is tried again (default 3), with backoff.
	Timeout caddy.Duration `json:"timeout,omitempty"`
	Retries int            `json:"retries,omitempty"`
}

// alerting is a handler's budget alerts: the webhook's sender, and the
// thresholds this instance knows were crossed already this period.
type alerting struct {
	sender *alert.Sender // nil without a webhook
	mu     sync.Mutex
	seen   map[crossing]time.Time // until when each is known crossed
}

// crossing is a threshold of a bucket's limit.
type crossing struct {
	bucket    string
	threshold int
}

// provisionAlerts readies the alerts when some limit has thresholds.
func (h *Handler) provisionAlerts() error {
	if !slices.ContainsFunc(h.trees, func(t *Tree) bool {
		for _, l := range t.Limits() {
			if len(l.Alerts) > 0 {
				return true
			}
		}
		return false
	}) {
		if h.Alerts != nil {
			h.logger.Warn("rate_limit: alerts are configured, but no limit has thresholds: add alert 80% (say) to a limit")
		}
		return nil
	}
	h.alerting = &alerting{seen: map[crossing]time.Time{}}
	if h.Alerts == nil || h.Alerts.Webhook == "" {
		return nil
	}
	repl := caddy.NewReplacer()
	hdr := http.Header{}
	for k, v := range h.Alerts.Headers {
		hdr.Set(k, repl.ReplaceAll(v, ""))
	}
	m := h.metrics
	sender, err := alert.New(alert.Options{
		URL: repl.ReplaceAll(h.Alerts.Webhook, ""), Timeout: time.Duration(h.Alerts.Timeout), Retries: h.Alerts.Retries,
		Header: hdr, Logger: h.logger.Named("alerts"), OnResult: m.alert,
	})
	if err != nil {
		return fmt.Errorf("rate_limit: alerts: %w", err)
	}
	h.alerting.sender = sender
	return nil
}

// closeAlerts sends what is queued, for at most 5 s.
func (h *Handler) closeAlerts() {
	if h.alerting == nil || h.alerting.sender == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = h.alerting.sender.Close(ctx)
}

// checkAlerts alerts each threshold of d's limits that its charge took a
// value's usage across, once a period for all instances sharing the store
// (a mark in the store: one call the first time an instance sees a
// threshold crossed in a period). A charge corrected later (reconciled)
// shows at the value's next decision.
func (h *Handler) checkAlerts(ctx context.Context, d *decision) {
	now := time.Now()
	for i, b := range d.Buckets {
		if len(b.Limit.Alerts) == 0 || i >= len(d.Results) || i >= len(d.Limits) {
			continue
		}
		capacity := d.Limits[i].Limit.Capacity()
		used := capacity - d.Results[i].Remaining
		for _, t := range b.Limit.Alerts {
			if float64(used)*100 < float64(t)*float64(capacity) {
				break
			}
			key := crossing{b.Key, t}
			if h.alerting.known(key, now) {
				continue
			}
			first, err := d.Mark(ctx, i, strconv.Itoa(t))
			if err != nil {
				h.logStoreError(err)
				continue
			}
			periodEnd := now.Add(time.Duration(d.Results[i].Reset) * time.Microsecond)
			h.alerting.remember(key, periodEnd, now)
			if !first {
				continue
			}
			e := alert.Event{
				Tree: b.Tree.Name, Tier: b.Tier.Name, Value: h.engine.Show(b.Tier, b.Value), Limit: b.Limit.String(),
				Dimension: b.Limit.Dimension, PeriodEnd: periodEnd.UTC(), Used: used, Capacity: capacity, Threshold: t,
			}
			h.metrics.alert("crossed")
			h.logger.Info("rate limit: a value crossed a limit's alert threshold",
				zap.String("tree", e.Tree), zap.String("tier", e.Tier), zap.String("value", e.Value), zap.String("limit", e.Limit),
				zap.Int("threshold", t), zap.Int64("used", used), zap.Int64("capacity", capacity), zap.Time("period_end", e.PeriodEnd))
			if h.alerting.sender != nil {
				h.alerting.sender.Send(e)
			}
		}
	}
}

// known reports whether key is known crossed at now.
func (a *alerting) known(key crossing, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	until, ok := a.seen[key]
	return ok && now.Before(until)
}

// remember notes key crossed until until, forgetting what has expired
// once the notes grow past 10,000.
func (a *alerting) remember(key crossing, until, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seen) >= 10000 {
		for k, u := range a.seen {
			if !now.Before(u) {
				delete(a.seen, k)
			}
		}
	}
	if len(a.seen) < 100000 {
		a.seen[key] = until
	}
}
