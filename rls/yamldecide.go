package rls

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/store"
)

// Envoy decides the calls of Rules' domains on a store, with
// envoyproxy/ratelimit's semantics where its users rely on them (docs/envoy.md
// lists each, and each intended difference):
//
//   - A descriptor's entries select rules one level at a time: key and
//     value, else the first wildcard whose prefix the value has, else the
//     key alone; the rule of its last entry, if it has a rate_limit, is
//     its limit. A descriptor that matches none is not limited (OK).
//   - A rule's limit is a fixed window of its unit, aligned to the Unix
//     epoch; a limit named in another matched limit's replaces is dropped;
//     unlimited asks no store; requests_per_unit 0 is always over the limit;
//     shadow_mode and quota_mode answer OK when over, and count it.
//   - hits_addend: a descriptor's own, even 0 (a check that charges
//     nothing), else the call's, at least 1.
//
// What Cascade keeps: a refused charge is charged nowhere and, with Atomic,
// a call refused by any descriptor is charged for none.
type Envoy struct {
	// Rules are the rules at first; SetRules replaces them.
	Rules *Rules
	Store store.Store
	// Atomic decides a call's descriptors together, all or nothing, in one
	// store call. Off, each is decided alone, as envoyproxy/ratelimit does
	// (still, a refused descriptor is not charged).
	Atomic bool
	// DescriptorLimits honours the limit a descriptor carries (Envoy's
	// rate_limits limit override); off, such a call is invalid.
	DescriptorLimits bool
	// Headers, when set, adds to each answer the headers of the status
	// with the least left (the refusing one, on a refusal), as
	// envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED does.
	Headers *EnvoyHeaders
	// Shadow answers every call OK overall, its statuses, metrics and
	// counters as if it enforced (envoyproxy/ratelimit's
	// GLOBAL_SHADOW_MODE, except that a call it would refuse is charged
	// nothing): for running beside the service that enforces, and comparing.
	Shadow bool
	// MaxAddend is the largest hits_addend taken; 0 is DefaultMaxAddend.
	MaxAddend int64
	// Observe, when set, is told of the hits each descriptor with a limit
	// brought (see RuleObserver).
	Observe RuleObserver
	// Now is the clock of decisions made without the store (0 requests
	// per unit); nil is time.Now.
	Now func() time.Time

	details details
	swapped atomic.Pointer[Rules] // SetRules', nil until then
}

// SetRules replaces the rules while calls are decided (a file watcher's
// reload): each call is decided on the old rules or the new, never both.
func (e *Envoy) SetRules(r *Rules) { e.swapped.Store(r) }

// CurrentRules are the rules in force.
func (e *Envoy) CurrentRules() *Rules {
	if r := e.swapped.Load(); r != nil {
		return r
	}
	return e.Rules
}

// EnvoyHeaders names the headers of Envoy.Headers: the limit (its
// requests_per_unit), what is left of it, and the seconds until its
// window resets. Empty names are envoyproxy/ratelimit's defaults:
// RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset.
type EnvoyHeaders struct {
	Limit     string `json:"limit,omitempty"`
	Remaining string `json:"remaining,omitempty"`
	Reset     string `json:"reset,omitempty"`
}

// RuleObserver is told, for each descriptor decided under a limit, its
// domain, its rule (the rule's path in the configuration: bounded by it),
// the limit's name (or ""), its detail (with detailed_metric or
// value_to_metric, the path with the call's values, as
// envoyproxy/ratelimit names its stats; "" otherwise; MaxDetails per rule
// at most, and MaxDetailLen bytes each, else "other"), the outcome (within_limit, over_limit or
// shadow_mode) and the hits (the descriptor's addend).
type RuleObserver func(domain, rule, name, detail, outcome string, hits uint64)

// MaxDetails bounds the distinct details of one rule in metrics: a value
// a client chooses must not grow them without bound.
const MaxDetails = 100

// MaxDetailLen bounds the length of one detail: a longer one (a client's
// value of a megabyte) is counted as "other", not kept in a label.
const MaxDetailLen = 256

// details remembers the details seen of each rule, MaxDetails at most.
type details struct {
	mu   sync.Mutex
	seen map[string]map[string]bool
}

func (d *details) bound(rule, detail string) string {
	if detail == "" {
		return ""
	}
	if len(detail) > MaxDetailLen {
		return "other"
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[string]map[string]bool{}
	}
	s := d.seen[rule]
	if s == nil {
		s = map[string]bool{}
		d.seen[rule] = s
	}
	if s[detail] {
		return detail
	}
	if len(s) >= MaxDetails {
		return "other"
	}
	s[detail] = true
	return detail
}

