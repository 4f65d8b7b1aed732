package cascade

import (
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-cascade/cascade/cost"
	"github.com/caddy-cascade/cascade/internal/caddyfileopt"
)

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
		if opt == "charged_header" {
			if d.NextArg() {
				return d.Errf("charged_header takes no argument, got %q", d.Val())
			}
			c.ChargedHeader = true
			continue
		}
		var err error
		switch {
		case c.LLM != nil && (opt == "price" || opt == "default"):
			err = parsePrice(d, c)
		case c.LLM != nil:
			err = parseLLMOption(d, c.LLM)
		case c.GraphQL != nil:
			err = parseGraphQLOption(d, c.GraphQL)
		default:
			err = unknownOption(d, "cost "+c.Dimension, opt, costOptions)
		}
		if err != nil {
			return err
		}
	}
	h.Costs = append(h.Costs, c)
	return nil
}

// parsePrice parses `price <model> input <x> output <y> [cached_input <z>]`
// or `default input <x> output <y> [cached_input <z>]`: a model's price per
// million tokens, which makes c's dimension money.
func parsePrice(d *caddyfile.Dispenser, c *Cost) error {
	const usage = "usage: price <model or pattern> input <per 1M tokens> output <per 1M tokens> [cached_input <per 1M tokens>] [cache_write <per 1M tokens>], or default input … output …; e.g. price gpt-4o* input 2.50 output 10"
	isDefault := d.Val() == "default"
	args := d.RemainingArgs()
	var p cost.ModelPrice
	if !isDefault {
		if len(args) == 0 {
			return d.Errf("%s", usage)
		}
		p.Model, args = args[0], args[1:]
	}
	for len(args) > 0 {
		if len(args) < 2 {
			return d.Errf("price %s: %s needs an amount; %s", p.Model, args[0], usage)
		}
		var dst *string
		switch args[0] {
		case "input":
			dst = &p.Input
		case "output":
			dst = &p.Output
		case "cached_input":
			dst = &p.CachedInput
		case "cache_write":
			dst = &p.CacheWrite
		default:
			return d.Errf("price %s: unexpected %q; %s", p.Model, args[0], usage)
		}
		if _, err := cost.ParseAmount(args[1]); err != nil {
			return d.Errf("price %s: %s: %v", p.Model, args[0], err)
		}
		*dst, args = args[1], args[2:]
	}
	if p.Input == "" || p.Output == "" {
		return d.Errf("price %s: give both input and output prices; %s", p.Model, usage)
	}
	check := cost.Pricing{Default: &p}
	if !isDefault {
		check = cost.Pricing{Prices: []cost.ModelPrice{p}}
	}
	if err := check.Provision(); err != nil {
		return d.Errf("cost %s: %v", c.Dimension, err)
	}
	if c.Pricing == nil {
		c.Pricing = &cost.Pricing{}
	}
	if isDefault {
		if c.Pricing.Default != nil {
			return d.Errf("cost %s: default price given twice", c.Dimension)
		}
		c.Pricing.Default = &p
		return nil
	}
	if slices.ContainsFunc(c.Pricing.Prices, func(q cost.ModelPrice) bool { return q.Model == p.Model }) {
		return d.Errf("cost %s: price %s given twice", c.Dimension, p.Model)
	}
	c.Pricing.Prices = append(c.Pricing.Prices, p)
	return nil
}

func parseLLMOption(d *caddyfile.Dispenser, l *cost.LLM) error {
	var err error
	switch opt := d.Val(); opt {
	case "provider":
		l.Provider, err = caddyfileopt.OneOf(d, "auto", "openai", "anthropic")
	case "chars_per_token":
		var f float64
		if f, err = caddyfileopt.Float(d); err == nil {
			l.CharsPerToken = f
		}
	case "default_max_tokens":
		l.DefaultMaxTokens, err = caddyfileopt.Int64(d)
	case "image_tokens":
		l.ImageTokens, err = caddyfileopt.Int64(d)
	case "max_body_bytes":
		l.MaxBodyBytes, err = caddyfileopt.Size(d)
	case "on_malformed":
		l.OnMalformed, err = caddyfileopt.OneOf(d, "reject", "default")
	case "default_cost":
		l.DefaultCost, err = caddyfileopt.Int64(d)
	default:
		return unknownOption(d, "cost llm", opt, llmOptions)
	}
	return err
}

