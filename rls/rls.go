// Package rls serves Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService) on Cascade's engine: Envoy's
// ratelimit HTTP filter asks ShouldRateLimit about each request, with the
// descriptors its route's rate_limits actions produced, and Cascade decides
// them as it decides a request in Caddy.
//
// A domain names a tree (by default the tree of the domain's name). Each
// descriptor of a call is a path in that tree: its entries' keys name
// tiers, their values are the tiers' key values. Entries may come in any
// order; the path runs from the top tier to the deepest tier named, and a
// tier above it that is not named is missing (its missing policy applies:
// skip leaves it out, shared uses the bucket of requests without one, deny
// makes the call invalid; a tier with a constant key needs no entry). So
// Envoy's usual hierarchical style works unchanged:
//
//	descriptors: [{org: acme}], [{org: acme}, {user: bob}]
//
// is the path org=acme > user=bob, and its org bucket is charged once.
//
// All descriptors of a call are decided together, all or nothing, in one
// store call: a call refused by any bucket charges none. hits_addend (the
// descriptor's own, else the call's; 0 or absent at either level means 1,
// as Envoy's call-level field says) is what the call costs in the domain's
// dimension (requests unless configured: with tokens, each call also costs
// 1 request, and other dimensions nothing); a bucket several descriptors
// share costs the largest of their addends. An addend above the route's
// MaxAddend is refused as invalid.
//
// A descriptor with is_negative_hits gives its addend back to its path (a
// refund, in the same call) only on a route that allows refunds; elsewhere
// the call is refused as invalid and nothing is charged or given back: a
// caller that may refund may reset any bucket it can name.
//
// A tier whose key is a constant (a global ceiling) is one bucket: an entry
// naming it cannot choose another value, whatever value it gives.
//
// Beside trees, a Server serves envoyproxy/ratelimit's YAML configuration
// as it is (LoadRules), with its semantics where its users rely on them
// (Envoy): its domains are decided by their rules, not by trees.
package rls

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/logsample"
	"github.com/caddy-cascade/cascade/rate"
)

// MaxDescriptors bounds the descriptors of one call: Envoy sends one per
// rate_limits action set, a handful.
const MaxDescriptors = 64

// DefaultMaxAddend is the largest hits_addend a route takes unless it says
// otherwise: the most Envoy's call-level field (a uint32) can carry. A
// descriptor's own field is 64 bits wide; nothing real needs more.
const DefaultMaxAddend = math.MaxUint32

// MaxMaxAddend bounds Route.MaxAddend: far above any limit, far below
// overflowing a cost.
const MaxMaxAddend = 1 << 53

// Route is where the calls of one domain are decided.
type Route struct {
	Engine *engine.Engine
	Tree   *engine.Tree
	// Dimension is what hits_addend counts: hierarchy.Requests (or empty)
	// or one of the tree's cost dimensions, such as tokens.
	Dimension string
	// AllowRefunds lets descriptors with is_negative_hits give hits back.
	// Off, such a call is refused as invalid: whoever may refund can reset
	// any bucket it names.
	AllowRefunds bool
	// MaxAddend is the largest hits_addend taken (at either level); a
	// larger one is refused as invalid. 0 is DefaultMaxAddend.
	MaxAddend int64
}

// ValidAddend says whether n can be a Route's MaxAddend.
func ValidAddend(n int64) error {
	if n < 0 || n > MaxMaxAddend {
		return fmt.Errorf("max_hits_addend %d: give 1 to %d", n, int64(MaxMaxAddend))
	}
	return nil
}

// Observer is told of each call: its domain (as configured, or "unknown"),
// its outcome (ok, over_limit, invalid or unavailable) and how long
// deciding it took.
type Observer func(domain, outcome string, took time.Duration)

// Server implements RateLimitServiceServer. Its routes can be replaced
// while it serves (on a configuration reload).
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	config atomic.Pointer[config]
	logger *zap.Logger

	storeErrorLog logsample.Every // store failures: one logged a second
	unknownDomain logsample.Every // calls on unknown domains beside rules: one logged a second
}

