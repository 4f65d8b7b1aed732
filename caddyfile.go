package cascade

import (
	"errors"
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

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/internal/caddyfileopt"
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
//	        plan <placeholder> default <plan>       # where a request's plan comes from (an entitlement's plan)
//	        strict_allocation                       # a child tier allowed more than its parent is an error
//	        tier <name> [<key>] {
//	            key     <template>                  # e.g. {header.X-Org}, {http.auth.user.id}, {client_ip}
//	            missing deny|shared|skip            # empty key: refuse (default), one shared bucket, or skip the tier
//	            limit   <count>[ <dimension>]/<per> [burst <n>] [gcra|sliding [approx]|calendar] [tz <zone>] [alert <n>%...]
//	            limit   <count> concurrent          # requests in flight at once
//	            value   <value...> {                # per-value override: replaces the tier's limits
//	                limit ...
//	            }
//	            value   <value...> unlimited
//	            plan    <name> { limit ... } | plan <name> unlimited   # the limits of a plan
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
//	        max_replay_bytes <size>                 # idempotency replay's responses (64MiB)
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
//	        replay [max_body <size>]                # keep the first response; answer retries with it (1MiB)
//	        replay_cookies                          # with replay, keep its Set-Cookie too
//	        identity  <field...>                    # with replay, the caller's credentials (Authorization Proxy-Authorization Cookie X-Api-Key)
//	    }]
//	    on_store_error deny|allow|local [<instances>]  # local: default instances counted from heartbeats
//	    mode           enforce|warn|shadow
//	    headers        <family...>|none             # ietf x_ratelimit retry_after openai anthropic (default: ietf retry_after)
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
//	    retry_within   <duration>                   # a longer wait says x-should-retry: false (default 1m)
//	    refusal_body   problem|openai|anthropic     # a refusal's body: problem+json (default), or the provider's error object
//	    fallback_model <model> <fallback...>        # refused by the model's limits or a money limit: served as the first fallback admitted
//	    entitlements <name> {                       # a customer's plan, looked up by a tier's value
//	        source file <path.json> | redis <key template> [store <name>] | http <url template>
//	        key <tier>; ttl <d>; negative_ttl <d>; stale <d>; timeout <d>; header <field> <value>
//	    }
//	    alerts {                                    # where limits' alert thresholds go (always logged)
//	        webhook <url>; header <name> <value>; timeout <duration>; retries <n>
//	    }
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
	// Each option is parsed from its own copy of its tokens, so that a
	// mistake in one does not hide the mistakes of the next: caddy validate
	// names them all.
	var errs []error
	for d.NextBlock(0) {
		opt := d.NewFromNextSegment()
		opt.Next()
		name := opt.Val()
		if err := h.unmarshalOption(opt); err != nil {
			errs = append(errs, err)
		} else if opt.Next() { // what the option's parser left: not an option of its
			errs = append(errs, opt.Errf("rate_limit: %s: unexpected %q: see the option's syntax in docs/caddyfile.md", name, opt.Val()))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := h.checkCounted(); err != nil {
		return err
	}
	return h.checkMoney()
}

// unmarshalOption parses one option of the rate_limit block, d at its
// name.
func (h *Handler) unmarshalOption(d *caddyfile.Dispenser) error {
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
		h.Mode, err = caddyfileopt.OneOf(d, "enforce", "warn", "shadow")
	case "headers":
		err = h.parseHeaders(d)
	case "status_code":
		var n int
		if n, err = caddyfileopt.Int(d); err == nil {
			h.StatusCode = n
		}
	case "use_error_routes":
		h.UseErrorRoutes = true
	case "priority":
		h.Priority, err = caddyfileopt.OneOf(d, "interactive", "batch", "critical")
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
		h.DenialLog, err = caddyfileopt.OneOf(d, "values", "no_values", "off")
	case "placeholders":
		h.Placeholders, err = caddyfileopt.OneOf(d, "all", "refused")
	case "retry_within": // the SDKs sleep through no longer wait
		var dur time.Duration
		dur, err = caddyfileopt.Duration(d, time.Minute)
		h.RetryWithin = caddy.Duration(dur)
	case "refusal_body":
		h.RefusalBody, err = caddyfileopt.OneOf(d, engine.BodyProblem, engine.BodyOpenAI, engine.BodyAnthropic)
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
	case "alerts":
		err = h.parseAlerts(d)
	case "entitlements":
		err = h.parseEntitlements(d)
	case "fallback_model":
		args := d.RemainingArgs()
		if len(args) < 2 {
			return d.Errf("usage: fallback_model <model> <fallback...>, e.g. fallback_model gpt-4o gpt-4o-mini")
		}
		if _, dup := h.FallbackModels[args[0]]; dup {
			return d.Errf("fallback_model %s given twice: give its whole chain on one line", args[0])
		}
		if h.FallbackModels == nil {
			h.FallbackModels = map[string][]string{}
		}
		h.FallbackModels[args[0]] = args[1:]
		if err := checkFallbacks(h.FallbackModels); err != nil {
			delete(h.FallbackModels, args[0])
			return d.Errf("%v", err)
		}
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
		return unknownOption(d, "rate_limit", d.Val(), handlerOptions)
	}
	return err
}

// parseAlerts parses `alerts { webhook <url>; header <name> <value>;
// timeout <duration>; retries <n> }`.
func (h *Handler) parseAlerts(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.Errf("alerts takes a block, not %q", d.Val())
	}
	a := &AlertsConfig{}
	for n := d.Nesting(); d.NextBlock(n); {
		var err error
		switch opt := d.Val(); opt {
		case "webhook":
			err = caddyfileopt.Str(d, &a.Webhook)
		case "header":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf("usage: header <name> <value>, e.g. header Authorization \"Bearer {env.ALERT_TOKEN}\"")
			}
			if a.Headers == nil {
				a.Headers = map[string]string{}
			}
			a.Headers[args[0]] = args[1]
		case "timeout":
			var dur time.Duration
			dur, err = caddyfileopt.Duration(d, 0)
			a.Timeout = caddy.Duration(dur)
		case "retries":
			a.Retries, err = caddyfileopt.Int(d)
		default:
			return unknownOption(d, "alerts", opt, alertsOptions)
		}
		if err != nil {
			return err
		}
	}
	if a.Webhook == "" {
		return d.Errf("alerts: give a webhook <url> to post alerts to (each is logged in any case)")
	}
	h.Alerts = a
	return nil
}

