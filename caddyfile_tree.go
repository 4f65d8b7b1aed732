package cascade

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/internal/caddyfileopt"
	"github.com/caddy-cascade/cascade/rate"
)

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
	start := at(d)
	if d.NextArg() {
		return d.Errf("tree %s: unexpected argument %q; tiers go in the block", t.Name, d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "plan":
			if err := parsePlanKey(d, &t.Tree); err != nil {
				return err
			}
		case "strict_allocation":
			if d.NextArg() {
				return d.Errf("tree %s: strict_allocation takes no argument (got %q)", t.Name, d.Val())
			}
			t.StrictAllocation = true
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
			return unknownOption(d, "tree "+t.Name, d.Val(), treeOptions)
		}
	}
	if len(t.Tiers) == 0 {
		return d.Errf("tree %s has no tiers: add tier <name> <key> { limit ... }", t.Name)
	}
	if t.PlanKey == "" {
		for _, tier := range t.Tiers {
			if len(tier.Plans) > 0 {
				return start.errorf("tree %s: tier %s has plan blocks, but the tree does not say where a request's plan comes from: add plan <placeholder> default <plan> to the tree", t.Name, tier.Name)
			}
		}
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
			v, err := caddyfileopt.OneOf(d, "deny", "shared", "skip")
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
		case "plan":
			if err := h.parsePlan(d, tree, tier); err != nil {
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
			return nil, unknownOption(d, "tier "+tier.Name, d.Val(), tierOptions)
		}
	}
	if tier.Key == "" {
		return nil, start.errorf("tier %s has no key: write tier %s {header.X-%s}, or key <placeholder> in its block", tier.Name, tier.Name, tier.Name)
	}
	if len(tier.Limits) == 0 && len(tier.Values) == 0 && len(tier.Plans) == 0 {
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
			return unknownOption(d, "value "+vals[0], d.Val(), valueOptions)
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

// parsePlanKey parses a tree's `plan <placeholder> default <plan>`: where
// a request's plan comes from, and the plan of a request whose plan is
// empty or that no tier lists. The placeholder's shorthands
// ({header.X-Plan}) are expanded by Caddy's adapter, as tier keys' are.
func parsePlanKey(d *caddyfile.Dispenser, t *hierarchy.Tree) error {
	const usage = "plan <placeholder> default <plan>, e.g. plan {http.rate_limit.entitlement.customers.plan} default free"
	if t.PlanKey != "" {
		return d.Errf("tree %s: plan given twice: write one line, %s", t.Name, usage)
	}
	args := d.RemainingArgs()
	if d.NextBlock(d.Nesting()) || len(args) == 2 && args[1] == "unlimited" {
		return d.Errf("tree %s: a plan's limits belong to a tier: tier <name> <key> { plan <name> { limit ... } }; the tree's plan line says where a request's plan comes from: %s", t.Name, usage)
	}
	switch {
	case len(args) == 1:
		return d.Errf("tree %s: plan needs a default: plan %s default <plan> (the plan of a request whose plan is empty or that no tier lists)", t.Name, args[0])
	case len(args) != 3 || args[1] != "default":
		return d.Errf("tree %s: usage: %s", t.Name, usage)
	case !strings.Contains(args[0], "{"):
		return d.Errf("tree %s: plan %q is a constant: take a request's plan from a placeholder, e.g. %s", t.Name, args[0], usage)
	}
	t.PlanKey, t.DefaultPlan = args[0], args[2]
	return nil
}

// parsePlan parses a tier's `plan <name> { limit ... }` or `plan <name>
// unlimited`: its limits for the requests of that plan.
func (h *Handler) parsePlan(d *caddyfile.Dispenser, tree string, tier *hierarchy.Tier) error {
	args := d.RemainingArgs()
	unlimited := len(args) == 2 && args[1] == "unlimited"
	switch {
	case len(args) == 3 && args[1] == "default":
		return d.Errf("tier %s: plan %s default %s belongs to the tree: tree %s { plan %s default %s ... }", tier.Name, args[0], args[2], tree, args[0], args[2])
	case len(args) == 0 || len(args) > 2 || len(args) == 2 && !unlimited:
		return d.Errf("tier %s: usage: plan <name> { limit ... } or plan <name> unlimited, one plan a line", tier.Name)
	}
	name := args[0]
	if _, dup := tier.Plans[name]; dup {
		return d.Errf("tier %s: plan %s given twice: give each plan one block", tier.Name, name)
	}
	o := &hierarchy.Override{Unlimited: unlimited}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if d.Val() != "limit" {
			return unknownOption(d, "plan "+name, d.Val(), planOptions)
		}
		l, err := h.parseLimitOf(d, tree)
		if err != nil {
			return err
		}
		o.Limits = append(o.Limits, l)
	}
	if !unlimited && len(o.Limits) == 0 {
		return d.Errf("tier %s: plan %s has no limits: add limit lines in its block, or write plan %s unlimited", tier.Name, name, name)
	}
	if unlimited && len(o.Limits) > 0 {
		return d.Errf("tier %s: plan %s: unlimited and limits are exclusive", tier.Name, name)
	}
	if tier.Plans == nil {
		tier.Plans = map[string]*hierarchy.Override{}
	}
	tier.Plans[name] = o
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
	if strings.Contains(l.Amount, ".") {
		h.decimals = append(h.decimals, countedAt{tree: tree, pos: pos, dim: l.Dimension, amount: l.Amount})
	}
	if _, seen := h.counted[l.Dimension]; !seen {
		h.counted[l.Dimension] = countedAt{tree: tree, pos: pos}
	}
	return l, nil
}