// logStoreError logs a store failure at most once a second, with the
// number of failures since the last line: a dead Redis under load must not
// turn every call into a log line.
func (s *Server) logStoreError(msg, domain string, err error) {
	ok, held := s.storeErrorLog.Allow(time.Now())
	if !ok {
		return
	}
	s.logger.Error(msg, zap.String("domain", domain), zap.Error(err), zap.Int64("failures", held+1))
}

// config is what a configuration gives the server.
type config struct {
	routes  map[string]Route
	envoy   *Envoy // the domains of envoyproxy/ratelimit's configuration, nil for none
	observe Observer
}

// New returns a server with no routes: every call is refused as for an
// unknown domain until SetRoutes.
func New(logger *zap.Logger) *Server {
	if logger == nil {
		logger = zap.NewNop()
	}
	s := &Server{logger: logger}
	s.config.Store(&config{})
	return s
}

// Register registers s on g.
func (s *Server) Register(g *grpc.Server) { rlsv3.RegisterRateLimitServiceServer(g, s) }

// SetRoutes replaces the routes by domain, and the observer of calls (nil
// for none).
func (s *Server) SetRoutes(routes map[string]Route, observe Observer) {
	s.Set(routes, nil, observe)
}

// Set replaces the routes by domain, the domains of envoyproxy/ratelimit's
// configuration (nil for none: they win over a route of the same name),
// and the observer of calls (nil for none), all at once.
func (s *Server) Set(routes map[string]Route, envoy *Envoy, observe Observer) {
	s.config.Store(&config{routes: routes, envoy: envoy, observe: observe})
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "cascade: "+format, args...)
}

// ShouldRateLimit decides one call: see the package comment.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	cfg := s.config.Load()
	if cfg.observe == nil {
		return s.decideAny(ctx, cfg, req)
	}
	start := time.Now()
	res, err := s.decideAny(ctx, cfg, req)
	domain := req.GetDomain()
	if _, ok := cfg.routes[domain]; !ok && cfg.envoy.domain(domain) == nil {
		domain = "unknown" // not a label an attacker may choose
	}
	outcome := "ok"
	switch {
	case status.Code(err) == codes.InvalidArgument:
		outcome = "invalid"
	case err != nil:
		outcome = "unavailable"
	case res.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT:
		outcome = "over_limit"
	}
	cfg.observe(domain, outcome, time.Since(start))
	return res, err
}

// decideAny decides a call on the domain of envoyproxy/ratelimit's
// configuration it names, else on its route. With such a configuration, a
// domain that neither has is answered as envoyproxy/ratelimit answers it:
// OK, nothing limited.
func (s *Server) decideAny(ctx context.Context, cfg *config, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if top := cfg.envoy.domain(req.GetDomain()); top != nil {
		res, err := cfg.envoy.decide(ctx, top, req)
		if err != nil && status.Code(err) == codes.Unknown {
			s.logStoreError("rls: the rate limit store failed", req.GetDomain(), err)
			return nil, status.Errorf(codes.Unavailable, "cascade: the rate limit store could not decide: %v", err)
		}
		return res, err
	}
	if _, ok := cfg.routes[req.GetDomain()]; !ok && cfg.envoy != nil {
		if req.GetDomain() == "" {
			return nil, invalid("the domain is empty")
		}
		if len(req.GetDescriptors()) == 0 {
			return nil, invalid("a call needs at least one descriptor")
		}
		s.unknownDomainLog(req.GetDomain())
		res := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))}
		for i := range res.Statuses {
			res.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		}
		return res, nil
	}
	return s.decide(ctx, cfg.routes, req)
}

// unknownDomainLog warns of a call on a domain nobody configured, at most
// once a second: envoyproxy/ratelimit lets it through, and so does Cascade
// beside its configuration, but it is likely a mistake.
func (s *Server) unknownDomainLog(domain string) {
	ok, held := s.unknownDomain.Allow(time.Now())
	if !ok {
		return
	}
	s.logger.Warn("rls: a call on a domain of no rule nor tree is not limited", zap.String("domain", truncate(domain, 128)), zap.Int64("calls", held+1))
}

