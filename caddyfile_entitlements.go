package cascade

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-cascade/cascade/internal/caddyfileopt"
)

// parseEntitlements reads
//
//	entitlements <name> {
//		source file <path.json> | redis <key template> [store <name>] | http <url template>
//		key          <tier>
//		ttl          <duration>
//		negative_ttl <duration>
//		stale        <duration>
//		timeout      <duration>
//		header       <field> <value>     # sent to an http source
//	}
func (h *Handler) parseEntitlements(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("usage: entitlements <name> { source file|redis|http <where>; key <tier> }")
	}
	c := &EntitlementsConfig{Name: d.Val()}
	if d.NextArg() {
		return d.Errf("entitlements %s: unexpected argument %q; its options go in the block", c.Name, d.Val())
	}
	for _, other := range h.Entitlements {
		if other.Name == c.Name {
			return d.Errf("entitlements %s defined twice: give each its own name", c.Name)
		}
	}
	for n := d.Nesting(); d.NextBlock(n); {
		var err error
		switch opt := d.Val(); opt {
		case "source":
			args := d.RemainingArgs()
			if len(args) == 4 && args[0] == "redis" && args[2] == "store" {
				c.Source.RedisStore, args = args[3], args[:2]
			}
			if len(args) != 2 {
				return d.Errf("entitlements %s: usage: source file <path.json> | source redis <key template> [store <name>] | source http <url template>", c.Name)
			}
			if c.Source.File != "" || c.Source.Redis != "" || c.Source.HTTP != "" {
				return d.Errf("entitlements %s: give one source: a second source line (another entitlements block, with a name of its own, reads another source)", c.Name)
			}
			switch args[0] {
			case "file":
				c.Source.File = args[1]
			case "redis":
				c.Source.Redis = args[1]
			case "http":
				c.Source.HTTP = args[1]
			default:
				return d.Errf("entitlements %s: source %q: use file, redis or http", c.Name, args[0])
			}
		case "key":
			err = caddyfileopt.Str(d, &c.Key)
		case "ttl", "negative_ttl", "stale", "timeout":
			var dur time.Duration
			if dur, err = caddyfileopt.Duration(d, 0); err != nil {
				return err
			}
			switch opt {
			case "ttl":
				c.TTL = caddy.Duration(dur)
			case "negative_ttl":
				c.NegativeTTL = caddy.Duration(dur)
			case "stale":
				c.Stale = caddy.Duration(dur)
			default:
				c.Timeout = caddy.Duration(dur)
			}
		case "header":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return d.Errf(`entitlements %s: usage: header <field> <value>, e.g. header Authorization "Bearer {env.BILLING_TOKEN}"`, c.Name)
			}
			if c.Source.Header == nil {
				c.Source.Header = map[string]string{}
			}
			c.Source.Header[args[0]] = args[1]
		default:
			return unknownOption(d, "entitlements "+c.Name, opt, entitlementsOptions)
		}
		if err != nil {
			return err
		}
	}
	if err := c.check(); err != nil {
		return d.Errf("%v", err)
	}
	h.Entitlements = append(h.Entitlements, c)
	return nil
}