// domain is the rules of domain d, nil when e is nil or has none.
func (e *Envoy) domain(d string) *ruleLevel {
	if e == nil {
		return nil
	}
	return e.CurrentRules().domains[d]
}

// match is what a descriptor matched: its limit (nil for none), the
// values its key counts under (a wildcard's pattern with
// share_threshold), and its metric detail.
type match struct {
	limit  *ruleLimit
	values []string
	detail string
}

// matchRules finds the limit of one descriptor of domain (whose rules are
// top), as envoyproxy/ratelimit's GetLimit does.
func matchRules(domain string, top *ruleLevel, entries []*ratelimitv3.RateLimitDescriptor_Entry) match {
	var m match
	level := top
	// The value each level puts in the metric name (envoyproxy/ratelimit's
	// value_to_metric name), and whether it is not the rule's own.
	var valueBuf [8]string
	values := valueBuf[:0]
	varies := false
	var shared map[int]string
	for i, en := range entries {
		final := en.GetKey() + "_" + en.GetValue()
		next := level.rules[final]
		wildcard := ""
		if next == nil {
			for _, w := range level.wildcards {
				if strings.HasPrefix(final, w[:len(w)-1]) {
					next, wildcard = level.rules[w], w
					break
				}
			}
		}
		byValue := next != nil
		if next == nil {
			next = level.rules[en.GetKey()]
		}
		if next == nil {
			break
		}
		pattern := ""
		if wildcard != "" {
			pattern = strings.TrimPrefix(wildcard, en.GetKey()+"_")
		}
		if wildcard != "" && next.shareThreshold {
			if shared == nil {
				shared = map[int]string{}
			}
			shared[i] = pattern
		}
		v := ""
		switch {
		case wildcard != "" && next.shareThreshold:
			v = pattern
		case wildcard != "" && next.valueToMetric:
			v, varies = en.GetValue(), true
		case wildcard != "":
			v = pattern
		case byValue:
			v = en.GetValue()
		case next.valueToMetric:
			v, varies = en.GetValue(), true
		}
		values = append(values, v)
		if i == len(entries)-1 {
			m.limit = next.limit
		}
		if len(next.rules) == 0 {
			break
		}
		level = &next.ruleLevel
	}
	if m.limit == nil {
		return m
	}
	if len(shared) > 0 {
		m.values = make([]string, len(entries))
		for i, en := range entries {
			m.values[i] = en.GetValue()
			if p, ok := shared[i]; ok {
				m.values[i] = p
			}
		}
	}
	if !m.limit.detailedMetric && !varies {
		return m // the rule's own name
	}
	var b strings.Builder
	b.WriteString(domain)
	for i, en := range entries {
		b.WriteString(".")
		b.WriteString(en.GetKey())
		v := values[i]
		if m.limit.detailedMetric {
			v = m.valueAt(i, en)
		}
		// A detailed name has key_value even for an empty value, but
		// under share_threshold, as envoyproxy/ratelimit writes them.
		if v != "" || m.limit.detailedMetric && len(shared) == 0 {
			b.WriteString("_")
			b.WriteString(v)
		}
	}
	m.detail = b.String()
	return m
}

func (m *match) valueAt(i int, en *ratelimitv3.RateLimitDescriptor_Entry) string {
	if m.values != nil {
		return m.values[i]
	}
	return en.GetValue()
}

// maxKey bounds the part of a key after its hash tag; a longer one is
// hashed.
const maxKey = 512

// keyOf is the store key of a descriptor's counter for a window: every
// value escaped (no client value can reach into another key or its hash
// slot), the domain and first entry as the hash tag.
func keyOf(domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, m *match, window time.Duration) string {
	var b strings.Builder
	b.WriteString("{rls|" + hierarchy.Escape(domain))
	for i, en := range entries {
		if i == 1 {
			b.WriteString("}")
		}
		b.WriteString("/" + hierarchy.Escape(en.GetKey()) + "=" + hierarchy.Escape(m.valueAt(i, en)))
	}
	if len(entries) <= 1 {
		b.WriteString("}")
	}
	k := b.String()
	if tag := strings.IndexByte(k, '}') + 1; len(k)-tag > maxKey {
		sum := sha256.Sum256([]byte(k[tag:]))
		k = k[:tag] + "/~" + base64.RawURLEncoding.EncodeToString(sum[:])
	}
	return k + "#fixed" + strconv.FormatInt(int64(window/time.Second), 10)
}

// envoyCall is one descriptor of a call as decided.
type envoyCall struct {
	m         match
	addend    int64
	unlimited bool
	bucket    int // its bucket in the call's buckets, -1 for none
	over      bool
}

