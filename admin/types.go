package admin

import (
	"time"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/topk"
)

// The JSON of the admin API. The CLI (cli.go) decodes the same types.

// Tree is one tree of the running configuration, as GET /rate_limit/trees
// lists it.
type Tree struct {
	Name string `json:"name"`
	// Store names where the tree's buckets live: "memory/default",
	// "redis/127.0.0.1:6379".
	Store string `json:"store"`
	// Mode is the mode in force: the runtime mode when one is set
	// (ModeOverride), else the configured one.
	Mode           string        `json:"mode"`
	ConfiguredMode string        `json:"configured_mode"`
	ModeOverride   *control.Mode `json:"mode_override,omitempty"`
	// Plan is where a request's plan comes from, and DefaultPlan the plan
	// of a request that names none or an unknown one (plans.md).
	Plan        string `json:"plan,omitempty"`
	DefaultPlan string `json:"default_plan,omitempty"`
	// AllocationProblems are the tiers allowed more than their parent in
	// some plan: limits they can never use.
	AllocationProblems []string `json:"allocation_problems,omitempty"`
	Tiers              []Tier   `json:"tiers"`
}

// Tier is one tier of a Tree.
type Tier struct {
	Name     string `json:"name"`
	Key      string `json:"key"`
	Missing  string `json:"missing"`
	Adaptive bool   `json:"adaptive,omitempty"`
	// Sensitive says that the tier's values are secrets: the API shows
	// them as fingerprints ("fp:" and 12 hex digits).
	Sensitive bool    `json:"sensitive,omitempty"`
	Limits    []Limit `json:"limits,omitempty"`
	// Plans are the tier's limits per plan (a plan's Unlimited: none).
	Plans map[string]Value `json:"plans,omitempty"`
	// Values are the per-value limits in force: the configuration's value
	// blocks and the runtime overrides, which win over them (Source says
	// which applies).
	Values []Value `json:"values,omitempty"`
}

// Limit is one limit as configured, with its RateLimit-Policy name and its
// text as a Caddyfile would write it ("100000 tokens/h burst 5000").
type Limit struct {
	hierarchy.Limit
	Text   string `json:"text"`
	Policy string `json:"policy,omitempty"`
}

// Value is the limits of one value of a tier.
type Value struct {
	Value     string  `json:"value"`
	Source    string  `json:"source"` // "config", "override", or "plan" (a tier's Plans)
	Limits    []Limit `json:"limits,omitempty"`
	Unlimited bool    `json:"unlimited,omitempty"`
	// Configured is the configuration's value block that an override
	// replaces, if any.
	Configured *Value     `json:"configured,omitempty"`
	Expires    *time.Time `json:"expires,omitempty"`
	Note       string     `json:"note,omitempty"`
	Updated    *time.Time `json:"updated,omitempty"`
}

// Buckets is the answer of GET /rate_limit/buckets: every bucket on one
// path, read without charging anything.
type Buckets struct {
	Tree string `json:"tree"`
	// Path is the tiers' values the path was resolved from, root first.
	Path []PathValue `json:"path"`
	// Store names the store that holds the path: the handler's, or the
	// one its tenant is routed to.
	Store string `json:"store"`
	// Cost is the request the RetryAfter values are for, per dimension.
	Cost map[string]int64 `json:"cost"`
	// Allowed tells whether a request of that cost would be admitted now;
	// else RetryAfter (seconds) is when it could be, unless Impossible.
	Allowed    bool     `json:"allowed"`
	Impossible bool     `json:"impossible,omitempty"`
	RetryAfter float64  `json:"retry_after"`
	Buckets    []Bucket `json:"buckets"`
}

// PathValue is one tier's value on a path.
type PathValue struct {
	Tier  string `json:"tier"`
	Value string `json:"value"`
}

