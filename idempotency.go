package cascade

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/engine"
)

// IdempotencyConfig keeps a client's retries of one operation from being
// charged again: the first request with an idempotency key is charged as
// usual and recorded in the same store step; a retry — the same key, method
// and request target on the same path (the same tree values: the same
// identity) — within TTL, once the first has ended, is admitted without a
// charge, Retries times at most; a duplicate that arrives while the first
// is still in flight is refused with 409 and charged nothing. A refused
// request records nothing, so its retry is decided afresh. Only requests
// of Methods carry keys (the others are idempotent by their method).
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
	// Retries is how many retries of a request are admitted without a
	// charge (default 1); the next is charged as a new request. A gateway
	// cannot tell a retry from another request that reuses its key and
	// target: this bounds what reusing one gets. A retry admitted free
	// still pays what its response reports it used (reconciled costs).
	// A negative value lets none through (a duplicate in flight is still
	// refused).
	Retries int `json:"retries,omitempty"`
	// Methods are the methods whose requests' keys count (default POST
	// and PATCH: the others are idempotent by definition).
	Methods []string `json:"methods,omitempty"`
}

// MaxIdempotencyKey is the longest idempotency key accepted (bytes).
const MaxIdempotencyKey = 255

// Defaults of IdempotencyConfig.
const (
	defaultIdempotencyHeader   = "Idempotency-Key"
	defaultIdempotencyTTL      = 24 * time.Hour
	defaultIdempotencyInFlight = 5 * time.Minute
	defaultIdempotencyRetries  = 1
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
	if c.Retries == 0 {
		c.Retries = defaultIdempotencyRetries
	}
	if len(c.Methods) == 0 {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	for i, m := range c.Methods {
		c.Methods[i] = strings.ToUpper(m)
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
	return engine.Idempotency{TTL: time.Duration(c.TTL), InFlight: time.Duration(c.InFlight), Retries: max(c.Retries, 0)}
}

// errIdempotencyKey refuses a key that cannot be one.
var errIdempotencyKey = fmt.Errorf("the idempotency key must be 1 to %d bytes of visible characters", MaxIdempotencyKey)

// key returns what identifies r's operation with its idempotency key —
// its method, request target and key — ("" for none: no key, or a method
// that needs none), or an error for a key that cannot be one (too long,
// control characters, given twice).
func (c *IdempotencyConfig) key(r *http.Request) (string, error) {
	vals := r.Header[c.Header]
	if len(vals) == 0 || !slices.Contains(c.Methods, r.Method) {
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
	return r.Method + " " + r.URL.RequestURI() + "\n" + k, nil
}

// refuseInFlight answers a duplicate of a request still in flight.
func (h *Handler) refuseInFlight(w http.ResponseWriter, r *http.Request, d *decision) error {
	retry := engine.CeilSeconds(d.Retry)
	w.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
	return h.problem(w, r, http.StatusConflict, "idempotency_in_flight", "Conflict",
		"a request with this idempotency key is still in flight; retry once it has completed", d)
}