func parseGraphQLOption(d *caddyfile.Dispenser, g *cost.GraphQL) error {
	var err error
	intOpt := map[string]*int{"max_tokens": &g.MaxTokens, "max_depth": &g.MaxDepth, "max_aliases": &g.MaxAliases,
		"max_directives": &g.MaxDirectives, "max_batch": &g.MaxBatch}
	switch opt := d.Val(); opt {
	case "model":
		g.Model, err = caddyfileopt.OneOf(d, "fields", "github")
	case "default_list_size":
		g.DefaultListSize, err = caddyfileopt.Int64(d)
	case "slicing_arguments":
		g.SlicingArguments = d.RemainingArgs()
		if len(g.SlicingArguments) == 0 {
			return d.Errf("slicing_arguments needs argument names, e.g. first last")
		}
	case "max_body_bytes":
		g.MaxBodyBytes, err = caddyfileopt.Size(d)
	case "max_cost":
		g.MaxCost, err = caddyfileopt.Int64(d)
	case "schema":
		var file string
		if err = caddyfileopt.Str(d, &file); err == nil {
			g.Schema = "@" + file
		}
	case "on_malformed":
		g.OnMalformed, err = caddyfileopt.OneOf(d, "reject", "default")
	case "default_cost":
		g.DefaultCost, err = caddyfileopt.Int64(d)
	case "list_fields":
		g.ListFields = d.RemainingArgs()
		if len(g.ListFields) == 0 {
			return d.Errf("list_fields needs glob patterns of field names, e.g. list_fields *s all* *Connection")
		}
		if err := (&cost.GraphQL{ListFields: g.ListFields}).Validate(); err != nil {
			return d.Errf("%v", err)
		}
	case "depth_factor":
		if !d.NextArg() {
			return d.Errf("depth_factor needs a number of at least 1, such as 1.5")
		}
		f, perr := strconv.ParseFloat(d.Val(), 64)
		if perr != nil {
			return d.Errf("depth_factor %q: use a number of at least 1, such as 1.5", d.Val())
		}
		if verr := (&cost.GraphQL{DepthFactor: f}).Validate(); verr != nil {
			return d.Errf("%v", verr)
		}
		g.DepthFactor = f
	case "mutation":
		g.Mutation, err = caddyfileopt.Int64(d)
	case "subscription":
		g.Subscription, err = caddyfileopt.Int64(d)
	case "extensions_cost":
		if d.NextArg() {
			return d.Errf("extensions_cost takes no argument, got %q", d.Val())
		}
		g.ExtensionsCost = true
	default:
		p, ok := intOpt[opt]
		if !ok {
			return unknownOption(d, "cost graphql", opt, graphqlOptions)
		}
		*p, err = caddyfileopt.Int(d)
	}
	return err
}

func parseReconcile(d *caddyfile.Dispenser) (*Reconcile, error) {
	r := &Reconcile{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch opt := d.Val(); opt {
		case "provider":
			r.Provider, err = caddyfileopt.OneOf(d, "auto", "openai", "anthropic", "graphql")
		case "format":
			r.Format, err = caddyfileopt.OneOf(d, "auto", "json", "sse")
		case "header":
			err = caddyfileopt.Str(d, &r.Header)
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
			return nil, unknownOption(d, "reconcile", opt, reconcileOptions)
		}
		if err != nil {
			return nil, err
		}
	}
	return r, nil
}
