package cascade

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-cascade/cascade/engine"
)

// IdempotencyConfig keeps a client's retries of one operation from being
// charged again: the first request with an idempotency key is charged as
// usual and recorded in the same store step; a retry with the same key on
// the same path (the same tree values: the same identity) within TTL,
// once the first has ended, is admitted without a charge; a duplicate
// that arrives while the first is still in flight is refused with 409 and
// charged nothing. A refused request records nothing, so its retry is
// decided afresh.
type IdempotencyConfig struct {
	// Header carries the key; default Idempotency-Key (the IETF draft's).
	// Its value is the key as sent (a quoted structured-field string has
	// its quotes removed), 1 to MaxIdempotencyKey bytes; the store keeps
	// only a hash of it with the path.
	Header string `json:"header,omitempty"`
	// TTL is how long a record is kept; default 24h.
	TTL caddy.Duration `json:"ttl,omitempty"`
	// InFlight is the longest a first request counts as in flight, should
	// the instance deciding it never say it ended (it crashed); default
	// 5m. A request that runs longer is retried without a charge after it.
	InFlight caddy.Duration `json:"in_flight,omitempty"`
}

// MaxIdempotencyKey is the longest idempotency key accepted (bytes).
const MaxIdempotencyKey = 255

// Defaults of IdempotencyConfig.
const (
	defaultIdempotencyHeader   = "Idempotency-Key"
	defaultIdempotencyTTL      = 24 * time.Hour
	defaultIdempotencyInFlight = 5 * time.Minute
)

// provision fills the defaults in and checks the rest.
func (c *IdempotencyConfig) provision() error {
	if c.Header == "" {
		c.Header = defaultIdempotencyHeader
	}
	c.Header = http.CanonicalHeaderKey(c.Header)
	if c.TTL == 0 {
		c.TTL = caddy.Duration(defaultIdempotencyTTL)
	}
	if c.InFlight == 0 {
		c.InFlight = caddy.Duration(defaultIdempotencyInFlight)
	}
	if c.TTL < 0 || c.InFlight < 0 {
		return fmt.Errorf("idempotency: ttl %v, in_flight %v: use positive durations", time.Duration(c.TTL), time.Duration(c.InFlight))
	}
	if c.InFlight > c.TTL {
		return fmt.Errorf("idempotency: in_flight %v is longer than ttl %v: a record must outlive its request", time.Duration(c.InFlight), time.Duration(c.TTL))
	}
	return nil
}

// engineConfig is c as the engine takes it.
func (c *IdempotencyConfig) engineConfig() engine.Idempotency {
	if c == nil {
		return engine.Idempotency{}
	}
	return engine.Idempotency{TTL: time.Duration(c.TTL), InFlight: time.Duration(c.InFlight)}
}

// errIdempotencyKey refuses a key that cannot be one.
var errIdempotencyKey = fmt.Errorf("the idempotency key must be 1 to %d bytes of visible characters", MaxIdempotencyKey)

// key returns r's idempotency key ("" for none), or an error for a key
// that cannot be one (too long, control characters).
func (c *IdempotencyConfig) key(r *http.Request) (string, error) {
	vals := r.Header[c.Header]
	if len(vals) == 0 {
		return "", nil
	}
	if len(vals) > 1 {
		return "", errors.New("the idempotency key is given more than once")
	}
	k := strings.TrimSpace(vals[0])
	if len(k) >= 2 && k[0] == '"' && k[len(k)-1] == '"' {
		k = k[1 : len(k)-1] // a structured-field string
	}
	if k == "" || len(k) > MaxIdempotencyKey {
		return "", errIdempotencyKey
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] == 0x7f {
			return "", errIdempotencyKey
		}
	}
	return k, nil
}

// parseIdempotency reads `idempotency [{ header <name>; ttl <d>; in_flight <d> }]`.
func parseIdempotency(d *caddyfile.Dispenser) (*IdempotencyConfig, error) {
	c := &IdempotencyConfig{}
	if d.NextArg() {
		return nil, d.Errf("idempotency takes no arguments: write its options in a block (header, ttl, in_flight)")
	}
	for n := d.Nesting(); d.NextBlock(n); {
		opt := d.Val()
		if !d.NextArg() {
			return nil, d.Errf("idempotency %s needs a value", opt)
		}
		val := d.Val()
		if d.NextArg() {
			return nil, d.Errf("idempotency %s takes one value", opt)
		}
		switch opt {
		case "header":
			c.Header = val
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
			return nil, d.Errf("idempotency: unknown option %q: expected header, ttl or in_flight", opt)
		}
	}
	return c, nil
}

// refuseInFlight answers a duplicate of a request still in flight.
func (h *Handler) refuseInFlight(w http.ResponseWriter, d *decision) error {
	retry := engine.CeilSeconds(d.Retry)
	w.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
	return h.problem(w, http.StatusConflict, "idempotency_in_flight", "Conflict",
		"a request with this idempotency key is still in flight; retry once it has completed", d)
}
