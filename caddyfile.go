package cascade

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/rate"
	"github.com/caddy-cascade/cascade/store"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("rate_limit", parseCaddyfile)
	// After authentication, so {http.auth.user.id} and the headers that
	// forward_auth copies are there for key templates; before the handlers
	// that respond. Override with the global option `order rate_limit ...`.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit", httpcaddyfile.After, "forward_auth")
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var handler Handler
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return &handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	rate_limit {
//	    tree <name> {
//	        match { <matchers> }
//	        tier <name> [<key>] {
//	            key     <template>                  # e.g. {header.X-Org}, {http.auth.user.id}, {client_ip}
//	            missing deny|shared|skip            # empty key: refuse (default), one shared bucket, or skip the tier
//	            limit   <count>[ <dimension>]/<per> [burst <n>] [gcra|sliding [approx]|calendar] [tz <zone>]
//	            limit   <count> concurrent          # requests in flight at once
//	            value   <value...> {                # per-value override: replaces the tier's limits
//	                limit ...
//	            }
//	            value   <value...> unlimited
//	            adaptive
//	            penalty <for> after <n> [within <d>]  # refused n times within d (default: for): refused outright for <for>
//	            sensitive [off]                     # values are secrets: shown as fingerprints (default when the key reads a credential)
//	        }
//	    }
//	    zone <name> {                               # mholt/caddy-ratelimit zone: a sliding window
//	        match { <matchers> }
//	        key    <template>
//	        events <max_events>
//	        window <duration>
//	        ipv4_prefix <bits>                      # an IPv4 key counts as its network (24: a /24)
//	        ipv6_prefix <bits>                      # an IPv6 key counts as its network (64: a /64)
//	        sensitive [off]                         # as a tier's
//	    }
//	    cost <dimension> <number|placeholder> [default <n>] [{ reconcile { ... } }]
//	    cost <dimension> body_size
//	    cost <dimension> llm {
//	        provider           auto|openai|anthropic
//	        chars_per_token    <n>                  # default 4
//	        default_max_tokens <n>                  # when the request sets none, default 4096
//	        image_tokens       <n>                  # per image/audio/file part, default 1000
//	        max_body_bytes     <size>               # default 8MiB; larger bodies get 413
//	        on_malformed       reject|default       # 400 (default) or default_cost
//	        default_cost       <n>
//	        reconcile {                             # correct the charge from the response's usage
//	            provider auto|openai|anthropic|graphql
//	            format   auto|json|sse
//	            header   <response header>          # the actual cost in a header instead
//	            actual   total|input|output|weighted [<input weight> <output weight>]
//	        }
//	    }
//	    cost <dimension> graphql {
//	        model fields|github                    # each field 1 × list sizes, or GitHub's points
//	        default_list_size <n>
//	        slicing_arguments <arg...>              # default first last
//	        max_body_bytes <size>                   # default 1MiB; larger bodies get 413
//	        max_tokens <n>  max_depth <n>  max_aliases <n>
//	        max_directives <n>  max_batch <n>  max_cost <n>
//	        schema <file.graphql>                   # @cost / @listSize directives
//	        on_malformed reject|default  default_cost <n>
//	        reconcile { ... }
//	    }
//	    store memory {
//	        name     <name>
//	        max_keys <n>
//	    }
//	    store redis {
//	        address       <host:port...>|<unix socket path>
//	        master_name   <name>                    # Sentinel
//	        cluster
//	        username      <user>
//	        password      <password>
//	        sentinel_username <user>                # to the Sentinels (master_name)
//	        sentinel_password <password>
//	        db            <n>
//	        tls           [insecure] { server_name <name>  ca <pem file> }
//	        dial_timeout  <duration>
//	        read_timeout  <duration>
//	        write_timeout <duration>
//	        pool_size     <n>
//	        key_prefix    <prefix>
//	        bus_secret    <secret>|{env.NAME}       # authenticate Pub/Sub messages between instances (default: derived from password)
//	        insecure_bus                            # send and accept them unauthenticated
//	        timeout       <duration>
//	        breaker       <failures> [<cooldown>]|off # 3 1s: fail at once after 3 failures in a row
//	        slot_ttl      <duration>                # a concurrency slot of a vanished instance frees after it (30s)
//	        tenant_in_flight <n>                    # one tenant's decisions waiting for Redis at most (no cap)
//	        lease [{                                # decide most requests in memory on capacity leased from Redis
//	            max_share     <fraction>            # of what remains, per lease (0.1)
//	            min_remaining <fraction>|<n>%       # below it no lease: per-request decisions (5%)
//	            ttl           <duration>            # how long a lease may be spent (1s)
//	            max_paths     <n>                   # paths tracked, and the memory set aside for them (100000)
//	        }]
//	    }
//	    store redis <name> { ... }                  # a further store, for route
//	    route <tier> <value...> <store> [{ on_store_error deny|allow|local }] # these tenants' paths live in that store
//	    charge_on      status <code...>|{ status <code...>; header <field> [<value>] } # charge only matching responses
//	    max_wait       <duration>                    # hold a request that fits its GCRA limits within it, instead of refusing
//	    max_queued     <n>                           # requests held at once (default 1000)
//	    idempotency [{                              # a retry with the same key and path is not charged again
//	        header    <field>                       # default Idempotency-Key
//	        ttl       <duration>                    # how long a key is remembered (24h)
//	        in_flight <duration>                    # the longest a first request counts as in flight (5m)
//	        retries   <n>                           # retries let through without a charge, per key (1)
//	        methods   <method...>                   # whose keys count (POST PATCH)
//	    }]
//	    on_store_error deny|allow|local [<instances>]  # local: default instances counted from heartbeats
//	    mode           enforce|warn|shadow
//	    headers        <family...>|none             # ietf x_ratelimit retry_after openai (default: ietf retry_after)
//	    status_code    <code>
//	    priority       interactive|batch|critical  # traffic class: adaptive tiers; with max_wait, batch gives way to interactive
//	    shed_at_floor                               # 503 while the adaptive factor is at its floor
//	    use_error_routes
//	    jitter         <fraction>
//	    sweep_interval <duration>
//	    log_key                                     # the refusing bucket's key in the denial's log line
//	    fingerprint_secret <secret>                 # e.g. {env.CASCADE_FP_SECRET}: fingerprints of sensitive values (default: the store's)
//	    denial_log     values|no_values|off         # the sampled INFO line of each denied key (default values)
//	    disable_metrics                             # this handler records no Prometheus metrics
//	    placeholders   all|refused                  # which requests publish {http.rate_limit.*} (default all)
//	    forwarded {                                 # a decision endpoint for Traefik, nginx, Envoy ext_authz: answers only the server's trusted_proxies
//	        report           <path>                 # where front ends report upstream responses
//	        report_ttl       <duration>             # how long a decision waits for it (10m)
//	        max_report_bytes <size>                 # 1MiB
//	        max_held         <n>                    # decisions waiting at once (100000)
//	        max_held_per_tenant <n>                 # of one tenant (a tenth of max_held)
//	        uri_header       <name>                 # the one header with the original URI (default: both, which must agree)
//	    }
//	    distributed    { ... }                      # accepted and ignored (mholt compatibility)
//	    storage        <module...>                  # accepted and ignored (mholt compatibility)
//	}
//
// <per> is s, min, h, day, week, month or a duration (30m, 15s). Limits are
// GCRA (token bucket) by default, with burst = count; per-month limits are
// calendar quotas. A jitter is a fraction of Retry-After (0.2 = up to 20%
// more, 1.5 = up to 150%), as in mholt/caddy-ratelimit.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	if d.NextArg() {
		return d.Errf("rate_limit takes a block, not arguments (got %q)", d.Val())
	}
	for d.NextBlock(0) {
		var err error
		switch d.Val() {
		case "tree":
			err = h.parseTree(d)
		case "zone":
			err = h.parseZone(d)
		case "cost":
			err = h.parseCost(d)
		case "store":
			err = h.parseStore(d)
		case "route":
			err = h.parseRoute(d)
		case "charge_on":
			if h.ChargeOn != nil {
				return d.Err("charge_on given twice: write one, with every status and header it needs")
			}
			m := map[string]caddyhttp.ResponseMatcher{}
			if err := caddyhttp.ParseNamedResponseMatcher(d.NewFromNextSegment(), m); err != nil {
				return err
			}
			rm := m["charge_on"]
			if len(rm.StatusCode) == 0 && len(rm.Headers) == 0 {
				return d.Err("usage: charge_on status <code...> (e.g. charge_on status 401 403), or a block of status and header lines")
			}
			h.ChargeOn = &rm
		case "on_store_error":
			args := d.RemainingArgs()
			switch {
			case len(args) == 1 && (args[0] == "deny" || args[0] == "allow" || args[0] == "local"):
				h.OnStoreError = args[0]
			case len(args) == 2 && args[0] == "local":
				n, cerr := strconv.Atoi(args[1])
				if cerr != nil || n < 1 {
					return d.Errf("on_store_error local %q: give the number of instances sharing the limits, e.g. on_store_error local 3", args[1])
				}
				h.OnStoreError, h.LocalInstances = "local", n
			default:
				return d.Errf("usage: on_store_error deny|allow|local [<instances>]")
			}
		case "mode":
			h.Mode, err = oneOf(d, "enforce", "warn", "shadow")
		case "headers":
			err = h.parseHeaders(d)
		case "status_code":
			var n int
			if n, err = intArg(d); err == nil {
				h.StatusCode = n
			}
		case "use_error_routes":
			h.UseErrorRoutes = true
		case "priority":
			h.Priority, err = oneOf(d, "interactive", "batch", "critical")
		case "shed_at_floor":
			h.ShedAtFloor = true
		case "log_key":
			h.LogKey = true
		case "fingerprint_secret":
			if !d.NextArg() || d.Val() == "" {
				return d.Err("usage: fingerprint_secret <secret>, e.g. fingerprint_secret {env.CASCADE_FP_SECRET} (at least 16 bytes; the same on every instance)")
			}
			h.FingerprintSecret = d.Val()
			if d.NextArg() {
				return d.Errf("fingerprint_secret takes one argument: quote a secret with spaces")
			}
		case "disable_metrics":
			h.DisableMetrics = true
		case "denial_log":
			h.DenialLog, err = oneOf(d, "values", "no_values", "off")
		case "placeholders":
			h.Placeholders, err = oneOf(d, "all", "refused")
		case "max_wait":
			if !d.NextArg() {
				return d.Err("usage: max_wait <duration>, e.g. max_wait 2s")
			}
			dur, err := caddy.ParseDuration(d.Val())
			if err != nil || dur <= 0 {
				return d.Errf("max_wait %q: give how long a request may be held for its turn, e.g. max_wait 2s", d.Val())
			}
			h.MaxWait = caddy.Duration(dur)
		case "idempotency":
			h.Idempotency, err = parseIdempotency(d)
		case "max_queued":
			if !d.NextArg() {
				return d.Err("usage: max_queued <n>")
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n < 1 {
				return d.Errf("max_queued %q: give how many requests may be held at once, at least 1", d.Val())
			}
			h.MaxQueued = n
		case "jitter":
			if !d.NextArg() {
				return d.ArgErr()
			}
			j, perr := strconv.ParseFloat(d.Val(), 64)
			if perr != nil || !(j >= 0) || math.IsInf(j, 1) {
				return d.Errf("jitter %q: use a non-negative fraction such as 0.2 (up to 20%% more Retry-After)", d.Val())
			}
			h.Jitter = j
		case "sweep_interval":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, perr := caddy.ParseDuration(d.Val())
			if perr != nil {
				return d.Errf("sweep_interval %q: %v", d.Val(), perr)
			}
			h.SweepInterval = caddy.Duration(dur)
		case "forwarded":
			err = h.parseForwarded(d)
		case "distributed":
			h.Distributed = []byte(`{}`)
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				d.RemainingArgs()
			}
		case "storage":
			h.StorageRaw = []byte(`{}`)
			d.RemainingArgs()
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				d.RemainingArgs()
			}
		default:
			return d.Errf("unknown rate_limit option %q: expected tree, zone, cost, store, route, charge_on, max_wait, max_queued, idempotency, on_store_error, mode, headers, status_code, forwarded, priority, shed_at_floor, use_error_routes, jitter, sweep_interval, log_key, fingerprint_secret, denial_log, placeholders, disable_metrics, distributed or storage", d.Val())
		}
		if err != nil {
			return err
		}
	}
	// A dimension counted with no cost line would cost every request 0 of
	// it: name the limit that counts it (Provision checks JSON configs).
	dims := make([]string, 0, len(h.counted))
	for dim := range h.counted {
		dims = append(dims, dim)
	}
	slices.Sort(dims)
	for _, dim := range dims {
		if !slices.ContainsFunc(h.Costs, func(c *Cost) bool { return c.Dimension == dim }) {
			c := h.counted[dim]
			return c.pos.errorf("tree %s counts %s, but no cost says what a request costs in %s: add 'cost %s <number or placeholder>' (or llm, graphql, body_size)", c.tree, dim, dim, dim)
		}
	}
	// A cost that no limit counts is work for nothing, and usually a typo
	// of a dimension's name: warn, naming its line. (A zone-only handler
	// counts requests only; Provision warns JSON configs.)
	for _, c := range h.Costs {
		if _, counted := h.counted[c.Dimension]; !counted && c.at.file != "" {
			caddy.Log().Named("caddyfile").Warn(fmt.Sprintf("%s:%d: rate_limit: cost %s: no limit counts %s: add a limit such as 'limit 1000 %s/h', or remove the cost",
				c.at.file, c.at.line, c.Dimension, c.Dimension, c.Dimension))
		}
	}
	return nil
}

