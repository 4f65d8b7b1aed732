package cost

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Estimator computes a request's cost before it goes upstream.
//
// Implementations are configured once (Provision) and then used from many
// goroutines at once: Estimate must not modify the estimator.
type Estimator interface {
	// Estimate returns the request's cost in this estimator's unit. Errors
	// that are the client's fault are *InputError.
	Estimate(req *Request) (int64, error)
	// NeedsBody reports whether Estimate reads req.Body (so the caller peeks
	// only when needed).
	NeedsBody() bool
}

// BodyLimiter is implemented by estimators that read bodies and know how many
// bytes they want to see. A caller with several estimators peeks once, at
// the largest limit among them (see [BodyLimit]).
type BodyLimiter interface {
	// BodyLimit returns the number of body bytes the estimator reads; a
	// longer body is answered with 413.
	BodyLimit() int64
}

// BodyLimit returns the number of body bytes to peek for e: its own limit if
// it has one, else fallback; 0 when e does not read bodies.
func BodyLimit(e Estimator, fallback int64) int64 {
	if e == nil || !e.NeedsBody() {
		return 0
	}
	if l, ok := e.(BodyLimiter); ok && l.BodyLimit() > 0 {
		return l.BodyLimit()
	}
	return fallback
}

// Constant charges the same cost for every request.
type Constant struct {
	// N is the cost of each request.
	N int64 `json:"n,omitempty"`
}

// Validate rejects a negative cost.
func (c Constant) Validate() error {
	if c.N < 0 {
		return fmt.Errorf("constant cost must not be negative, got %d", c.N)
	}
	return nil
}

// Estimate returns N.
func (c Constant) Estimate(*Request) (int64, error) { return c.N, nil }

// NeedsBody returns false.
func (Constant) NeedsBody() bool { return false }

// BodySize charges the size of the request body in bytes.
//
// The size is the Content-Length when the client sent one (the body is then
// not inspected, and the server enforces that the body is exactly that long).
// Without a Content-Length (a chunked or HTTP/2 streamed body) it is the
// length of the peeked body; a body longer than the peek bound cannot be
// measured without buffering it, so it is refused with 413 rather than
// charged less than its size.
type BodySize struct{}

// Estimate returns the body's size in bytes.
func (BodySize) Estimate(req *Request) (int64, error) {
	if req.HTTP != nil && req.HTTP.ContentLength >= 0 {
		return req.HTTP.ContentLength, nil
	}
	if req.Truncated {
		return 0, &InputError{
			Status: http.StatusRequestEntityTooLarge,
			Type:   TypeBodyTooLarge,
			Title:  "Request body too large to measure",
			Detail: fmt.Sprintf("a body without Content-Length is measured by reading it, and this one is longer than the %d bytes read; send Content-Length", len(req.Body)),
		}
	}
	return int64(len(req.Body)), nil
}

// NeedsBody returns true: a body without Content-Length is measured by
// reading it.
func (BodySize) NeedsBody() bool { return true }

// Header charges the integer value of a request header. It is meant for
// trusted callers (an internal service that knows its cost), never for
// clients who could lie.
type Header struct {
	// Name is the request header carrying the cost.
	Name string `json:"name,omitempty"`
	// Default is charged when the header is absent. When it is 0 or less,
	// an absent header is a 400 instead: no free pass by omission.
	Default int64 `json:"default,omitempty"`
}

// Validate checks that a header name is set.
func (h Header) Validate() error {
	if strings.TrimSpace(h.Name) == "" {
		return fmt.Errorf("header estimator: name is required")
	}
	return nil
}

// Estimate returns the header's value. A value that is not a non-negative
// integer is a 400.
func (h Header) Estimate(req *Request) (int64, error) {
	var v string
	if req.HTTP != nil {
		v = strings.TrimSpace(req.HTTP.Header.Get(h.Name))
	}
	if v == "" {
		if h.Default > 0 {
			return h.Default, nil
		}
		return 0, inputErr(TypeMissingHeader, "Missing cost header", "the request must carry the %s header", h.Name)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, inputErr(TypeInvalidHeader, "Invalid cost header", "%s must be a non-negative integer, got %q", h.Name, v)
	}
	return n, nil
}

// NeedsBody returns false.
func (Header) NeedsBody() bool { return false }

// Malformed input policies shared by LLM and GraphQL.
const (
	// OnMalformedReject answers malformed input with a 400 problem.
	OnMalformedReject = "reject"
	// OnMalformedDefault charges DefaultCost for malformed input and lets
	// the upstream answer it.
	OnMalformedDefault = "default"
)

func validateOnMalformed(policy string, defaultCost int64) error {
	switch policy {
	case OnMalformedReject:
	case OnMalformedDefault:
		if defaultCost <= 0 {
			return fmt.Errorf(`on_malformed "default" needs a positive default_cost (malformed input must never pass free)`)
		}
	default:
		return fmt.Errorf(`on_malformed must be "reject" or "default", got %q`, policy)
	}
	if defaultCost < 0 {
		return fmt.Errorf("default_cost must not be negative, got %d", defaultCost)
	}
	return nil
}
