// Package hierarchy describes trees of limits and turns one request's key
// values into a Plan: the ordered buckets, with their limits and storage
// keys, that the request must fit into.
//
// A Tree is a chain of tiers from the root down (organisation > team > user
// > agent). Each tier names a key template (resolved by the caller, from
// placeholders such as a header or the authenticated user), default limits
// that apply to every value of the key (the "*" of seed 004), and per-value
// overrides (an enterprise organisation, the "trade" action) that replace
// them. A tier without default limits constrains only its named values.
// A tree may also have plans (free, pro, enterprise): a request's plan
// selects each tier's block for it, below its value's overrides.
//
// A bucket's identity is the path of values from the root to its tier, so
// "alice" under team "eng" and "alice" under team "ops" are different
// buckets, and "trade" and "withdrawal" of user alex each have their own
// bucket while both count against alex's. Values that come from clients are
// escaped or hashed (see Escape) before they become keys; every key carries
// one hash tag per tenant subtree, so that a Redis Cluster decides a
// tenant's path in one script.
//
// The package knows nothing of HTTP or Redis.
package hierarchy

import (
	"errors"
	"fmt"
	"iter"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddy-cascade/cascade/rate"
)

// Requests is the dimension every request costs exactly 1 in.
const Requests = "requests"

// Missing says what a tier does with a request whose key resolves to empty.
type Missing string

// The missing-key policies.
const (
	// MissingDeny refuses the request (the default): omitting a header must
	// never be a way around a limit.
	MissingDeny Missing = "deny"
	// MissingShared puts every request without the key into one shared
	// bucket (the behaviour of mholt/caddy-ratelimit zones).
	MissingShared Missing = "shared"
	// MissingSkip leaves the tier out of the path: an explicit opt-out, for
	// tiers that only some requests have.
	MissingSkip Missing = "skip"
)

// Tree is a named chain of tiers, root first.
type Tree struct {
	// Name identifies the tree in keys, headers and logs. Trees with the
	// same name on the same store share their buckets.
	Name string `json:"name"`
	// Tiers from the root (e.g. org) down to the leaf (e.g. agent).
	Tiers []*Tier `json:"tiers"`
	// PlanKey is the template, resolved by the caller, whose value is a
	// request's plan (free, pro…): it selects each tier's Plans block.
	// Empty: the tree has no plans.
	PlanKey string `json:"plan,omitempty"`
	// DefaultPlan is the plan of a request whose plan is empty or declared
	// by no tier; required with PlanKey (see PlanOf).
	DefaultPlan string `json:"default_plan,omitempty"`
	// StrictAllocation makes AllocationProblems errors of Compile.
	StrictAllocation bool `json:"strict_allocation,omitempty"`

	// qualified holds the limit names that QualifyPolicies found in other
	// trees too: their policies are written tree/name, runtime overrides'
	// included.
	qualified map[string]bool
	// plans numbers the plan names some tier declares, from 1 (KnownPlan,
	// PlanIndex); defaultPlan is DefaultPlan's number, 0 when no tier
	// declares it.
	plans       map[string]int
	defaultPlan int
}

// Tier returns the tier of that name and its index, or nil and -1.
func (t *Tree) Tier(name string) (*Tier, int) {
	for i, tier := range t.Tiers {
		if tier.Name == name {
			return tier, i
		}
	}
	return nil, -1
}

// CompileOverride validates and compiles an override of one of the tree's
// tiers, made while the tree is in use, so that tier.SetRuntime can install
// it: its limits are named, and their policies qualified, as a value block
// of the configuration would be. The override's limits are changed (their
// compiled form set): give it limits of its own.
func (t *Tree) CompileOverride(tier *Tier, o *Override) error {
	if o.Unlimited && len(o.Limits) > 0 {
		return fmt.Errorf("unlimited and limits are exclusive")
	}
	if !o.Unlimited && len(o.Limits) == 0 {
		return fmt.Errorf("no limits (say unlimited to exempt the value)")
	}
	if err := compileLimits(tier.Name, o.Limits); err != nil {
		return err
	}
	for _, l := range o.Limits {
		if t.qualified[l.name] {
			l.policy = t.Name + "/" + l.name
		}
	}
	return nil
}