// parseCost parses one cost line and its optional block.
func (h *Handler) parseCost(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 2 {
		return d.Errf("usage: cost <dimension> <number|placeholder|llm|graphql|body_size>, e.g. cost tokens {header.X-Tokens} default 1")
	}
	c := &Cost{Dimension: args[0], at: at(d)}
	switch args[1] {
	case "llm":
		c.LLM = &cost.LLM{}
	case "graphql":
		c.GraphQL = &cost.GraphQL{}
	case "body_size":
		c.BodySize = true
	default:
		c.Value = args[1]
	}
	rest := args[2:]
	if len(rest) == 1 && rest[0] == "{}" && (c.LLM != nil || c.GraphQL != nil) {
		rest = nil // an empty block written on one line: llm {}
	}
	if len(rest) == 2 && rest[0] == "default" && c.Value != "" {
		n, err := strconv.ParseInt(rest[1], 10, 64)
		if err != nil || n < 0 {
			return d.Errf("cost %s: default %q must be a non-negative whole number", c.Dimension, rest[1])
		}
		c.Default = &n
		rest = nil
	}
	if len(rest) > 0 {
		return d.Errf("cost %s: unexpected %q", c.Dimension, strings.Join(rest, " "))
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		if opt == "reconcile" {
			r, err := parseReconcile(d)
			if err != nil {
				return err
			}
			c.Reconcile = r
			continue
		}
		var err error
		switch {
		case c.LLM != nil:
			err = parseLLMOption(d, c.LLM)
		case c.GraphQL != nil:
			err = parseGraphQLOption(d, c.GraphQL)
		default:
			err = d.Errf("cost %s: unknown option %q: only reconcile", c.Dimension, opt)
		}
		if err != nil {
			return err
		}
	}
	h.Costs = append(h.Costs, c)
	return nil
}