// countedAt is where a tree counts a dimension (for a decimal count, the
// amount).
type countedAt struct {
	tree   string
	pos    position
	dim    string
	amount string
}

// parseLimit parses `limit <count>[ <dimension>]/<per> [burst <n>] [algorithm] [tz <zone>]`
// or `limit <count> concurrent`.
func parseLimit(d *caddyfile.Dispenser) (*hierarchy.Limit, error) {
	const usage = "usage: limit <count>/<per> or limit <count> <dimension>/<per>, then optionally burst <n>, gcra|sliding|sliding approx|calendar|fixed, tz <zone>, alert <n>%...; or limit <count> concurrent; e.g. limit 1000/h or limit 100000 tokens/h burst 5000 or limit 10 concurrent"
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
	countStr = strings.ReplaceAll(countStr, "_", "")
	n, err := strconv.ParseInt(countStr, 10, 64)
	if strings.Contains(countStr, ".") && l.Dimension != "" {
		// A decimal amount of money ("0.50 usd/h"): only a money dimension
		// takes one, which is known once the costs are read (checkMoney).
		if n, err = cost.ParseAmount(countStr); err == nil && n == 0 {
			err = errors.New("zero")
		}
	}
	if err != nil || n <= 0 {
		return nil, d.Errf("limit: count %q must be a positive whole number (or, for money, a decimal amount such as 0.50)", countStr)
	}
	l.Count, l.Per = n, per
	if l.Dimension != "" && l.Dimension != hierarchy.Requests {
		l.Amount = countStr // kept for a money dimension only (checkMoney)
	}
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
		case "alert":
			rest = rest[1:]
			for len(rest) > 0 && strings.HasSuffix(rest[0], "%") {
				n, err := strconv.Atoi(strings.TrimSuffix(rest[0], "%"))
				if err != nil {
					return nil, d.Errf("limit: alert %q: a threshold is a percentage such as 80%%", rest[0])
				}
				l.Alerts, rest = append(l.Alerts, n), rest[1:]
			}
			if len(l.Alerts) == 0 {
				return nil, d.Errf("limit: alert needs thresholds, e.g. alert 50%% 80%% 100%%")
			}
		case "tz":
			if len(rest) < 2 {
				return nil, d.Errf("limit: tz needs a time zone name such as Europe/Paris")
			}
			l.Timezone, rest = rest[1], rest[2:]
		case "gcra", "sliding", "calendar", hierarchy.Fixed, string(rate.SlidingApprox):
			if l.Algorithm != "" {
				return nil, d.Errf("limit: %s after %s: give one algorithm", w, strings.ReplaceAll(l.Algorithm, "_", " "))
			}
			l.Algorithm, rest = w, rest[1:]
			if w == "sliding" && len(rest) > 0 && rest[0] == "approx" {
				l.Algorithm, rest = string(rate.SlidingApprox), rest[1:]
			}
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
			n, err := caddyfileopt.Int(d)
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
			n, err := caddyfileopt.Int(d)
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
			return unknownOption(d, "zone "+name, d.Val(), zoneOptions)
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
