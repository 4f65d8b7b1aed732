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
// descriptor's own, else the call's; 0 or absent at call level means 1) is
// what the call costs in the domain's dimension (requests unless
// configured: with tokens, each call also costs 1 request, and other
// dimensions nothing); a bucket several descriptors share costs the
// largest of their addends. A descriptor with is_negative_hits gives its
// addend back to its path (a refund, never refused), in the same call.
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
	"github.com/caddy-cascade/cascade/rate"
)

// MaxDescriptors bounds the descriptors of one call: Envoy sends one per
// rate_limits action set, a handful.
const MaxDescriptors = 64

// maxAddend bounds a hits_addend: far above any limit, far below
// overflowing a cost.
const maxAddend = 1 << 53

// Route is where the calls of one domain are decided.
type Route struct {
	Engine *engine.Engine
	Tree   *engine.Tree
	// Dimension is what hits_addend counts: hierarchy.Requests (or empty)
	// or one of the tree's cost dimensions, such as tokens.
	Dimension string
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

	storeErrors      atomic.Int64 // store failures since the last line logged
	storeErrorLogged atomic.Int64 // when that line was logged (Unix ns)
}

// logStoreError logs a store failure at most once a second, with the
// number of failures since the last line: a dead Redis under load must not
// turn every call into a log line.
func (s *Server) logStoreError(msg, domain string, err error) {
	n := s.storeErrors.Add(1)
	now := time.Now().UnixNano()
	last := s.storeErrorLogged.Load()
	if now-last < int64(time.Second) || !s.storeErrorLogged.CompareAndSwap(last, now) {
		return
	}
	s.storeErrors.Add(-n)
	s.logger.Error(msg, zap.String("domain", domain), zap.Error(err), zap.Int64("failures", n))
}

// config is what a configuration gives the server.
type config struct {
	routes  map[string]Route
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
	s.config.Store(&config{routes: routes, observe: observe})
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, "cascade: "+format, args...)
}

// ShouldRateLimit decides one call: see the package comment.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	cfg := s.config.Load()
	if cfg.observe == nil {
		return s.decide(ctx, cfg.routes, req)
	}
	start := time.Now()
	res, err := s.decide(ctx, cfg.routes, req)
	domain := req.GetDomain()
	if _, ok := cfg.routes[domain]; !ok {
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
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, invalid("a call needs at least one descriptor")
	}
	if len(descs) > MaxDescriptors {
		return nil, invalid("%d descriptors in one call, at most %d", len(descs), MaxDescriptors)
	}
	e, t := rt.Engine, rt.Tree
	dim := rt.Dimension
	if dim == "" {
		dim = hierarchy.Requests
	}

	var d, refund engine.Decision
	e.Begin(&d)
	defer d.Release()
	e.Begin(&refund)
	defer refund.Release()
	// Each descriptor's buckets, as positions in its decision's Buckets
	// before they are merged.
	type span struct {
		from, to int
		addend   int64
		negative bool
	}
	var spanBuf [8]span
	spans := spanBuf[:0]
	var refunds []int64
	for i, desc := range descs {
		addend, err := addendOf(req, desc)
		if err != nil {
			return nil, invalid("descriptor %d: %v", i, err)
		}
		if desc.GetLimit() != nil {
			return nil, invalid("descriptor %d carries a limit: Cascade's limits are its configuration's (a runtime override through the admin API changes one)", i)
		}
		into := &d
		if desc.GetIsNegativeHits() {
			into = &refund
		}
		values, err := pathOf(t, desc.GetEntries(), into.Values())
		if err != nil {
			return nil, invalid("descriptor %d: %v", i, err)
		}
		from := len(into.Buckets)
		if err := e.Add(into, t, values); err != nil {
			return nil, invalid("descriptor %d: %v", i, err)
		}
		to := len(into.Buckets)
		spans = append(spans, span{from: from, to: to, addend: addend, negative: desc.GetIsNegativeHits()})
		if desc.GetIsNegativeHits() {
			for _, b := range into.Buckets[from:to] {
				refunds = append(refunds, -costOf(b.Limit.Dimension, dim, addend, true))
			}
		}
	}
	if len(refund.Buckets) > 0 {
		if err := e.AdjustPath(ctx, &refund, refunds); err != nil {
			s.logStoreError("rls: giving back hits failed", req.GetDomain(), err)
			return nil, status.Errorf(codes.Unavailable, "cascade: the rate limit store could not give the hits back: %v", err)
		}
	}

	// Merge the buckets several descriptors share: each is charged once,
	// the largest addend any of them asks.
	n := len(d.Buckets)
	var idxBuf [32]int
	idx := idxBuf[:0]
	if n > len(idxBuf) {
		idx = make([]int, 0, n)
	}
	idx = idx[:n]
	var costBuf [32]int64
	costs := costBuf[:0]
	if n > len(costBuf) {
		costs = make([]int64, 0, n)
	}
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
	d.Costs = costs

	res := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs))}
	for i := range res.Statuses {
		res.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	if merged == 0 {
		return res, nil // refunds only, or paths with no limit (unlimited values)
	}
	d.Untracked = true // Envoy never says when a request ends
	if err := e.DecideCosts(ctx, &d); err != nil {
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
	e.WriteHeaders(hdr, &d)
	res.ResponseHeadersToAdd = headersOf(hdr)
	if !d.Allowed {
		e.NoteDenial(&d, "rls:"+req.GetDomain())
		if mode == engine.Enforce {
			res.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			p := engine.NewProblem(http.StatusTooManyRequests, d.Reason, "Too Many Requests", d.Detail(), &d)
			res.RawBody, _ = json.Marshal(p)
		}
	}
	return res, nil
}

// addendOf is a descriptor's hits_addend: its own when set, else the
// call's, where 0 means 1.
func addendOf(req *rlsv3.RateLimitRequest, desc *ratelimitv3.RateLimitDescriptor) (int64, error) {
	var a uint64 = 1
	if h := req.GetHitsAddend(); h != 0 {
		a = uint64(h)
	}
	if w := desc.GetHitsAddend(); w != nil {
		a = w.GetValue()
	}
	if a > maxAddend {
		return 0, fmt.Errorf("hits_addend %d is more than any limit can count (at most %d)", a, uint64(maxAddend))
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
		if !given && !tier.Dynamic() {
			v = tier.Key // a constant tier (a global ceiling) needs no entry
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