func parseLLMOption(d *caddyfile.Dispenser, l *cost.LLM) error {
	var err error
	switch opt := d.Val(); opt {
	case "provider":
		l.Provider, err = oneOf(d, "auto", "openai", "anthropic")
	case "chars_per_token":
		var f float64
		if f, err = floatArg(d); err == nil {
			l.CharsPerToken = f
		}
	case "default_max_tokens":
		l.DefaultMaxTokens, err = int64Arg(d)
	case "image_tokens":
		l.ImageTokens, err = int64Arg(d)
	case "max_body_bytes":
		l.MaxBodyBytes, err = sizeArg(d)
	case "on_malformed":
		l.OnMalformed, err = oneOf(d, "reject", "default")
	case "default_cost":
		l.DefaultCost, err = int64Arg(d)
	default:
		return d.Errf("cost llm: unknown option %q: expected provider, chars_per_token, default_max_tokens, image_tokens, max_body_bytes, on_malformed, default_cost or reconcile", opt)
	}
	return err
}

func parseGraphQLOption(d *caddyfile.Dispenser, g *cost.GraphQL) error {
	var err error
	intOpt := map[string]*int{"max_tokens": &g.MaxTokens, "max_depth": &g.MaxDepth, "max_aliases": &g.MaxAliases,
		"max_directives": &g.MaxDirectives, "max_batch": &g.MaxBatch}
	switch opt := d.Val(); opt {
	case "model":
		g.Model, err = oneOf(d, "fields", "github")
	case "default_list_size":
		g.DefaultListSize, err = int64Arg(d)
	case "slicing_arguments":
		g.SlicingArguments = d.RemainingArgs()
		if len(g.SlicingArguments) == 0 {
			return d.Errf("slicing_arguments needs argument names, e.g. first last")
		}
	case "max_body_bytes":
		g.MaxBodyBytes, err = sizeArg(d)
	case "max_cost":
		g.MaxCost, err = int64Arg(d)
	case "schema":
		var file string
		if err = strArg(d, &file); err == nil {
			g.Schema = "@" + file
		}
	case "on_malformed":
		g.OnMalformed, err = oneOf(d, "reject", "default")
	case "default_cost":
		g.DefaultCost, err = int64Arg(d)
	default:
		p, ok := intOpt[opt]
		if !ok {
			return d.Errf("cost graphql: unknown option %q: expected model, default_list_size, slicing_arguments, max_body_bytes, max_tokens, max_depth, max_aliases, max_directives, max_batch, max_cost, schema, on_malformed, default_cost or reconcile", opt)
		}
		*p, err = intArg(d)
	}
	return err
}

