package cascade

import (
	"fmt"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// The options each block of the rate_limit Caddyfile takes, as its parser
// reads them: its error messages list them, and a test holds the
// reference (docs/caddyfile.md) to them. Read only.
var (
	handlerOptions = []string{"tree", "zone", "cost", "store", "route", "charge_on", "max_wait", "max_queued",
		"idempotency", "on_store_error", "mode", "headers", "status_code", "forwarded", "priority", "shed_at_floor",
		"use_error_routes", "jitter", "sweep_interval", "log_key", "fingerprint_secret", "denial_log", "placeholders",
		"disable_metrics", "distributed", "storage"}
	treeOptions        = []string{"tier", "match"}
	tierOptions        = []string{"key", "missing", "limit", "value", "adaptive", "penalty", "sensitive"}
	valueOptions       = []string{"limit"}
	zoneOptions        = []string{"key", "events", "window", "match", "ipv4_prefix", "ipv6_prefix", "sensitive"}
	costOptions        = []string{"reconcile"}
	llmOptions         = []string{"provider", "chars_per_token", "default_max_tokens", "image_tokens", "max_body_bytes", "on_malformed", "default_cost", "reconcile"}
	graphqlOptions     = []string{"model", "default_list_size", "slicing_arguments", "max_body_bytes", "max_tokens", "max_depth", "max_aliases", "max_directives", "max_batch", "max_cost", "schema", "on_malformed", "default_cost", "reconcile"}
	reconcileOptions   = []string{"provider", "format", "header", "actual"}
	memoryOptions      = []string{"name", "max_keys"}
	redisOptions       = []string{"address", "master_name", "cluster", "username", "password", "sentinel_username", "sentinel_password", "db", "tls", "dial_timeout", "read_timeout", "write_timeout", "pool_size", "key_prefix", "bus_secret", "insecure_bus", "timeout", "breaker", "slot_ttl", "tenant_in_flight", "lease"}
	tlsOptions         = []string{"server_name", "ca"}
	leaseOptions       = []string{"max_share", "min_remaining", "ttl", "max_paths"}
	idempotencyOptions = []string{"header", "ttl", "in_flight", "retries", "methods"}
	routeOptions       = []string{"on_store_error"}
	forwardedOptions   = []string{"report", "report_ttl", "max_report_bytes", "max_held", "max_held_per_tenant", "uri_header"}
)

// misplaced says where an option that belongs to another block goes, for
// the blocks where newcomers put it.
var misplaced = map[string]string{
	"tree limit":       "a limit belongs to a tier: tree <name> { tier <name> {header.X-Key} { limit 100/min } }",
	"tree key":         "a key belongs to a tier: tree <name> { tier <name> { key {header.X-Key} ... } }",
	"tree value":       "a value block belongs to a tier: tier <name> {header.X-Key} { value <v> { limit ... } }",
	"rate_limit limit": "a limit belongs to a tier of a tree: tree <name> { tier <name> {header.X-Key} { limit 100/min } }",
	"rate_limit tier":  "a tier belongs to a tree: tree <name> { tier <name> {header.X-Key} { limit 100/min } }",
	"tier tier":        "tiers are siblings in their tree, each in its own block: close this tier's block first",
	"tier match":       "match belongs to the tree: tree <name> { match { path /api/* } tier ... }",
}

// unknownOption is the error for an option the block where (e.g. "tier
// org") does not take: it says where the option belongs when it is a
// known misplacement, suggests the nearest allowed option when the option
// looks like a typo of it, and lists the allowed ones.
func unknownOption(d *caddyfile.Dispenser, where, opt string, allowed []string) error {
	kind, _, _ := strings.Cut(where, " ")
	if fix, ok := misplaced[kind+" "+opt]; ok {
		return d.Errf("%s: %s is not an option here: %s", where, opt, fix)
	}
	msg := fmt.Sprintf("%s: unknown option %q", where, opt)
	if near := nearest(opt, allowed); near != "" {
		msg += fmt.Sprintf(": did you mean %q?", near)
	}
	return d.Errf("%s (expected %s)", msg, orList(allowed))
}

// nearest is the allowed option opt is a likely typo of: at most two edits
// away (one for options of four letters or fewer), or "" when none is.
func nearest(opt string, allowed []string) string {
	best, bestDist := "", 3
	if len(opt) <= 4 {
		bestDist = 2
	}
	for _, a := range allowed {
		if d := editDistance(opt, a); d < bestDist {
			best, bestDist = a, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// orList writes items as "a, b or c".
func orList(items []string) string {
	if len(items) == 1 {
		return items[0]
	}
	return strings.Join(slices.Clone(items[:len(items)-1]), ", ") + " or " + items[len(items)-1]
}