// Tier is one level of a tree.
type Tier struct {
	// Name of the tier: "org", "team", "user"…
	Name string `json:"name"`
	// Key is the template, usually a placeholder, whose value selects the
	// bucket: "{http.request.header.X-Org}". A key without placeholders is
	// a constant: one bucket for all requests (a global ceiling).
	Key string `json:"key"`
	// Missing is the policy for requests whose key resolves to empty:
	// "deny" (default), "shared" or "skip".
	Missing Missing `json:"missing,omitempty"`
	// Limits apply to every value of the key that has no override.
	Limits []*Limit `json:"limits,omitempty"`
	// Values overrides the limits for named values of the key.
	Values map[string]*Override `json:"values,omitempty"`
	// Plans overrides the limits for the requests of a plan (free, pro…),
	// below Values and a customer's own limits (see Tree.Resolve); a
	// request of a plan the tier does not list gets Limits. The tree's
	// PlanKey must be set.
	Plans map[string]*Override `json:"plans,omitempty"`
	// Adaptive lets the adaptive controller scale this tier's limits.
	Adaptive bool `json:"adaptive,omitempty"`
	// Penalty, when set, refuses a value outright for a while once the
	// tier's limits have refused it often (see Penalty).
	Penalty *Penalty `json:"penalty,omitempty"`
	// Sensitive says whether the tier's values are secrets (API keys,
	// tokens), shown only as fingerprints in logs and the admin API: nil
	// detects it from the key (see CredentialKey), true forces it, false
	// lifts it (the operator's explicit choice).
	Sensitive *bool `json:"sensitive,omitempty"`

	dynamic   bool // the key has a placeholder
	sensitive bool // compiled from Sensitive and Key
	// runtime holds the overrides set while the tree is in use (an
	// operator's, through the admin API), compiled by CompileOverride:
	// they win over Values. A map replaced whole, never changed, so
	// Resolve reads it without a lock.
	runtime atomic.Pointer[map[string]*Override]
	// byPlan is Plans by the tree's plan numbers (PlanIndex): index 0,
	// and a plan the tier has no block for, nil.
	byPlan []*Override
}

// SetRuntime installs the runtime overrides of the tier, by value, each
// compiled by Tree.CompileOverride; they win over the tier's Values. An
// empty or nil map removes them. The map must not change afterwards. Safe
// to call while requests are resolved: each request sees the old or the
// new overrides, never a mix within the tier.
func (tier *Tier) SetRuntime(overrides map[string]*Override) {
	if len(overrides) == 0 {
		tier.runtime.Store(nil)
		return
	}
	tier.runtime.Store(&overrides)
}

// OverrideOf returns the override that applies to value v of the tier, if
// any: the runtime one, else the configured one (Values). runtime tells
// which.
func (tier *Tier) OverrideOf(v string) (o *Override, runtime bool) {
	if rt := tier.runtime.Load(); rt != nil {
		if o, ok := (*rt)[v]; ok {
			return o, true
		}
	}
	return tier.Values[v], false
}

// Dynamic reports whether the tier's key has a placeholder: else it is a
// constant, one bucket for every request. Valid after Tree.Compile.
func (tier *Tier) Dynamic() bool { return tier.dynamic }

// Override replaces a tier's limits for one value of its key.
type Override struct {
	// Limits for this value; they replace the tier's defaults.
	Limits []*Limit `json:"limits,omitempty"`
	// Unlimited exempts this value from the tier (its other tiers still apply).
	Unlimited bool `json:"unlimited,omitempty"`
}