func parseReconcile(d *caddyfile.Dispenser) (*Reconcile, error) {
	r := &Reconcile{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch opt := d.Val(); opt {
		case "provider":
			r.Provider, err = oneOf(d, "auto", "openai", "anthropic", "graphql")
		case "format":
			r.Format, err = oneOf(d, "auto", "json", "sse")
		case "header":
			err = strArg(d, &r.Header)
		case "actual":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return nil, d.Errf("actual needs total, input, output or weighted <input weight> <output weight>")
			}
			r.Actual.Mode = args[0]
			switch {
			case args[0] == "weighted" && len(args) == 3:
				in, err1 := strconv.ParseFloat(args[1], 64)
				out, err2 := strconv.ParseFloat(args[2], 64)
				if err1 != nil || err2 != nil {
					return nil, d.Errf("actual weighted: weights must be numbers")
				}
				r.Actual.InputWeight, r.Actual.OutputWeight = in, out
			case len(args) == 1 && args[0] != "weighted":
			default:
				return nil, d.Errf("usage: actual total|input|output|weighted <input weight> <output weight>")
			}
			if err := r.Actual.Validate(); err != nil {
				return nil, d.Errf("actual: %v", err)
			}
		default:
			return nil, d.Errf("reconcile: unknown option %q: expected provider, format, header or actual", opt)
		}
		if err != nil {
			return nil, err
		}
	}
	return r, nil
}

// position is where a token was, for an error found once its block is read.
type position struct {
	file string
	line int
}

func at(d *caddyfile.Dispenser) position { return position{d.File(), d.Line()} }

// errorf is d.Errf for the token at p.
func (p position) errorf(format string, args ...any) error {
	return fmt.Errorf("%s, at %s:%d", fmt.Sprintf(format, args...), p.file, p.line)
}

func (h *Handler) parseTree(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("usage: tree <name> { tier ... }")
	}
	t := &Tree{Tree: hierarchy.Tree{Name: d.Val()}}
	for _, other := range h.Trees {
		if other.Name == t.Name {
			return d.Errf("tree %s defined twice: give each tree its own name", t.Name)
		}
	}
	if _, dup := h.RateLimits[t.Name]; dup {
		return d.Errf("tree %s has the name of a zone: give each its own name", t.Name)
	}
	if d.NextArg() {
		return d.Errf("tree %s: unexpected argument %q; tiers go in the block", t.Name, d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "tier":
			tier, err := h.parseTier(d, t.Name, t.Tiers)
			if err != nil {
				return err
			}
			t.Tiers = append(t.Tiers, tier)
		case "match":
			set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return err
			}
			t.MatcherSetsRaw = append(t.MatcherSetsRaw, set)
		default:
			return d.Errf("tree %s: unknown option %q: expected tier or match", t.Name, d.Val())
		}
	}
	if len(t.Tiers) == 0 {
		return d.Errf("tree %s has no tiers: add tier <name> <key> { limit ... }", t.Name)
	}
	h.Trees = append(h.Trees, t)
	return nil
}

