package cascade

import (
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-cascade/cascade/internal/caddyfileopt"
)

// The options each block of the rate_limit Caddyfile takes, as its parser
// reads them: its error messages list them, and a test holds the
// reference (docs/caddyfile.md) to them. Read only.
var (
	handlerOptions = []string{"tree", "zone", "cost", "store", "route", "charge_on", "max_wait", "max_queued",
		"idempotency", "on_store_error", "mode", "headers", "status_code", "forwarded", "priority", "shed_at_floor",
		"use_error_routes", "jitter", "sweep_interval", "log_key", "fingerprint_secret", "denial_log", "placeholders", "refusal_body", "retry_within", "alerts", "fallback_model",
		"disable_metrics", "distributed", "storage", "entitlements"}
	treeOptions         = []string{"tier", "match", "plan", "strict_allocation"}
	tierOptions         = []string{"key", "missing", "limit", "value", "plan", "adaptive", "penalty", "sensitive"}
	valueOptions        = []string{"limit"}
	planOptions         = []string{"limit"}
	entitlementsOptions = []string{"source", "key", "ttl", "negative_ttl", "stale", "timeout", "header"}
	zoneOptions         = []string{"key", "events", "window", "match", "ipv4_prefix", "ipv6_prefix", "sensitive"}
	costOptions         = []string{"reconcile", "charged_header"}
	llmOptions          = []string{"provider", "chars_per_token", "default_max_tokens", "image_tokens", "max_body_bytes", "on_malformed", "default_cost", "price", "default", "reconcile", "charged_header"}
	graphqlOptions      = []string{"model", "default_list_size", "slicing_arguments", "max_body_bytes", "max_tokens", "max_depth", "max_aliases", "max_directives", "max_batch", "max_cost", "schema", "on_malformed", "default_cost", "reconcile", "list_fields", "depth_factor", "mutation", "subscription", "extensions_cost", "charged_header"}
	reconcileOptions    = []string{"provider", "format", "header", "actual"}
	memoryOptions       = []string{"name", "max_keys", "max_replay_bytes"}
	idempotencyOptions  = []string{"header", "ttl", "in_flight", "retries", "methods", "replay", "replay_cookies", "identity"}
	routeOptions        = []string{"on_store_error"}
	alertsOptions       = []string{"webhook", "header", "timeout", "retries"}
	forwardedOptions    = []string{"report", "report_ttl", "max_report_bytes", "max_held", "max_held_per_tenant", "uri_header"}
)

// misplaced says where an option that belongs to another block goes, for
// the blocks where newcomers put it.
var misplaced = map[string]string{
	"tree limit":             "a limit belongs to a tier: tree <name> { tier <name> {header.X-Key} { limit 100/min } }",
	"tree key":               "a key belongs to a tier: tree <name> { tier <name> { key {header.X-Key} ... } }",
	"tree value":             "a value block belongs to a tier: tier <name> {header.X-Key} { value <v> { limit ... } }",
	"rate_limit limit":       "a limit belongs to a tier of a tree: tree <name> { tier <name> {header.X-Key} { limit 100/min } }",
	"rate_limit tier":        "a tier belongs to a tree: tree <name> { tier <name> {header.X-Key} { limit 100/min } }",
	"tier tier":              "tiers are siblings in their tree, each in its own block: close this tier's block first",
	"tier match":             "match belongs to the tree: tree <name> { match { path /api/* } tier ... }",
	"tier strict_allocation": "strict_allocation belongs to the tree: tree <name> { strict_allocation tier ... }",
}

// unknownOption is the error for an option the block where (e.g. "tier
// org") does not take: it says where the option belongs when it is a
// known misplacement, else suggests the nearest allowed option and lists
// them (see caddyfileopt.Unknown).
func unknownOption(d *caddyfile.Dispenser, where, opt string, allowed []string) error {
	kind, _, _ := strings.Cut(where, " ")
	return caddyfileopt.Unknown(d, where, opt, allowed, misplaced[kind+" "+opt])
}
