package cascade

import (
	"crypto/sha256"
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
	// refused). With Replay, it is how many times a kept response is
	// answered without a charge (default 10); after that a retry is
	// charged as any request, and answered from the store when admitted.
	Retries int `json:"retries,omitempty"`
	// Methods are the methods whose requests' keys count (default POST
	// and PATCH: the others are idempotent by definition).
	Methods []string `json:"methods,omitempty"`
	// Replay keeps the first request's response (status, headers, body)
	// with its record for TTL, and answers a retry with it, marked
	// Idempotent-Replayed: true: the upstream runs once. A retry whose
	// body is not the first's is refused (422); one whose first response
	// could not be kept (larger than MaxBody, a stream) is refused (409),
	// never passed; after a server error (5xx) a retry is a new attempt.
	// See docs/shaping.md.
	Replay bool `json:"replay,omitempty"`
	// MaxBody is the largest response body kept for replay (bytes;
	// default 1 MiB, at most 64 MiB).
	MaxBody int64 `json:"max_body,omitempty"`
	// Identity are the request header fields that, with the tree's
	// values, identify the caller whose response is kept: a retry is
	// answered with it only if it bears the same values (the store keeps
	// a hash of them). Default: Authorization, Proxy-Authorization,
	// Cookie and X-Api-Key; a TLS client certificate always counts. With
	// Replay only.
	Identity []string `json:"identity,omitempty"`
	// ReplayCookies keeps the response's Set-Cookie fields for replay too
	// (by default they are not kept: a session set for one client is not
	// handed to whoever retries).
	ReplayCookies bool `json:"replay_cookies,omitempty"`
}

// MaxIdempotencyKey is the longest idempotency key accepted (bytes).
const MaxIdempotencyKey = 255

// Defaults of IdempotencyConfig.
const (
	defaultIdempotencyHeader   = "Idempotency-Key"
	defaultIdempotencyTTL      = 24 * time.Hour
	defaultIdempotencyInFlight = 5 * time.Minute
	defaultIdempotencyRetries  = 1
	defaultFreeReplays         = 10
	defaultReplayBody          = 1 << 20
	maxReplayBody              = 64 << 20
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
		if c.Replay {
			c.Retries = defaultFreeReplays
		}
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
	if c.MaxBody < 0 || c.MaxBody > maxReplayBody {
		return fmt.Errorf("idempotency: max_body %d: give a size from 1 byte to 64 MiB", c.MaxBody)
	}
	if c.Replay && c.MaxBody == 0 {
		c.MaxBody = defaultReplayBody
	}
	if !c.Replay && (c.MaxBody != 0 || c.ReplayCookies || len(c.Identity) > 0) {
		return errors.New("idempotency: max_body, replay_cookies and identity apply to replay: add `replay` to the idempotency block")
	}
	if c.Replay && len(c.Identity) == 0 {
		c.Identity = []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key"}
	}
	for i, f := range c.Identity {
		if f == "" || strings.ContainsAny(f, " \t:\r\n") {
			return fmt.Errorf("idempotency: identity %q is not a header field name", f)
		}
		c.Identity[i] = http.CanonicalHeaderKey(f)
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
	return engine.Idempotency{TTL: time.Duration(c.TTL), InFlight: time.Duration(c.InFlight), Retries: max(c.Retries, 0), Replay: c.Replay}
}

// errIdempotencyKey refuses a key that cannot be one.
var errIdempotencyKey = fmt.Errorf("the idempotency key must be 1 to %d bytes of visible characters", MaxIdempotencyKey)

// key returns what identifies r's operation with its idempotency key —
// its method, request target and key, and under replay the caller's
// Identity fields and client certificate — ("" for none: no key, or a method
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
	op := r.Method + " " + r.URL.RequestURI() + "\n" + k
	if c.Replay {
		// A response is kept for its caller alone: whatever the tree's
		// tiers identify, a retry must also bear the first's credentials
		// (the store keeps only a hash of them, with the key).
		var b strings.Builder
		b.WriteString(op)
		for _, f := range c.Identity {
			b.WriteString("\n")
			b.WriteString(f)
			for i, v := range r.Header[f] {
				if i > 0 {
					b.WriteByte(0)
				}
				b.WriteString(":")
				b.WriteString(v)
			}
		}
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			sum := sha256.Sum256(r.TLS.PeerCertificates[0].Raw)
			b.WriteString("\ncertificate:")
			b.Write(sum[:])
		}
		op = b.String()
	}
	return op, nil
}

// refuseInFlight answers a duplicate of a request still in flight.
func (h *Handler) refuseInFlight(w http.ResponseWriter, r *http.Request, d *decision) error {
	retry := engine.CeilSeconds(d.Retry)
	w.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
	return h.problem(w, r, http.StatusConflict, "idempotency_in_flight", "Conflict",
		"a request with this idempotency key is still in flight; retry once it has completed", d)
}