// parseTier parses one tier of a tree whose tiers so far are before.
func (h *Handler) parseTier(d *caddyfile.Dispenser, tree string, before []*hierarchy.Tier) (*hierarchy.Tier, error) {
	if !d.NextArg() {
		return nil, d.Errf("usage: tier <name> [<key>] { limit ... }")
	}
	tier := &hierarchy.Tier{Name: d.Val()}
	start := at(d)
	for _, other := range before {
		if other.Name == tier.Name {
			return nil, d.Errf("tier %s appears twice in its tree: give each tier its own name", tier.Name)
		}
	}
	if d.NextArg() {
		tier.Key = d.Val()
	}
	if d.NextArg() {
		return nil, d.Errf("tier %s: unexpected argument %q", tier.Name, d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "key":
			if !d.NextArg() {
				return nil, d.ArgErr()
			}
			tier.Key = d.Val()
		case "missing":
			v, err := oneOf(d, "deny", "shared", "skip")
			if err != nil {
				return nil, err
			}
			tier.Missing = hierarchy.Missing(v)
		case "limit":
			l, err := h.parseLimitOf(d, tree)
			if err != nil {
				return nil, err
			}
			tier.Limits = append(tier.Limits, l)
		case "value":
			if err := h.parseValue(d, tree, tier); err != nil {
				return nil, err
			}
		case "adaptive":
			tier.Adaptive = true
		case "penalty":
			p, err := parsePenalty(d, tier.Name)
			if err != nil {
				return nil, err
			}
			tier.Penalty = p
		case "sensitive":
			on, err := parseSensitive(d, "tier "+tier.Name)
			if err != nil {
				return nil, err
			}
			tier.Sensitive = &on
		default:
			return nil, d.Errf("tier %s: unknown option %q: expected key, missing, limit, value, adaptive, penalty or sensitive", tier.Name, d.Val())
		}
	}
	if tier.Key == "" {
		return nil, start.errorf("tier %s has no key: write tier %s {header.X-%s}, or key <placeholder> in its block", tier.Name, tier.Name, tier.Name)
	}
	if len(tier.Limits) == 0 && len(tier.Values) == 0 {
		return nil, start.errorf("tier %s has no limits: add one in its block, e.g. limit 1000/h", tier.Name)
	}
	return tier, nil
}

// parseSensitive parses `sensitive [on|off]`: whether a tier's values are
// secrets, shown only as fingerprints.
func parseSensitive(d *caddyfile.Dispenser, what string) (bool, error) {
	on := true
	if d.NextArg() {
		switch d.Val() {
		case "on":
		case "off":
			on = false
		default:
			return false, d.Errf("%s: sensitive %q: write sensitive (its values are secrets, shown as fingerprints) or sensitive off (shown as they are)", what, d.Val())
		}
	}
	if d.NextArg() {
		return false, d.Errf("%s: sensitive takes at most one argument, on or off (got %q)", what, d.Val())
	}
	return on, nil
}

// parsePenalty parses `penalty <for> after <n> [within <duration>]`.
func parsePenalty(d *caddyfile.Dispenser, tier string) (*hierarchy.Penalty, error) {
	usage := func() error {
		return d.Errf("tier %s: usage: penalty <for> after <refusals> [within <duration>], e.g. penalty 10m after 5 within 1m", tier)
	}
	p := &hierarchy.Penalty{}
	if !d.NextArg() {
		return nil, usage()
	}
	p.For = d.Val()
	if !d.NextArg() || d.Val() != "after" || !d.NextArg() {
		return nil, usage()
	}
	n, err := strconv.ParseInt(d.Val(), 10, 64)
	if err != nil {
		return nil, d.Errf("tier %s: penalty after %q: give a whole number of refusals", tier, d.Val())
	}
	p.After = n
	if d.NextArg() {
		if d.Val() != "within" || !d.NextArg() {
			return nil, usage()
		}
		p.Within = d.Val()
	}
	if d.NextArg() {
		return nil, usage()
	}
	if err := p.Validate(); err != nil {
		return nil, d.Errf("tier %s: %v", tier, err)
	}
	return p, nil
}

// parseValue parses `value <v...> { limit ... }` or `value <v...> unlimited`.
func (h *Handler) parseValue(d *caddyfile.Dispenser, tree string, tier *hierarchy.Tier) error {
	vals := d.RemainingArgs()
	unlimited := len(vals) > 1 && vals[len(vals)-1] == "unlimited"
	if unlimited {
		vals = vals[:len(vals)-1]
	}
	if len(vals) == 0 {
		return d.Errf("usage: value <value...> { limit ... } or value <value...> unlimited")
	}
	var limits []*hierarchy.Limit
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() != "limit" {
			return d.Errf("value %s: unknown option %q: only limit", vals[0], d.Val())
		}
		l, err := h.parseLimitOf(d, tree)
		if err != nil {
			return err
		}
		limits = append(limits, l)
	}
	if !unlimited && len(limits) == 0 {
		return d.Errf("value %s has no limits: add limit lines in its block, or write value %s unlimited", vals[0], vals[0])
	}
	if unlimited && len(limits) > 0 {
		return d.Errf("value %s: unlimited and limits are exclusive", vals[0])
	}
	if tier.Values == nil {
		tier.Values = map[string]*hierarchy.Override{}
	}
	for _, v := range vals {
		if _, dup := tier.Values[v]; dup {
			return d.Errf("tier %s: value %s overridden twice", tier.Name, v)
		}
		o := &hierarchy.Override{Unlimited: unlimited}
		for _, l := range limits {
			c := *l
			o.Limits = append(o.Limits, &c)
		}
		tier.Values[v] = o
	}
	return nil
}