// Limit is one limit of a tier, as configured.
type Limit struct {
	// Count units are allowed per Per.
	Count int64 `json:"count"`
	// Amount, on a money dimension (one a priced cost counts), is the
	// count as a decimal of the currency ("20", "0.50"): the handler sets
	// Count from it, in micro-units (1 usd = 1,000,000).
	Amount string `json:"amount,omitempty"`
	// Per is the period: "s", "min", "h", "day", "week", "month" or a
	// duration such as "30m". "month" always means a calendar month.
	Per string `json:"per,omitempty"`
	// Dimension is what is counted: "requests" (default), or a cost such
	// as "tokens", "points", "bytes".
	Dimension string `json:"dimension,omitempty"`
	// Burst is the GCRA capacity; default Count.
	Burst int64 `json:"burst,omitempty"`
	// Algorithm is "gcra" (default), "sliding" (exact: at most Count in
	// any window of Per), "sliding_approx" (the two-counter estimate, in
	// constant memory), "calendar", "fixed" (a window of Per aligned to
	// the Unix epoch: 30/10m fixed resets at :00, :10, :20…), or
	// "concurrent": at most Count requests in flight at once (no Per; the dimension is requests, and
	// each request takes one slot whatever its cost).
	Algorithm string `json:"algorithm,omitempty"`
	// Timezone aligns calendar windows; default UTC.
	Timezone string `json:"timezone,omitempty"`
	// Alerts are thresholds, in percent of the limit's capacity (1–100,
	// ascending): when a value's usage first crosses one in a period, the
	// handler says so (a log line, a webhook), once for all instances.
	Alerts []int `json:"alerts,omitempty"`

	compiled rate.Limit
	id       string   // the limit's part of a storage key
	name     string   // the limit's name within its tree
	policy   string   // the limit's name in RateLimit-Policy: name, or tree/name
	penalty  *Penalty // set on a penalty box (not a configured limit)
}

// Counts is what a limit counts, for telling whether two limits limit
// the same thing: its dimension (requests when none is named), or
// "concurrent" for a concurrency limit (requests in flight).
func (l *Limit) Counts() string {
	if l.Algorithm == string(rate.Concurrent) {
		return "concurrent"
	}
	if l.Dimension == "" {
		return Requests
	}
	return l.Dimension
}

// Rate returns the compiled limit. Valid after Tree.Compile.
func (l *Limit) Rate() rate.Limit { return l.compiled }

// Policy is the limit's name in the RateLimit-Policy header: its Name,
// qualified by its tree's when another tree of the handler has a limit of
// that name (see QualifyPolicies). Valid after Tree.Compile.
func (l *Limit) Policy() string { return l.policy }

// Name is the limit's name within its tree: the tier's name when the tier
// has one limit, else the tier and dimension, else tier, dimension and
// period. Valid after Tree.Compile.
func (l *Limit) Name() string { return l.name }

// QualifyPolicies makes every RateLimit-Policy name of trees unique: a
// limit name that more than one tree uses (two trees with a tier "user")
// is written tree/name in each of them, so that the RateLimit field names
// one policy. Call it after compiling the trees that answer together.
func QualifyPolicies(trees []*Tree) {
	owners := map[string]map[*Tree]bool{}
	each := func(fn func(t *Tree, l *Limit)) {
		for _, t := range trees {
			for _, l := range t.Limits() {
				fn(t, l)
			}
		}
	}
	each(func(t *Tree, l *Limit) {
		if owners[l.name] == nil {
			owners[l.name] = map[*Tree]bool{}
		}
		owners[l.name][t] = true
	})
	each(func(t *Tree, l *Limit) {
		l.policy = l.name
		if len(owners[l.name]) > 1 {
			l.policy = t.Name + "/" + l.name
			if t.qualified == nil {
				t.qualified = map[string]bool{}
			}
			t.qualified[l.name] = true
		}
	})
}