// decide decides one call on domain top of e.Rules.
func (e *Envoy) decide(ctx context.Context, top *ruleLevel, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, invalid("a call needs at least one descriptor")
	}
	if len(descs) > MaxDescriptors {
		return nil, invalid("%d descriptors in one call, at most %d", len(descs), MaxDescriptors)
	}
	maxAddend := e.MaxAddend
	if maxAddend <= 0 {
		maxAddend = DefaultMaxAddend
	}
	domain := req.GetDomain()
	calls := make([]envoyCall, len(descs))
	replaced := map[string]bool{}
	for i, desc := range descs {
		c := &calls[i]
		c.bucket = -1
		if desc.GetIsNegativeHits() {
			return nil, invalid("descriptor %d has is_negative_hits: a domain of the rls config takes no refunds", i)
		}
		a := uint64(max(req.GetHitsAddend(), 1))
		if w := desc.GetHitsAddend(); w != nil {
			a = w.GetValue() // 0 checks without charging, as envoyproxy/ratelimit's
		}
		if a > uint64(maxAddend) {
			return nil, invalid("descriptor %d: hits_addend %d is more than this domain takes (at most %d)", i, a, maxAddend)
		}
		c.addend = int64(a)
		if l := desc.GetLimit(); l != nil {
			if !e.DescriptorLimits {
				return nil, invalid("descriptor %d carries a limit: the rls config does not take descriptors' limits (allow them with descriptor_limits in its config block)", i)
			}
			unit := rlsv3.RateLimitResponse_RateLimit_Unit(l.GetUnit()) // the same numbers
			w, ok := unitWindows[unit]
			if !ok {
				return nil, invalid("descriptor %d: its limit's unit %v is not one of second, minute, hour, day, week, month or year", i, l.GetUnit())
			}
			lim := &ruleLimit{path: "descriptor_limit", requests: l.GetRequestsPerUnit(), unit: unit, window: w}
			if lim.requests > 0 {
				lim.rate = fixedLimit(lim.requests, w)
			}
			c.m = match{limit: lim}
			continue
		}
		c.m = matchRules(domain, top, desc.GetEntries())
		if lim := c.m.limit; lim != nil {
			for _, name := range lim.replaces {
				replaced[name] = true
			}
			if lim.unlimited {
				c.unlimited, c.m.limit = true, nil
			}
		}
	}
	var buckets []store.Bucket
	for i := range calls {
		c := &calls[i]
		lim := c.m.limit
		if lim == nil {
			continue
		}
		if lim.name != "" && replaced[lim.name] {
			c.m.limit = nil
			continue
		}
		if lim.requests == 0 {
			c.over = c.addend > 0 // always over, unless only checking
			continue
		}
		key := keyOf(domain, descs[i].GetEntries(), &c.m, lim.window)
		if j := indexOfKey(buckets, key); j >= 0 {
			// The same counter twice in a call counts both addends, as
			// envoyproxy/ratelimit's two INCRBYs do.
			c.bucket = j
			buckets[j].Cost += c.addend
			continue
		}
		c.bucket = len(buckets)
		buckets = append(buckets, store.Bucket{Key: key, Limit: lim.rate, Cost: c.addend})
	}
	results, at, err := e.decideBuckets(ctx, calls, buckets)
	if err != nil {
		return nil, err
	}
	now := at / 1e6
	res := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs))}
	for i := range calls {
		c := &calls[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		res.Statuses[i] = st
		lim := c.m.limit
		switch {
		case c.unlimited:
			st.LimitRemaining = math.MaxUint32
			continue
		case lim == nil:
			continue
		}
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: lim.name, RequestsPerUnit: lim.requests, Unit: lim.unit}
		w := int64(lim.window / time.Second)
		st.DurationUntilReset = durationpb.New(time.Duration(w-now%w) * time.Second)
		over := c.over
		if c.bucket >= 0 {
			r := results[c.bucket]
			over = !r.Allowed
			if !over {
				st.LimitRemaining = uint32(min(r.Remaining, math.MaxUint32))
			}
		}
		outcome := "within_limit"
		if over {
			outcome = "over_limit"
			switch {
			case lim.quota:
				outcome = "shadow_mode"
				st.DurationUntilReset = nil // as envoyproxy/ratelimit's quota_mode answers
			case lim.shadow:
				outcome = "shadow_mode"
			default:
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				res.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			}
		}
		if e.Observe != nil {
			e.Observe(domain, lim.path, lim.name, e.details.bound(lim.path, c.m.detail), outcome, uint64(c.addend))
		}
	}
	if e.Headers != nil {
		res.ResponseHeadersToAdd = e.Headers.of(res.Statuses, now)
	}
	if e.Shadow {
		res.OverallCode = rlsv3.RateLimitResponse_OK
	}
	return res, nil
}