// parseLimitOf parses a limit of tree, noting where the tree first counts a
// dimension other than requests: a cost must say what a request costs in
// it (checked once the whole block is read).
func (h *Handler) parseLimitOf(d *caddyfile.Dispenser, tree string) (*hierarchy.Limit, error) {
	pos := at(d)
	l, err := parseLimit(d)
	if err != nil || l.Dimension == "" || l.Dimension == hierarchy.Requests {
		return l, err
	}
	if h.counted == nil {
		h.counted = map[string]countedAt{}
	}
	if _, seen := h.counted[l.Dimension]; !seen {
		h.counted[l.Dimension] = countedAt{tree, pos}
	}
	return l, nil
}

// countedAt is where a tree first counts a dimension.
type countedAt struct {
	tree string
	pos  position
}

// parseLimit parses `limit <count>[ <dimension>]/<per> [burst <n>] [algorithm] [tz <zone>]`
// or `limit <count> concurrent`.
func parseLimit(d *caddyfile.Dispenser) (*hierarchy.Limit, error) {
	const usage = "usage: limit <count>/<per> or limit <count> <dimension>/<per>, then optionally burst <n>, gcra|sliding|sliding approx|calendar, tz <zone>; or limit <count> concurrent; e.g. limit 1000/h or limit 100000 tokens/h burst 5000 or limit 10 concurrent"
	args := d.RemainingArgs()
	if len(args) == 0 {
		return nil, d.Errf("%s", usage)
	}
	l := &hierarchy.Limit{}
	if len(args) >= 2 && args[1] == string(rate.Concurrent) {
		// "<count> concurrent": requests in flight at once.
		n, err := strconv.ParseInt(strings.ReplaceAll(args[0], "_", ""), 10, 64)
		if err != nil || n <= 0 {
			return nil, d.Errf("limit: count %q must be a positive whole number", args[0])
		}
		if len(args) > 2 {
			return nil, d.Errf("limit %s concurrent: unexpected %q: a concurrency limit takes no period, burst or algorithm", args[0], args[2])
		}
		l.Count, l.Algorithm = n, string(rate.Concurrent)
		return l, nil
	}
	rateArg := args[0]
	rest := args[1:]
	countStr, per, ok := strings.Cut(rateArg, "/")
	if !ok {
		// "<count> <dimension>/<per>"
		if len(rest) == 0 {
			return nil, d.Errf("limit %s: no period; %s", rateArg, usage)
		}
		countStr = rateArg
		var dimPer string
		dimPer, rest = rest[0], rest[1:]
		if l.Dimension, per, ok = strings.Cut(dimPer, "/"); !ok {
			return nil, d.Errf("limit %s %s: no period; %s", rateArg, dimPer, usage)
		}
	}
	n, err := strconv.ParseInt(strings.ReplaceAll(countStr, "_", ""), 10, 64)
	if err != nil || n <= 0 {
		return nil, d.Errf("limit: count %q must be a positive whole number", countStr)
	}
	l.Count, l.Per = n, per
	for len(rest) > 0 {
		switch w := rest[0]; w {
		case "burst":
			if len(rest) < 2 {
				return nil, d.Errf("limit: burst needs a number")
			}
			b, err := strconv.ParseInt(rest[1], 10, 64)
			if err != nil || b <= 0 {
				return nil, d.Errf("limit: burst %q must be a positive whole number", rest[1])
			}
			l.Burst, rest = b, rest[2:]
		case "tz":
			if len(rest) < 2 {
				return nil, d.Errf("limit: tz needs a time zone name such as Europe/Paris")
			}
			l.Timezone, rest = rest[1], rest[2:]
		case "gcra", "sliding", "calendar":
			l.Algorithm, rest = w, rest[1:]
			if w == "sliding" && len(rest) > 0 && rest[0] == "approx" {
				l.Algorithm, rest = string(rate.SlidingApprox), rest[1:]
			}
		case string(rate.SlidingApprox):
			l.Algorithm, rest = w, rest[1:]
		default:
			return nil, d.Errf("limit: unexpected %q; %s", w, usage)
		}
	}
	if err := l.Validate(); err != nil {
		return nil, d.Errf("limit %s: %v", l.String(), err)
	}
	return l, nil
}

func (h *Handler) parseZone(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("usage: zone <name> { key ... events ... window ... }")
	}
	name := d.Val()
	if slices.ContainsFunc(h.Trees, func(t *Tree) bool { return t.Name == name }) {
		return d.Errf("zone %s has the name of a tree: give each its own name", name)
	}
	z := &Zone{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "key":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if z.Key != "" {
				return d.Errf("zone key already specified: %s", z.Key)
			}
			z.Key = d.Val()
		case "window":
			if !d.NextArg() {
				return d.ArgErr()
			}
			if z.Window != 0 {
				return d.Errf("zone window already specified: %v", z.Window)
			}
			w, err := caddy.ParseDuration(d.Val())
			if err != nil {
				return d.Errf("invalid window duration '%s': %v", d.Val(), err)
			}
			z.Window = caddy.Duration(w)
		case "events":
			n, err := intArg(d)
			if err != nil {
				return err
			}
			if z.MaxEvents != 0 {
				return d.Errf("zone max events already specified: %v", z.MaxEvents)
			}
			z.MaxEvents = n
		case "match":
			set, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return err
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, set)
		case "ipv4_prefix", "ipv6_prefix":
			opt, most, example := d.Val(), 32, 24
			if opt == "ipv6_prefix" {
				most, example = 128, 64
			}
			n, err := intArg(d)
			if err != nil {
				return err
			}
			if n > most {
				return d.Errf("zone %s: %s %d: use 1 to %d bits (%d groups a /%d), or 0 for none", name, opt, n, most, example, example)
			}
			if opt == "ipv4_prefix" {
				z.IPv4Prefix = n
			} else {
				z.IPv6Prefix = n
			}
		case "sensitive":
			on, err := parseSensitive(d, "zone "+name)
			if err != nil {
				return err
			}
			z.Sensitive = &on
		default:
			return d.Errf("zone %s: unknown option %q: expected key, events, window, match, ipv4_prefix, ipv6_prefix or sensitive", name, d.Val())
		}
	}
	if z.Window <= 0 || z.MaxEvents <= 0 {
		return d.Errf("zone %s: a rate limit zone requires both a window and maximum events", name)
	}
	if h.RateLimits == nil {
		h.RateLimits = map[string]*Zone{}
	}
	if _, dup := h.RateLimits[name]; dup {
		return d.Errf("zone %s defined twice", name)
	}
	h.RateLimits[name] = z
	return nil
}