// String renders the limit as configured, e.g. "100000 tokens/h burst 5000".
func (l *Limit) String() string {
	if l.Algorithm == string(rate.Concurrent) {
		return strconv.FormatInt(l.Count, 10) + " concurrent"
	}
	var b strings.Builder
	if l.Amount != "" {
		b.WriteString(l.Amount)
	} else {
		b.WriteString(strconv.FormatInt(l.Count, 10))
	}
	if l.Dimension != "" && l.Dimension != Requests {
		b.WriteString(" " + l.Dimension)
	}
	b.WriteString("/" + l.Per)
	if l.Burst > 0 {
		b.WriteString(" burst " + strconv.FormatInt(l.Burst, 10))
	}
	switch l.Algorithm {
	case "", string(rate.GCRA):
	case string(rate.SlidingApprox):
		b.WriteString(" sliding approx")
	default:
		b.WriteString(" " + l.Algorithm)
	}
	return b.String()
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Compile validates the tree and prepares it for Resolve. Errors name the
// tier and limit at fault.
func (t *Tree) Compile() error {
	if !nameRE.MatchString(t.Name) {
		return fmt.Errorf("tree name %q: use 1-64 letters, digits, '-' or '_'", t.Name)
	}
	if len(t.Tiers) == 0 {
		return fmt.Errorf("tree %s: no tiers", t.Name)
	}
	seen := map[string]bool{}
	for _, tier := range t.Tiers {
		if !nameRE.MatchString(tier.Name) {
			return fmt.Errorf("tree %s: tier name %q: use 1-64 letters, digits, '-' or '_'", t.Name, tier.Name)
		}
		if seen[tier.Name] {
			return fmt.Errorf("tree %s: tier %s appears twice", t.Name, tier.Name)
		}
		seen[tier.Name] = true
		if err := tier.compile(); err != nil {
			return fmt.Errorf("tree %s: tier %s: %w", t.Name, tier.Name, err)
		}
	}
	return t.compilePlans()
}

// BarePlaceholders returns the placeholders of a key template that have no
// namespace, such as {X-User}. Caddy's own placeholders all have one
// ({http.request.header.X-User}, {env.TENANT}; the Caddyfile's shorthands,
// {header.X-User} or {client_ip}, are expanded before a config loads), so
// such a name resolves only if a handler defines it (map's outputs, as
// {tenant}); else it is empty, and every request has no key.
func BarePlaceholders(key string) []string {
	var names []string
	rest := key
	for {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			return names
		}
		if open > 0 && rest[open-1] == '\\' { // an escaped brace
			rest = rest[open+1:]
			continue
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return names
		}
		if name := rest[open+1 : open+end]; name != "" && !strings.Contains(name, ".") {
			names = append(names, name)
		}
		rest = rest[open+end+1:]
	}
}

func (tier *Tier) compile() error {
	if strings.TrimSpace(tier.Key) == "" {
		return fmt.Errorf("no key: say which placeholder identifies the %s, e.g. key {http.request.header.X-%s}", tier.Name, tier.Name)
	}
	tier.dynamic = isDynamic(tier.Key)
	tier.sensitive = CredentialKey(tier.Key)
	if tier.Sensitive != nil {
		tier.sensitive = *tier.Sensitive
	}
	switch tier.Missing {
	case "":
		tier.Missing = MissingDeny
	case MissingDeny, MissingShared, MissingSkip:
	default:
		return fmt.Errorf("missing policy %q: use deny, shared or skip", tier.Missing)
	}
	if len(tier.Limits) == 0 && len(tier.Values) == 0 && len(tier.Plans) == 0 {
		return fmt.Errorf("no limits: add a limit (e.g. limit 1000/h), a value override or a plan block")
	}
	if err := compileLimits(tier.Name, tier.Limits); err != nil {
		return err
	}
	if tier.Penalty != nil {
		if err := tier.Penalty.compile(tier.Name); err != nil {
			return err
		}
	}
	for v, o := range tier.Values {
		if err := o.compile(tier.Name); err != nil {
			return fmt.Errorf("value %q: %w", v, err)
		}
	}
	return nil
}