// of are the headers of an answer whose statuses are these, at now (s):
// those of the status with the least left, the first of them, unless one
// refuses (OVER_LIMIT; not shadow_mode's nor quota_mode's): then the last
// that refuses, as envoyproxy/ratelimit picks it. None when no status has
// a limit.
func (h *EnvoyHeaders) of(statuses []*rlsv3.RateLimitResponse_DescriptorStatus, now int64) []*corev3.HeaderValue {
	var pick *rlsv3.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for _, st := range statuses {
		if st.CurrentLimit != nil && st.LimitRemaining < least {
			pick, least = st, st.LimitRemaining
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			pick, least = st, 0
		}
	}
	if pick == nil {
		return nil
	}
	name := func(n, def string) string {
		if n == "" {
			return def
		}
		return n
	}
	w := int64(unitWindows[pick.CurrentLimit.Unit] / time.Second)
	return []*corev3.HeaderValue{
		{Key: name(h.Limit, "RateLimit-Limit"), Value: strconv.FormatUint(uint64(pick.CurrentLimit.RequestsPerUnit), 10)},
		{Key: name(h.Remaining, "RateLimit-Remaining"), Value: strconv.FormatUint(uint64(pick.LimitRemaining), 10)},
		{Key: name(h.Reset, "RateLimit-Reset"), Value: strconv.FormatInt(w-now%w, 10)},
	}
}

// decideBuckets charges the call's buckets, and says what each one
// answered and when (µs). With Atomic, in one store call, all or nothing:
// a bucket over a limit that refuses (not shadow), or a descriptor always
// over its limit, leaves every bucket uncharged (only looked at); a
// shadow bucket that refuses is decided again without it. Without, each
// bucket alone.
func (e *Envoy) decideBuckets(ctx context.Context, calls []envoyCall, buckets []store.Bucket) ([]rateResult, int64, error) {
	results := make([]rateResult, len(buckets))
	if len(buckets) == 0 {
		return results, e.now(), nil
	}
	if !e.Atomic {
		var at int64
		for j := range buckets {
			d, err := e.Store.Decide(ctx, buckets[j:j+1])
			if err != nil {
				return nil, 0, err
			}
			results[j] = rateResult{Allowed: d.Results[0].Allowed, Remaining: d.Results[0].Remaining}
			at = d.At
		}
		return results, at, nil
	}
	// Which buckets only a shadow rule limits: their refusal refuses no call.
	shadow := make([]bool, len(buckets))
	for j := range shadow {
		shadow[j] = true
	}
	refused := false // a descriptor that refuses without a bucket
	for _, c := range calls {
		switch {
		case c.bucket >= 0 && !(c.m.limit.shadow || c.m.limit.quota):
			shadow[c.bucket] = false
		case c.bucket < 0 && c.over && !(c.m.limit.shadow || c.m.limit.quota):
			refused = true
		}
	}
	left := make([]int, len(buckets)) // positions in buckets of those still decided
	for j := range left {
		left[j] = j
	}
	for {
		ask := make([]store.Bucket, len(left))
		for k, j := range left {
			ask[k] = buckets[j]
			if refused {
				ask[k].Cost = 0 // look, charge nothing
			}
		}
		d, err := e.Store.Decide(ctx, ask)
		if err != nil {
			return nil, 0, err
		}
		var keep []int
		shadowOnly := !d.Allowed && !refused
		for k, j := range left {
			r := d.Results[k]
			results[j] = rateResult{Allowed: r.Allowed, Remaining: r.Remaining}
			if refused {
				results[j].Allowed = r.Remaining >= buckets[j].Cost
			}
			if !r.Allowed && !shadow[j] {
				shadowOnly = false
			}
			if r.Allowed || !shadow[j] {
				keep = append(keep, j)
			}
		}
		if refused {
			// Looked at only: report what is left, nothing charged; a
			// bucket that fit is not over.
			return results, d.At, nil
		}
		if d.Allowed || !shadowOnly || len(keep) == 0 || len(keep) == len(left) {
			// (a store refusing with no bucket refused: asking again
			// without none would answer the same, for ever)
			return results, d.At, nil
		}
		left = keep // again, without the shadow buckets that refused
	}
}

// rateResult is what the answer needs of a bucket's rate.Result.
type rateResult struct {
	Allowed   bool
	Remaining int64
}

func (e *Envoy) now() int64 {
	if e.Now != nil {
		return e.Now().UnixMicro()
	}
	return time.Now().UnixMicro()
}

func indexOfKey(buckets []store.Bucket, key string) int {
	for j := range buckets {
		if buckets[j].Key == key {
			return j
		}
	}
	return -1
}