// Bucket is the state of one bucket (one limit of one tier's value).
type Bucket struct {
	Tier  string `json:"tier"`
	Value string `json:"value"`
	// Limit is the limit as configured ("1000/h"), Source where it comes
	// from: "tier" (the tier's limits), "config" (a value block) or
	// "override" (a runtime override).
	Limit     string `json:"limit"`
	Source    string `json:"source"`
	Policy    string `json:"policy"`
	Dimension string `json:"dimension"`
	// Capacity is the most the bucket holds (after any adaptive scaling,
	// which Scaled reports).
	Capacity  int64 `json:"capacity"`
	Remaining int64 `json:"remaining"`
	// FullIn is how many seconds until the bucket is full again.
	FullIn float64 `json:"full_in"`
	// RetryAfter is how many seconds a request of the given cost would wait
	// for this bucket (0: it admits it now); Impossible when it never can.
	RetryAfter float64 `json:"retry_after"`
	Impossible bool    `json:"impossible,omitempty"`
	Scaled     bool    `json:"scaled,omitempty"`
	// Key is the bucket's storage key.
	Key string `json:"key"`
}

// Reset is the answer of POST /rate_limit/reset.
type Reset struct {
	Tree  string      `json:"tree"`
	Path  []PathValue `json:"path"`
	Below bool        `json:"below"`
	// Buckets is how many stored buckets were deleted (a full bucket has
	// no state, so resetting it deletes nothing).
	Buckets int `json:"buckets"`
}

// OverrideRequest is the body of PUT /rate_limit/overrides/<tree>/<tier>/<value>.
type OverrideRequest struct {
	// Value is the value the override is for, when the path names only
	// the tree and tier (/rate_limit/overrides/<tree>/<tier>): a value in a
	// path is written to Caddy's admin log, a credential among them.
	Value     *string            `json:"value,omitempty"`
	Limits    []*hierarchy.Limit `json:"limits,omitempty"`
	Unlimited bool               `json:"unlimited,omitempty"`
	// Replace replaces every limit of the tier for the value, even of
	// dimensions the override leaves out; without it, an override that
	// leaves out a dimension the tier limits is refused.
	Replace bool `json:"replace,omitempty"`
	// Expires, optional, is an RFC 3339 time in the future.
	Expires string `json:"expires,omitempty"`
	Note    string `json:"note,omitempty"`
}

// EntitlementRequest is the body of PUT
// /rate_limit/entitlements/<name>/<value>: a value's plan, limits of its
// own, or both.
type EntitlementRequest struct {
	// Value is the value the entitlement is for, when the path names only
	// the entitlements block (/rate_limit/entitlements/<name>): a value in
	// a path is written to Caddy's admin log, a credential among them.
	Value  *string            `json:"value,omitempty"`
	Plan   string             `json:"plan,omitempty"`
	Limits []*hierarchy.Limit `json:"limits,omitempty"`
	// Expires, optional, is an RFC 3339 time in the future.
	Expires string `json:"expires,omitempty"`
	Note    string `json:"note,omitempty"`
}

// ModeRequest is the body of PUT /rate_limit/mode/<tree>.
type ModeRequest struct {
	Mode string `json:"mode"`
	Note string `json:"note,omitempty"`
}

// Change is the answer of every write (PUT, DELETE) of overrides, modes
// and entitlements: what was there before and what is now (nil: nothing).
type Change[T any] struct {
	Old *T `json:"old"`
	New *T `json:"new"`
}

// Overrides is the answer of GET /rate_limit/overrides.
type Overrides struct {
	Overrides []*control.Override `json:"overrides"`
	Modes     []*control.Mode     `json:"modes"`
}

// Top is the answer of GET /rate_limit/top: the most-denied keys since
// the process started (or the counts were reset), heaviest first.
type Top struct {
	// Total is the number of denials counted.
	Total uint64     `json:"total"`
	Keys  []TopEntry `json:"keys"`
}

// TopEntry is one of the most-denied keys: the tree and tier that denied,
// and the path of values. Its true count is in [Count-Error, Count].
type TopEntry struct {
	topk.Entry
	Tree string      `json:"tree"`
	Tier string      `json:"tier"`
	Path []PathValue `json:"path"`
}