func (s *Server) decide(ctx context.Context, routes map[string]Route, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	rt, ok := routes[req.GetDomain()]
	if !ok {
		names := make([]string, 0, len(routes))
		for name := range routes {
			names = append(names, name)
		}
		sort.Strings(names)
		return nil, invalid("no domain %q: the domains served are %s", truncate(req.GetDomain(), 128), strings.Join(names, ", "))
	}
	e := rt.Engine
	var d, refund engine.Decision
	e.Begin(&d)
	defer d.Release()
	e.Begin(&refund)
	defer refund.Release()
	var spanBuf [8]span
	var idxBuf [32]int
	var costBuf [32]int64
	spans, idx, costs, refunds, err := translate(rt, req, &d, &refund, spanBuf[:0], idxBuf[:0], costBuf[:0])
	if err != nil {
		return nil, err
	}
	if len(refund.Buckets) > 0 {
		if err := refund.Adjust(ctx, refunds); err != nil {
			err = e.ShowError(err, refund.Buckets) // a store error may quote a key
			s.logStoreError("rls: giving back hits failed", req.GetDomain(), err)
			return nil, status.Errorf(codes.Unavailable, "cascade: the rate limit store could not give the hits back: %v", err)
		}
	}

	descs := req.GetDescriptors()
	res := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs))}
	for i := range res.Statuses {
		res.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	if len(d.Buckets) == 0 {
		return res, nil // refunds only, or paths with no limit (unlimited values)
	}
	// Untracked: Envoy never says when a request ends.
	if err := e.Decide(ctx, &d, engine.Request{Costs: costs, Untracked: true}); err != nil {
		err = e.ShowError(err, d.Buckets) // a store error may quote a key
		s.logStoreError("rls: the rate limit store failed", req.GetDomain(), err)
		return nil, status.Errorf(codes.Unavailable, "cascade: the rate limit store could not decide: %v", err)
	}
	mode := d.Mode
	for i, sp := range spans {
		if sp.negative || sp.from == sp.to {
			continue
		}
		res.Statuses[i] = statusOf(&d, idx[sp.from:sp.to], mode)
	}
	if mode == engine.Shadow {
		return res, nil // recorded; nothing shows
	}
	hdr := http.Header{}
	d.WriteHeaders(hdr)
	res.ResponseHeadersToAdd = headersOf(hdr)
	if !d.Allowed {
		d.NoteDenial("rls:"+req.GetDomain(), nil)
		if mode == engine.Enforce {
			res.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			p := engine.NewProblem(http.StatusTooManyRequests, d.Reason, "Too Many Requests", d.Detail(), &d)
			res.RawBody, _ = json.Marshal(p)
		}
	}
	return res, nil
}

// span is one descriptor's buckets, as positions in its decision's
// Buckets before they are merged.
type span struct {
	from, to int
	addend   int64
	negative bool
}