// compileLimits compiles one set of limits (a tier's defaults or one
// override) and names each limit's policy: the tier's name when it has one
// limit, else the tier and dimension, else tier, dimension and period.
func compileLimits(tier string, limits []*Limit) error {
	perDim := map[string]int{}
	ids := map[string]bool{}
	for _, l := range limits {
		if Reserved(l.Dimension) {
			return fmt.Errorf("limit %s: the dimension %q is the penalty box's: name yours otherwise", l.String(), l.Dimension)
		}
		if err := l.compile(); err != nil {
			return fmt.Errorf("limit %s: %w", l.String(), err)
		}
		if ids[l.id] {
			return fmt.Errorf("limit %s: two limits of the same dimension, period and algorithm", l.String())
		}
		ids[l.id] = true
		perDim[l.Dimension]++
	}
	for _, l := range limits {
		switch {
		case len(limits) == 1:
			l.name = tier
		case l.Algorithm == string(rate.Concurrent):
			l.name = tier + ".concurrent"
		case perDim[l.Dimension] == 1:
			l.name = tier + "." + l.Dimension
		default:
			l.name = tier + "." + l.Dimension + "." + l.Per
		}
		l.policy = l.name
	}
	return nil
}

func (l *Limit) compile() error {
	if l.Dimension == "" {
		l.Dimension = Requests
	}
	if !nameRE.MatchString(l.Dimension) {
		return fmt.Errorf("dimension %q: use letters, digits, '-' or '_'", l.Dimension)
	}
	for i, a := range l.Alerts {
		switch {
		case a < 1 || a > 100:
			return fmt.Errorf("alert %d%%: a threshold is a share of the limit, from 1%% to 100%%", a)
		case i > 0 && a <= l.Alerts[i-1]:
			return fmt.Errorf("alert %d%% after %d%%: give each threshold once, in ascending order", a, l.Alerts[i-1])
		case l.Algorithm == string(rate.Concurrent):
			return errors.New("a concurrency limit takes no alert: it is never used up over a period")
		}
	}
	if l.Algorithm == string(rate.Concurrent) {
		return l.compileConcurrent()
	}
	if l.Algorithm == string(rate.Idempotent) {
		// The engine's idempotency records use it; as a limit it would
		// admit nothing it should.
		return errors.New(`algorithm "idempotent" is not a limit: use the handler's idempotency option`)
	}
	period, unit, err := rate.ParsePer(l.Per)
	if err != nil {
		return err
	}
	r := rate.Limit{Algorithm: rate.Algorithm(l.Algorithm), Count: l.Count, Burst: l.Burst, Period: period}
	if l.Algorithm == Fixed {
		return l.compileFixed(r, unit)
	}
	switch {
	case r.Algorithm == "" && unit != "":
		r.Algorithm = rate.Calendar
	case r.Algorithm == "":
		r.Algorithm = rate.GCRA
	}
	if r.Algorithm == rate.Calendar {
		if unit == "" {
			var ok bool
			if unit, ok = rate.CalendarUnit(period); !ok {
				return fmt.Errorf("a calendar limit counts per hour, day, week or month, not per %s", l.Per)
			}
		}
		r.Unit, r.Period = unit, 0
		r.Location = time.UTC
		if l.Timezone != "" {
			loc, err := time.LoadLocation(l.Timezone)
			if err != nil {
				return fmt.Errorf("timezone %q: %v", l.Timezone, err)
			}
			r.Location = loc
		}
	} else {
		if unit != "" {
			return fmt.Errorf("a month has no fixed length: per month limits are calendar quotas (drop the %s algorithm)", r.Algorithm)
		}
		if l.Timezone != "" {
			return fmt.Errorf("timezone applies only to calendar limits")
		}
	}
	if err := r.Validate(); err != nil {
		return err
	}
	l.compiled = r
	per := l.Per
	if r.Algorithm == rate.Calendar {
		per = string(r.Unit)
		if l.Timezone != "" {
			per += "@" + Escape(l.Timezone)
		}
	} else {
		per = strconv.FormatInt(period.Microseconds(), 10)
	}
	l.id = l.Dimension + "." + r.Algorithm.StateName() + "." + per
	return nil
}

