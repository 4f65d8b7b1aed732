// Package simulate replays access logs through rate limits: it reads
// logged requests (Caddy's JSON access log, the Common and Combined Log
// Formats, a JSONL form for other proxies; gzip or not), merges several
// files in time order, hands each request at its time to a Decider (the
// root's rate_limit handlers on a simulated clock), and reports what the
// limits would have done. It has no Caddy in it.
package simulate

import (
	"net/http"
	"time"
)

// Request is one logged request, as the simulation replays it.
type Request struct {
	// Time is when the request arrived: a Caddy log's timestamp (written
	// when the response ended) less its duration.
	Time time.Time
	// Seq numbers the requests in the order they are replayed, from 0.
	Seq int64

	Method, Host, URI, Proto string
	// RemoteIP and RemotePort are the connection's peer; ClientIP the
	// client's address as the server judged it (trusted proxies), when
	// logged.
	RemoteIP, RemotePort, ClientIP string
	TLS                            bool
	Header                         http.Header
	// Status and Size are the response's status and body bytes; RespHeader
	// its header, when logged.
	Status     int
	Size       int64
	RespHeader http.Header
	// BytesRead is the request body's size, -1 when not logged.
	BytesRead int64
	Duration  time.Duration

	// File and Line say where the request was read.
	File string
	Line int64

	size int // the bytes it holds, roughly, while read ahead
}

// Format names a log format.
type Format string

// The formats Read understands.
const (
	// Auto detects the format of each file from its first line.
	Auto Format = ""
	// Caddy is Caddy's JSON access log (the log directive's default).
	Caddy Format = "caddy"
	// Combined is the Common or Combined Log Format (Apache, nginx).
	Combined Format = "combined"
	// JSONL is one JSON object a line in the form documented in
	// docs/rollout.md, for other proxies.
	JSONL Format = "jsonl"
)

// ParseFormat reads a --format value.
func ParseFormat(s string) (Format, error) {
	switch Format(s) {
	case Auto, Caddy, Combined, JSONL:
		return Format(s), nil
	case "common", "clf":
		return Combined, nil
	}
	return "", &FormatError{Name: s}
}

// FormatError is a format name Read does not know.
type FormatError struct{ Name string }

func (e *FormatError) Error() string {
	return "log format " + e.Name + ": use caddy, combined (or common) or jsonl"
}