func (h *Handler) parseStore(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("usage: store memory|redis { ... }")
	}
	kind := d.Val()
	if d.NextArg() { // store redis <name> { ... }: a store for routes
		name := d.Val()
		if kind != "redis" {
			return d.Errf("store %s %s: only redis stores are named (for route): a memory store is this process's", kind, name)
		}
		if h.Stores[name] != nil {
			return d.Errf("store redis %s given twice", name)
		}
		if h.Stores == nil {
			h.Stores = map[string]*StoreConfig{}
		}
		r := &RedisStoreConfig{}
		h.Stores[name] = &StoreConfig{Redis: r}
		return parseRedis(d, r)
	}
	if h.Store != nil {
		return d.Errf("store already configured")
	}
	switch kind {
	case "memory":
		m := &MemoryStoreConfig{}
		h.Store = &StoreConfig{Memory: m}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			var err error
			switch d.Val() {
			case "name":
				if !d.NextArg() {
					return d.ArgErr()
				}
				m.Name = d.Val()
			case "max_keys":
				m.MaxKeys, err = intArg(d)
			default:
				return d.Errf("store memory: unknown option %q: expected name or max_keys", d.Val())
			}
			if err != nil {
				return err
			}
		}
	case "redis":
		r := &RedisStoreConfig{}
		h.Store = &StoreConfig{Redis: r}
		return parseRedis(d, r)
	default:
		return d.Errf("unknown store %q: use memory (default) or redis", d.Val())
	}
	return nil
}

