package cost

import (
	"compress/gzip"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// Formats of [TapConfig].
const (
	FormatAuto = "auto"
	FormatJSON = "json"
	FormatSSE  = "sse"
)

// DefaultMaxDecodedBytes bounds how much of a gzip-encoded response the tap
// decompresses for its side parser.
const DefaultMaxDecodedBytes = 64 << 20

// TapConfig says where a [Tap] finds the upstream's usage report.
type TapConfig struct {
	// Header names a response header (or trailer) carrying the actual cost
	// as a number. When set, the body is not parsed.
	Header string `json:"header,omitempty"`
	// Format is "auto" (default: text/event-stream is SSE, anything else
	// JSON), "json" or "sse". JSON bodies may hold several concatenated
	// documents (NDJSON); the last report wins.
	Format string `json:"format,omitempty"`
	// Provider restricts which reports count: "openai" (usage with
	// prompt/completion or input/output tokens, at the top level or under
	// response, cached tokens from its details), "anthropic" (usage at the
	// top level or under message, cache tokens included), "graphql"
	// (extensions.cost) or "auto" (default: all of them).
	Provider string `json:"provider,omitempty"`
	// MaxDecodedBytes bounds the decompressed bytes of a gzip-encoded body
	// that the side parser reads (default 64 MiB); the client always gets
	// the whole body.
	MaxDecodedBytes int64 `json:"max_decoded_bytes,omitempty"`
}

// Provision applies defaults and validates.
func (c *TapConfig) Provision() error {
	if c.Format == "" {
		c.Format = FormatAuto
	}
	if c.Provider == "" {
		c.Provider = ProviderAuto
	}
	if c.MaxDecodedBytes == 0 {
		c.MaxDecodedBytes = DefaultMaxDecodedBytes
	}
	return c.Validate()
}

// Validate rejects unknown formats and providers.
func (c TapConfig) Validate() error {
	switch c.Format {
	case "", FormatAuto, FormatJSON, FormatSSE:
	default:
		return fmt.Errorf(`tap: format must be "auto", "json" or "sse", got %q`, c.Format)
	}
	switch c.Provider {
	case "", ProviderAuto, ProviderOpenAI, ProviderAnthropic, ProviderGraphQL:
	default:
		return fmt.Errorf(`tap: provider must be "auto", "openai", "anthropic" or "graphql", got %q`, c.Provider)
	}
	if c.MaxDecodedBytes < 0 {
		return fmt.Errorf("tap: max_decoded_bytes must not be negative, got %d", c.MaxDecodedBytes)
	}
	if c.Header != "" && strings.ContainsAny(c.Header, " \t\r\n:") {
		return fmt.Errorf("tap: invalid header name %q", c.Header)
	}
	return nil
}

// Tap wraps a ResponseWriter to read the upstream's usage report from the
// response while it passes through.
//
// Every Write goes straight to the underlying writer, and Flush is passed
// through, so streams are neither buffered nor delayed. The tap then feeds
// the written bytes to an incremental scanner: a JSON state machine that
// follows object keys only along the paths where reports live (usage,
// response.usage, message.usage, their cached-token details,
// extensions.cost) and skips every other
// value by counting brackets outside strings — one pass, constant memory,
// a report found wherever it sits in the document. For server-sent events,
// each event's data is first gathered in a 4 KiB buffer and scanned only if
// it holds a "usage" (or "extensions") object, so content deltas cost one
// vectorised search; a larger event is streamed through the scanner.
// A document counts only once complete: a cut stream reports nothing
// (Found=false). Keys written with escapes and numbers with exponents are
// never read as reports; no real upstream writes them.
//
// A gzip-encoded body is decompressed for the scanner only, on a goroutine
// fed through a pipe, up to MaxDecodedBytes; the client receives the gzip
// bytes. Other content encodings are not parsed (Found=false).
//
// A Tap is used by one handler goroutine; call Usage after the handler has
// returned. Usage also releases the gzip decoder, so call it even when the
// result is not needed.
type Tap struct {
	w   http.ResponseWriter
	cfg TapConfig

	status      int
	wroteHeader bool
	written     int64

	mode  uint8 // tapNone, tapJSON, tapSSE
	js    usageScanner
	sse   sseScanner
	gz    *gzipFeeder
	done  bool
	usage Usage
}

const (
	tapNone uint8 = iota
	tapJSON
	tapSSE
)

// NewTap wraps w. cfg should have been provisioned; zero values mean the
// defaults.
func NewTap(w http.ResponseWriter, cfg TapConfig) *Tap {
	return &Tap{w: w, cfg: cfg}
}

// Header returns the underlying writer's header map.
func (t *Tap) Header() http.Header { return t.w.Header() }

// WriteHeader records the status, decides how to parse the body from the
// response headers, and passes the call through.
func (t *Tap) WriteHeader(code int) {
	if !t.wroteHeader && code >= 200 {
		t.setup(code)
	}
	t.w.WriteHeader(code)
}

// Write passes p through, then feeds what was written to the side parser.
func (t *Tap) Write(p []byte) (int, error) {
	if !t.wroteHeader {
		// Implicit 200: the underlying writer does its own (content type
		// sniffing included); we only look at the headers now.
		t.setup(http.StatusOK)
	}
	n, err := t.w.Write(p)
	t.written += int64(n)
	if t.mode != tapNone && n > 0 {
		t.feed(p[:n])
	}
	return n, err
}

// Flush passes a flush through to the underlying writer.
func (t *Tap) Flush() {
	if !t.wroteHeader {
		t.setup(http.StatusOK)
	}
	if f, ok := t.w.(http.Flusher); ok {
		f.Flush()
		return
	}
	_ = http.NewResponseController(t.w).Flush()
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (t *Tap) Unwrap() http.ResponseWriter { return t.w }

// Status returns the response status (0 before anything was written).
func (t *Tap) Status() int { return t.status }

// Written returns the number of body bytes written to the client.
func (t *Tap) Written() int64 { return t.written }

// Usage returns the last usage report seen in the response. Call it after
// the handler has returned; later calls return the same result.
func (t *Tap) Usage() Usage {
	if t.done {
		return t.usage
	}
	t.done = true
	if t.gz != nil {
		t.gz.close()
	}
	switch {
	case t.cfg.Header != "":
		// Look again: a trailer is set in the header map after the body.
		if u, ok := headerUsage(t.w.Header().Get(t.cfg.Header)); ok {
			t.usage = u
		}
	case t.mode != tapNone:
		if t.mode == tapSSE {
			t.sse.finish()
		}
		t.usage = t.js.usage()
	}
	return t.usage
}

func (t *Tap) setup(code int) {
	t.wroteHeader = true
	t.status = code
	h := t.w.Header()
	if t.cfg.Header != "" {
		if u, ok := headerUsage(h.Get(t.cfg.Header)); ok {
			t.usage = u
		}
		return
	}
	if code == http.StatusNoContent || code == http.StatusNotModified {
		return
	}
	format := t.cfg.Format
	if format == "" || format == FormatAuto {
		format = FormatJSON
		if mt, _, err := mime.ParseMediaType(h.Get("Content-Type")); err == nil && mt == "text/event-stream" {
			format = FormatSSE
		}
	}
	switch strings.ToLower(strings.TrimSpace(h.Get("Content-Encoding"))) {
	case "", "identity":
	case "gzip", "x-gzip":
		limit := t.cfg.MaxDecodedBytes
		if limit <= 0 {
			limit = DefaultMaxDecodedBytes
		}
		t.gz = startGzip(t.parse, limit)
	default:
		return // br, zstd, deflate…: not parsed, the estimate stands
	}
	t.js = *newUsageScanner(t.cfg.Provider)
	t.mode = tapJSON
	if format == FormatSSE {
		t.mode = tapSSE
		t.sse = newSSEScanner(&t.js)
	}
}

// feed hands written bytes to the side parser (through gzip if needed).
func (t *Tap) feed(p []byte) {
	if t.gz != nil {
		t.gz.write(p)
		return
	}
	t.parse(p)
}

// parse runs the scanners over decoded body bytes.
func (t *Tap) parse(p []byte) {
	if t.mode == tapSSE {
		t.sse.write(p)
		return
	}
	t.js.write(p)
}

// headerUsage reads a cost header: an integer, or a decimal rounded up.
func headerUsage(v string) (Usage, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return Usage{}, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return Usage{Total: max(n, 0), Found: true}, true
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || f < 0 {
		return Usage{}, false
	}
	if f >= math.MaxInt64 {
		return Usage{Total: math.MaxInt64, Found: true}, true
	}
	return Usage{Total: int64(math.Ceil(f)), Found: true}, true
}

// gzipFeeder decompresses a body that arrives in pushed chunks. The
// decompressor wants to pull from a Reader, so it runs on its own goroutine
// reading from a pipe; write blocks until the goroutine has taken the bytes
// (the client already has them). When decoding fails or passes the limit the
// goroutine closes the pipe, and later writes return at once.
type gzipFeeder struct {
	pw   *io.PipeWriter
	done chan struct{}
}

func startGzip(sink func([]byte), limit int64) *gzipFeeder {
	pr, pw := io.Pipe()
	g := &gzipFeeder{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(g.done)
		defer pr.Close()
		zr, err := gzip.NewReader(pr)
		if err != nil {
			return
		}
		buf := make([]byte, 32<<10)
		var total int64
		for {
			n, err := zr.Read(buf)
			if n > 0 {
				total += int64(n)
				if total > limit {
					return
				}
				sink(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return g
}

func (g *gzipFeeder) write(p []byte) {
	_, _ = g.pw.Write(p) // an error means the decoder gave up: nothing to do
}

func (g *gzipFeeder) close() {
	_ = g.pw.Close()
	<-g.done
}