// checkCounted checks, once the block is parsed, that every dimension a
// limit counts has a cost.
func (h *Handler) checkCounted() error {
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

// checkMoney checks, once the block is parsed, that only a money
// dimension's limits have decimal counts, and keeps the amounts of money
// limits alone (Provision turns them into micro-units).
func (h *Handler) checkMoney() error {
	money := h.moneyDimensions()
	for _, c := range h.decimals {
		if !money[c.dim] {
			return c.pos.errorf("tree %s: limit %s %s: only money takes a decimal count, and no cost prices %s: use a whole number, or price it (cost %s llm { price <model> input <per 1M tokens> output <per 1M tokens> })",
				c.tree, c.amount, c.dim, c.dim, c.dim)
		}
	}
	for _, t := range h.Trees {
		for _, l := range t.Limits() {
			if !money[l.Dimension] {
				l.Amount = "" // a whole count as written
			}
		}
	}
	return nil
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
		case "anthropic":
			cfg.Anthropic = true
		default:
			return d.Errf("headers: unknown family %q: use ietf, x_ratelimit, retry_after, openai, anthropic or none", fam)
		}
	}
	h.Headers = cfg
	return nil
}

// parseIdempotency reads `idempotency [{ header <name>; ttl <d>;
// in_flight <d>; retries <n>; methods <method...> }]`.
func parseIdempotency(d *caddyfile.Dispenser) (*IdempotencyConfig, error) {
	c := &IdempotencyConfig{}
	if d.NextArg() {
		return nil, d.Errf("idempotency takes no arguments: write its options in a block (header, ttl, in_flight)")
	}
	for n := d.Nesting(); d.NextBlock(n); {
		opt := d.Val()
		if !slices.Contains(idempotencyOptions, opt) {
			return nil, unknownOption(d, "idempotency", opt, idempotencyOptions)
		}
		switch opt {
		case "replay":
			if err := parseReplay(d, c); err != nil {
				return nil, err
			}
			continue
		case "replay_cookies":
			if d.NextArg() {
				return nil, d.Errf("idempotency replay_cookies takes no value")
			}
			c.ReplayCookies = true
			continue
		case "identity":
			c.Identity = d.RemainingArgs()
			if len(c.Identity) == 0 {
				return nil, d.Errf("idempotency identity needs the header fields that identify a caller, such as Authorization")
			}
			continue
		}
		if !d.NextArg() {
			return nil, d.Errf("idempotency %s needs a value", opt)
		}
		val := d.Val()
		if opt == "methods" {
			c.Methods = append([]string{val}, d.RemainingArgs()...)
			continue
		}
		if d.NextArg() {
			return nil, d.Errf("idempotency %s takes one value", opt)
		}
		switch opt {
		case "header":
			c.Header = val
		case "retries":
			n, err := strconv.Atoi(val)
			if err != nil || n < 0 {
				return nil, d.Errf("idempotency retries %q: give how many retries are admitted without a charge (0 or more)", val)
			}
			c.Retries = n
			if n == 0 {
				c.Retries = -1 // none (0 in JSON is the default)
			}
		case "ttl", "in_flight":
			dur, err := caddy.ParseDuration(val)
			if err != nil || dur <= 0 {
				return nil, d.Errf("idempotency %s %q: use a positive duration such as 24h", opt, val)
			}
			if opt == "ttl" {
				c.TTL = caddy.Duration(dur)
			} else {
				c.InFlight = caddy.Duration(dur)
			}
		default:
			return nil, unknownOption(d, "idempotency", opt, idempotencyOptions)
		}
	}
	return c, nil
}