// translate turns a call on route rt into what the store is asked, and
// touches no store: d's Buckets and their costs (each bucket once, charged
// the largest addend any descriptor asks of it), refund's Buckets and what
// each gets back (refunds, negative), each descriptor's span, and idx, the
// position in d.Buckets of each bucket of a charging span. spans, idx and
// costs are buffers to append to. Any bad descriptor is an InvalidArgument
// error, before anything is asked.
func translate(rt Route, req *rlsv3.RateLimitRequest, d, refund *engine.Decision, spans []span, idx []int, costs []int64) (_ []span, _ []int, _, refunds []int64, _ error) {
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, nil, nil, nil, invalid("a call needs at least one descriptor")
	}
	if len(descs) > MaxDescriptors {
		return nil, nil, nil, nil, invalid("%d descriptors in one call, at most %d", len(descs), MaxDescriptors)
	}
	e, t := rt.Engine, rt.Tree
	dim := rt.Dimension
	if dim == "" {
		dim = hierarchy.Requests
	}
	limit := rt.MaxAddend
	if limit <= 0 {
		limit = DefaultMaxAddend
	}
	for i, desc := range descs {
		if desc.GetIsNegativeHits() && !rt.AllowRefunds {
			return nil, nil, nil, nil, invalid("descriptor %d has is_negative_hits, but domain %s does not take refunds: a caller that may refund can reset any bucket it names (allow them with allow_refunds on the domain: rls { domain %s allow_refunds })",
				i, truncate(req.GetDomain(), 128), truncate(req.GetDomain(), 128))
		}
		addend, err := addendOf(req, desc, limit)
		if err != nil {
			return nil, nil, nil, nil, invalid("descriptor %d: %v", i, err)
		}
		if desc.GetLimit() != nil {
			return nil, nil, nil, nil, invalid("descriptor %d carries a limit: Cascade's limits are its configuration's (a runtime override through the admin API changes one)", i)
		}
		into := d
		if desc.GetIsNegativeHits() {
			into = refund
		}
		values, err := pathOf(t, desc.GetEntries(), into.Values())
		if err != nil {
			return nil, nil, nil, nil, invalid("descriptor %d: %v", i, err)
		}
		from := len(into.Buckets)
		if err := e.Add(into, t, values); err != nil {
			return nil, nil, nil, nil, invalid("descriptor %d: %v", i, err)
		}
		to := len(into.Buckets)
		spans = append(spans, span{from: from, to: to, addend: addend, negative: desc.GetIsNegativeHits()})
		if desc.GetIsNegativeHits() {
			for _, b := range into.Buckets[from:to] {
				refunds = append(refunds, -costOf(b.Limit.Dimension, dim, addend, true))
			}
		}
	}

	// Merge the buckets several descriptors share: each is charged once,
	// the largest addend any of them asks.
	n := len(d.Buckets)
	idx = slices.Grow(idx[:0], n)[:n]
	merged := 0
	for _, sp := range spans {
		if sp.negative {
			continue
		}
		for k := sp.from; k < sp.to; k++ {
			b := d.Buckets[k]
			c := costOf(b.Limit.Dimension, dim, sp.addend, false)
			j := slices.IndexFunc(d.Buckets[:merged], func(m hierarchy.Bucket) bool { return m.Key == b.Key })
			if j >= 0 {
				costs[j] = max(costs[j], c)
				idx[k] = j
				continue
			}
			d.Buckets[merged] = b
			costs = append(costs, c)
			idx[k] = merged
			merged++
		}
	}
	d.Buckets = d.Buckets[:merged]
	return spans, idx, costs, refunds, nil
}

// addendOf is a descriptor's hits_addend: its own when set, else the
// call's; 0 at either level means 1 (a call that counts nothing would be
// admitted for free). More than limit is an error.
func addendOf(req *rlsv3.RateLimitRequest, desc *ratelimitv3.RateLimitDescriptor, limit int64) (int64, error) {
	a := uint64(req.GetHitsAddend())
	if w := desc.GetHitsAddend(); w != nil {
		a = w.GetValue()
	}
	a = max(a, 1)
	if a > uint64(limit) {
		return 0, fmt.Errorf("hits_addend %d is more than this domain takes (at most %d: max_hits_addend)", a, limit)
	}
	return int64(a), nil
}

// costOf is what a bucket of dimension bdim costs a call whose addend
// counts dim: the addend in dim, 1 in requests (a call is one request;
// nothing when giving back), nothing in other dimensions.
func costOf(bdim, dim string, addend int64, refund bool) int64 {
	switch {
	case bdim == dim:
		return addend
	case bdim == hierarchy.Requests && !refund:
		return 1
	}
	return 0
}