func parseRedis(d *caddyfile.Dispenser, r *RedisStoreConfig) error {
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch opt := d.Val(); opt {
		case "address", "addresses":
			for _, a := range d.RemainingArgs() {
				if !strings.Contains(a, "{") { // a placeholder is checked once resolved
					if err := store.ValidateRedisAddress(a); err != nil {
						return d.Err(err.Error())
					}
				}
				r.Addresses = append(r.Addresses, a)
			}
			if len(r.Addresses) == 0 {
				return d.Errf("address needs host:port, or the path of a Unix socket")
			}
		case "master_name":
			err = strArg(d, &r.MasterName)
		case "cluster":
			r.Cluster = true
		case "username":
			err = strArg(d, &r.Username)
		case "password":
			err = strArg(d, &r.Password)
		case "sentinel_username":
			err = strArg(d, &r.SentinelUsername)
		case "sentinel_password":
			err = strArg(d, &r.SentinelPassword)
		case "db":
			r.DB, err = intArg(d)
		case "pool_size":
			r.PoolSize, err = intArg(d)
		case "tenant_in_flight":
			r.TenantInFlight, err = intArg(d)
		case "key_prefix":
			err = strArg(d, &r.KeyPrefix)
		case "bus_secret", "insecure_bus":
			err = parseRedisBus(d, r)
		case "dial_timeout", "read_timeout", "write_timeout", "timeout", "slot_ttl":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, perr := caddy.ParseDuration(d.Val())
			if perr != nil || dur <= 0 {
				return d.Errf("%s %q: use a positive duration such as 250ms", opt, d.Val())
			}
			switch opt {
			case "dial_timeout":
				r.DialTimeout = caddy.Duration(dur)
			case "read_timeout":
				r.ReadTimeout = caddy.Duration(dur)
			case "write_timeout":
				r.WriteTimeout = caddy.Duration(dur)
			case "slot_ttl":
				r.SlotTTL = caddy.Duration(dur)
			default:
				r.Timeout = caddy.Duration(dur)
			}
		case "breaker":
			args := d.RemainingArgs()
			switch {
			case len(args) == 1 && args[0] == "off":
				r.Breaker = &RedisBreaker{}
			case len(args) == 1 || len(args) == 2:
				n, cerr := strconv.Atoi(args[0])
				if cerr != nil || n < 1 {
					return d.Errf("breaker %q: give the failures in a row that open it (a positive number), e.g. breaker 3 1s, or breaker off", args[0])
				}
				r.Breaker = &RedisBreaker{Failures: n}
				if len(args) == 2 {
					dur, perr := caddy.ParseDuration(args[1])
					if perr != nil || dur <= 0 {
						return d.Errf("breaker cooldown %q: use a positive duration such as 1s", args[1])
					}
					r.Breaker.Cooldown = caddy.Duration(dur)
				}
			default:
				return d.Errf("usage: breaker <failures> [<cooldown>], or breaker off")
			}
		case "lease":
			err = parseLease(d, r)
		case "tls":
			r.TLS = &RedisTLS{}
			for _, a := range d.RemainingArgs() {
				if a != "insecure" {
					return d.Errf("tls: unexpected %q (only insecure)", a)
				}
				r.TLS.InsecureSkipVerify = true
			}
			for n := d.Nesting(); d.NextBlock(n); {
				switch d.Val() {
				case "server_name":
					err = strArg(d, &r.TLS.ServerName)
				case "ca":
					err = strArg(d, &r.TLS.CA)
				default:
					return d.Errf("tls: unknown option %q: expected server_name or ca", d.Val())
				}
				if err != nil {
					return err
				}
			}
		default:
			return d.Errf("store redis: unknown option %q", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// parseLease reads `lease [{ max_share … min_remaining … ttl … max_paths … }]`.
func parseLease(d *caddyfile.Dispenser, r *RedisStoreConfig) error {
	if d.NextArg() {
		return d.Errf("lease takes no arguments: write its options in a block (max_share, min_remaining, ttl, max_paths)")
	}
	r.Lease = &RedisLease{}
	for n := d.Nesting(); d.NextBlock(n); {
		opt := d.Val()
		args := d.RemainingArgs()
		if len(args) != 1 {
			return d.Errf("lease %s takes one value", opt)
		}
		switch opt {
		case "max_share":
			v, err := parseFraction(args[0])
			if err != nil || v <= 0 || v > 1 {
				return d.Errf("lease max_share %q: give a fraction of what remains above 0 and at most 1, e.g. 0.1 or 10%%", args[0])
			}
			r.Lease.MaxShare = v
		case "min_remaining":
			v, err := parseFraction(args[0])
			if err != nil || v < 0 || v >= 1 {
				return d.Errf("lease min_remaining %q: give a fraction of the capacity from 0 up to (not including) 1, e.g. 0.05 or 5%%", args[0])
			}
			r.Lease.MinRemaining = v
		case "ttl":
			dur, err := caddy.ParseDuration(args[0])
			if err != nil || dur <= 0 || dur > time.Minute {
				return d.Errf("lease ttl %q: give a positive duration of at most a minute, e.g. 1s", args[0])
			}
			r.Lease.TTL = caddy.Duration(dur)
		case "max_paths":
			n, err := strconv.Atoi(args[0])
			if err != nil || n <= 0 {
				return d.Errf("lease max_paths %q: give a positive number of paths, e.g. 100000", args[0])
			}
			r.Lease.MaxPaths = n
		default:
			return d.Errf("lease: unknown option %q: expected max_share, min_remaining, ttl or max_paths", opt)
		}
	}
	return nil
}

// parseFraction reads 0.05 or 5%.
func parseFraction(s string) (float64, error) {
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		return v / 100, err
	}
	return strconv.ParseFloat(s, 64)
}

func (h *Handler) parseHeaders(d *caddyfile.Dispenser) error {
	fams := d.RemainingArgs()
	if len(fams) == 0 {
		return d.Errf("usage: headers <family...> (ietf x_ratelimit retry_after openai) or headers none")
	}
	f := false
	cfg := &HeadersConfig{IETF: &f, XRateLimit: &f, RetryAfter: &f}
	t := true
	for _, fam := range fams {
		switch fam {
		case "none":
		case "ietf":
			cfg.IETF = &t
		case "x_ratelimit":
			cfg.XRateLimit = &t
		case "retry_after":
			cfg.RetryAfter = &t
		case "openai":
			cfg.OpenAI = true
		default:
			return d.Errf("headers: unknown family %q: use ietf, x_ratelimit, retry_after, openai or none", fam)
		}
	}
	h.Headers = cfg
	return nil
}

func oneOf(d *caddyfile.Dispenser, allowed ...string) (string, error) {
	opt := d.Val()
	if !d.NextArg() {
		return "", d.Errf("%s needs one of: %s", opt, strings.Join(allowed, ", "))
	}
	for _, a := range allowed {
		if d.Val() == a {
			if d.NextArg() {
				return "", d.Errf("%s: unexpected argument %q", opt, d.Val())
			}
			return a, nil
		}
	}
	return "", d.Errf("%s %q: use one of %s", opt, d.Val(), strings.Join(allowed, ", "))
}

func intArg(d *caddyfile.Dispenser) (int, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.Errf("%s needs a number", opt)
	}
	n, err := strconv.Atoi(d.Val())
	if err != nil || n < 0 {
		return 0, d.Errf("%s %q: use a non-negative whole number", opt, d.Val())
	}
	return n, nil
}

func int64Arg(d *caddyfile.Dispenser) (int64, error) {
	n, err := intArg(d)
	return int64(n), err
}

func floatArg(d *caddyfile.Dispenser) (float64, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.Errf("%s needs a number", opt)
	}
	f, err := strconv.ParseFloat(d.Val(), 64)
	if err != nil || f <= 0 {
		return 0, d.Errf("%s %q: use a positive number", opt, d.Val())
	}
	return f, nil
}

// sizeArg reads a byte size such as 1MB or 512KiB.
func sizeArg(d *caddyfile.Dispenser) (int64, error) {
	opt := d.Val()
	if !d.NextArg() {
		return 0, d.Errf("%s needs a size such as 1MiB", opt)
	}
	n, err := humanize.ParseBytes(d.Val())
	if err != nil || n == 0 {
		return 0, d.Errf("%s %q: use a size such as 1MiB or 65536", opt, d.Val())
	}
	return int64(n), nil
}

func strArg(d *caddyfile.Dispenser, dst *string) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.Errf("%s needs a value", opt)
	}
	*dst = d.Val()
	return nil
}