// Fixed is the algorithm name of a fixed window of any period, aligned to
// the Unix epoch: a calendar limit of rate unit Fixed.
const Fixed = "fixed"

// compileFixed compiles a fixed window: r's period, from the epoch.
func (l *Limit) compileFixed(r rate.Limit, unit rate.Unit) error {
	switch {
	case unit != "":
		return fmt.Errorf("a month has no fixed length: write limit %d/month calendar, or a fixed duration such as 30d", l.Count)
	case l.Timezone != "":
		return errors.New("a fixed window is aligned to the Unix epoch, not a time zone: drop tz, or use the calendar algorithm")
	case r.Period%time.Microsecond != 0:
		return fmt.Errorf("a fixed window is a whole number of microseconds, got %v", r.Period)
	}
	r.Algorithm, r.Unit = rate.Calendar, rate.Fixed
	if err := r.Validate(); err != nil {
		return err
	}
	l.compiled = r
	l.id = l.Dimension + "." + r.Algorithm.StateName() + ".fixed" + strconv.FormatInt(r.Period.Microseconds(), 10)
	return nil
}

// compileConcurrent compiles a concurrency limit: requests in flight.
func (l *Limit) compileConcurrent() error {
	switch {
	case l.Dimension != Requests:
		return fmt.Errorf("a concurrency limit counts requests in flight, not %s: drop the dimension", l.Dimension)
	case l.Per != "":
		return fmt.Errorf("a concurrency limit has no period: write limit %d concurrent", l.Count)
	case l.Burst != 0 || l.Timezone != "":
		return fmt.Errorf("burst and timezone do not apply to a concurrency limit")
	}
	r := rate.Limit{Algorithm: rate.Concurrent, Count: l.Count}
	if err := r.Validate(); err != nil {
		return err
	}
	l.compiled = r
	l.id = l.Dimension + "." + r.Algorithm.StateName()
	return nil
}

// Limits yields every limit of the tree with its tier: each tier's own
// limits, then those of its value overrides, then those of its plans.
func (t *Tree) Limits() iter.Seq2[*Tier, *Limit] {
	return func(yield func(*Tier, *Limit) bool) {
		for _, tier := range t.Tiers {
			for _, l := range tier.Limits {
				if !yield(tier, l) {
					return
				}
			}
			for _, o := range tier.Values {
				for _, l := range o.Limits {
					if !yield(tier, l) {
						return
					}
				}
			}
			for _, o := range tier.Plans {
				for _, l := range o.Limits {
					if !yield(tier, l) {
						return
					}
				}
			}
		}
	}
}

// Concurrent reports whether some limit of the tree is a concurrency limit
// (rate.Concurrent): its slots must be given back when a request ends.
func (t *Tree) Concurrent() bool {
	for _, l := range t.Limits() {
		if l.Algorithm == string(rate.Concurrent) {
			return true
		}
	}
	return false
}

// Dimensions lists every dimension the tree's limits count, once each.
func (t *Tree) Dimensions() []string {
	var out []string
	for _, l := range t.Limits() {
		if !slices.Contains(out, l.Dimension) {
			out = append(out, l.Dimension)
		}
	}
	return out
}

// Validate checks one limit on its own, without changing it, so a config
// parser can report a bad limit at the line that wrote it.
func (l *Limit) Validate() error {
	c := *l
	return c.compile()
}