// parseReplay reads `replay [max_body <size>]`.
func parseReplay(d *caddyfile.Dispenser, c *IdempotencyConfig) error {
	c.Replay = true
	args := d.RemainingArgs()
	switch {
	case len(args) == 0:
		return nil
	case len(args) != 2 || args[0] != "max_body":
		return d.Errf("idempotency replay %s: write `replay` alone or `replay max_body <size>` (such as 1MiB)", strings.Join(args, " "))
	}
	size, err := humanize.ParseBytes(args[1])
	if err != nil || size == 0 || size > maxReplayBody {
		return d.Errf("idempotency replay max_body %q: give a size from 1B to %s, such as 1MiB", args[1], humanize.IBytes(maxReplayBody))
	}
	c.MaxBody = int64(size)
	return nil
}

// parseRoute reads `route <tier> <value...> <store> [{ on_store_error deny|allow|local }]`.
func (h *Handler) parseRoute(d *caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 3 {
		return d.Err("usage: route <tier> <value...> <store>, e.g. route org acme bigco enterprise")
	}
	rt := &StoreRoute{Tier: args[0], Values: args[1 : len(args)-1], Store: args[len(args)-1]}
	for n := d.Nesting(); d.NextBlock(n); {
		switch d.Val() {
		case "on_store_error":
			if !d.NextArg() {
				return d.ArgErr()
			}
			rt.OnStoreError = d.Val()
			if d.NextArg() {
				return d.Errf("route on_store_error takes one value: deny, allow or local")
			}
		default:
			return unknownOption(d, "route", d.Val(), routeOptions)
		}
	}
	h.Routes = append(h.Routes, rt)
	return nil
}

// parseForwarded parses
//
//	forwarded {
//	    report              <path>      # where front ends report upstream responses (none)
//	    report_ttl          <duration>  # how long a decision waits for its report (10m)
//	    max_report_bytes    <size>      # 1MiB
//	    max_held            <n>         # decisions waiting for a report, in all (100000)
//	    max_held_per_tenant <n>         # of one tenant (a tenth of max_held)
//	    uri_header          <name>      # the one header with the original URI (X-Forwarded-Uri or X-Original-URI)
//	}
//
// The endpoint answers only the server's trusted proxies (the global
// option servers { trusted_proxies ... }); any other peer gets 403.
func (h *Handler) parseForwarded(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.Errf("forwarded takes a block or nothing, not %q", d.Val())
	}
	c := &ForwardedConfig{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch opt := d.Val(); opt {
		case "report":
			if !d.NextArg() {
				return d.Errf("report needs a path, e.g. report /report")
			}
			c.Report = d.Val()
			if !strings.HasPrefix(c.Report, "/") {
				return d.Errf("report %q: give a path starting with /, e.g. /report", c.Report)
			}
		case "report_ttl":
			if !d.NextArg() {
				return d.ArgErr()
			}
			dur, perr := caddy.ParseDuration(d.Val())
			if perr != nil || dur <= 0 {
				return d.Errf("report_ttl %q: give a positive duration, e.g. 10m", d.Val())
			}
			c.ReportTTL = caddy.Duration(dur)
		case "max_report_bytes":
			c.MaxReportBytes, err = caddyfileopt.Size(d)
		case "max_held", "max_held_per_tenant":
			var n int64
			if n, err = caddyfileopt.Int64(d); err == nil && (n <= 0 || n > 1<<30) {
				err = d.Errf("%s %d: give a positive count, e.g. %s 1000", opt, n, opt)
			}
			if err == nil && opt == "max_held" {
				c.MaxHeld = int(n)
			} else if err == nil {
				c.MaxHeldPerTenant = int(n)
			}
		case "uri_header":
			if !d.NextArg() {
				return d.Errf("uri_header needs a header name, e.g. uri_header X-Original-URI")
			}
			c.URIHeader = d.Val()
			if !isHeaderName(c.URIHeader) {
				return d.Errf("uri_header %q is not a header name: give one such as X-Original-URI", c.URIHeader)
			}
			if d.NextArg() {
				return d.Errf("uri_header takes one header name, not also %q: name the one your proxy sets", d.Val())
			}
		default:
			return unknownOption(d, "forwarded", opt, forwardedOptions)
		}
		if err != nil {
			return err
		}
	}
	if c.MaxHeld > 0 && c.MaxHeldPerTenant > c.MaxHeld {
		return d.Errf("max_held_per_tenant %d is more than max_held %d: give at most max_held", c.MaxHeldPerTenant, c.MaxHeld)
	}
	h.Forwarded = c
	return nil
}