// pathOf appends to values the tier values of a descriptor's entries: from
// the top tier to the deepest one named; see the package comment.
func pathOf(t *engine.Tree, entries []*ratelimitv3.RateLimitDescriptor_Entry, values []string) ([]string, error) {
	depth := 0
	for _, en := range entries {
		_, i := t.Tier(en.GetKey())
		if i < 0 {
			return nil, fmt.Errorf("the key %q is not a tier of tree %s: its tiers are %s",
				truncate(en.GetKey(), 64), t.Name, strings.Join(t.TierNames(), ", "))
		}
		depth = max(depth, i+1)
	}
	if depth == 0 {
		return nil, fmt.Errorf("no entries: name at least one tier of tree %s (%s)", t.Name, strings.Join(t.TierNames(), ", "))
	}
	for _, tier := range t.Tiers[:depth] {
		v, given := "", false
		for _, en := range entries {
			if en.GetKey() == tier.Name {
				if given {
					return nil, fmt.Errorf("the tier %s is named twice", tier.Name)
				}
				v, given = en.GetValue(), true
			}
		}
		if !tier.Dynamic() {
			// A constant tier (a global ceiling) is one bucket, whatever
			// value an entry gives: a caller must not get a ceiling of its
			// own by naming one.
			v = tier.Key
		}
		values = append(values, v)
	}
	return values, nil
}

// statusOf is the status of a descriptor whose buckets are d's at idx:
// the one that refused, else, of those the call was charged to, the one
// with the least left.
func statusOf(d *engine.Decision, idx []int, mode string) *rlsv3.RateLimitResponse_DescriptorStatus {
	pick, best := -1, math.Inf(1)
	for _, j := range idx {
		r := d.Results[j]
		if !r.Allowed {
			pick = j
			break
		}
		left := float64(r.Remaining) / float64(max(d.Limits[j].Limit.Capacity(), 1))
		if d.Costs[j] == 0 {
			left += 2 // a bucket not charged is shown only when no other is
		}
		if left < best {
			pick, best = j, left
		}
	}
	r := d.Results[pick]
	st := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:           rlsv3.RateLimitResponse_OK,
		CurrentLimit:   limitOf(d.Buckets[pick].Limit, d.Limits[pick].Limit),
		LimitRemaining: uint32(min(r.Remaining, math.MaxUint32)),
	}
	wait := r.Reset
	if !r.Allowed && mode != engine.Shadow {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		if r.RetryAfter > 0 {
			wait = r.RetryAfter
		}
	}
	st.DurationUntilReset = durationpb.New(time.Duration(wait) * time.Microsecond)
	return st
}

// units are Envoy's units of time, longest first, as whole seconds.
var units = []struct {
	unit    rlsv3.RateLimitResponse_RateLimit_Unit
	seconds int64
}{
	{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * 86400},
	{rlsv3.RateLimitResponse_RateLimit_DAY, 86400},
	{rlsv3.RateLimitResponse_RateLimit_HOUR, 3600},
	{rlsv3.RateLimitResponse_RateLimit_MINUTE, 60},
	{rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
}

// limitOf describes a limit as Envoy does: its effective quota per unit
// of time. A window that is not one unit is the longest unit that divides
// it, times unit_multiplier (90 s is 90 SECOND, 2 h is 2 HOUR); a calendar
// month is one MONTH.
func limitOf(hl *hierarchy.Limit, l rate.Limit) *rlsv3.RateLimitResponse_RateLimit {
	out := &rlsv3.RateLimitResponse_RateLimit{
		Name:            hl.Policy(),
		RequestsPerUnit: uint32(min(l.Capacity(), math.MaxUint32)),
		Unit:            rlsv3.RateLimitResponse_RateLimit_SECOND,
	}
	if l.Algorithm == rate.Calendar && l.Unit == rate.Month {
		out.Unit = rlsv3.RateLimitResponse_RateLimit_MONTH
		return out
	}
	w := max(l.WindowSeconds(), 1)
	for _, u := range units {
		if w%u.seconds == 0 {
			out.Unit = u.unit
			if m := w / u.seconds; m > 1 {
				out.UnitMultiplier = wrapperspb.UInt32(uint32(min(m, math.MaxUint32)))
			}
			break
		}
	}
	return out
}

// headersOf turns the rate-limit headers into Envoy's, in lower case (as
// HTTP/2 writes them).
func headersOf(hdr http.Header) []*corev3.HeaderValue {
	out := make([]*corev3.HeaderValue, 0, len(hdr))
	for k, vs := range hdr {
		for _, v := range vs {
			out = append(out, &corev3.HeaderValue{Key: strings.ToLower(k), Value: v})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
