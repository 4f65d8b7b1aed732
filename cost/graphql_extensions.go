package cost

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// Limits of [ExtensionsWriter].
const (
	// MaxBufferedBody is the largest body, by its Content-Length, that an
	// ExtensionsWriter holds whole so as to send it with its exact new
	// Content-Length; a longer one, or one without a length, streams
	// through without one (chunked).
	MaxBufferedBody = 64 << 10
	// maxHeldCost bounds the upstream's own extensions.cost value held
	// while it is replaced; a longer one is passed through untouched.
	maxHeldCost = 4 << 10
	// maxBufferedDecoded bounds what a buffered gzip body may decode to.
	maxBufferedDecoded = 8 << 20
	// maxRawKept bounds the gzip bytes kept in case the body turns out
	// not to be gzip after all (then passed through as they came).
	maxRawKept = 64 << 10
	// maxGzipOut bounds what the gzip goroutine encodes before the handler
	// sends it on: a small chunk may decode to a thousand times its size.
	maxGzipOut = 64 << 10
)

// ExtensionsOptions says what an [ExtensionsWriter] inserts, and where.
type ExtensionsOptions struct {
	// Build returns the JSON value of extensions.cost. upstream is the
	// value the upstream itself wrote there, which Build's replaces (nil
	// when it wrote none). It is called at most once, from the goroutine
	// that decodes a gzip body when there is one (after the handler's
	// Write that delivered the bytes, and before that Write returns).
	Build func(upstream []byte) []byte
	// AnyStatus rewrites a response of any status; otherwise only 200s
	// are (a GraphQL error answered 4xx or 5xx is left untouched).
	AnyStatus bool
	// NoBody says the response has no body to rewrite (a HEAD request):
	// its header only is made the GET's (no Content-Length, a weak ETag).
	NoBody bool
	// Skipped, when set, is told why a JSON response that could have
	// carried the object was left untouched ("not a JSON object", "content
	// encoding br"…), at most once per response.
	Skipped func(reason string)
	// Gzip, when set, lends the gzip encoders and decoders (nil: each
	// response makes its own, some 800 KiB).
	Gzip *GzipPool
}

// GzipPool keeps gzip encoders and decoders for reuse by the
// ExtensionsWriters of one handler's cost: an encoder's tables are most
// of what rewriting a small gzip body costs. Safe for concurrent use; the
// zero value is ready, a nil one allocates.
type GzipPool struct {
	writers, readers sync.Pool
}

func (p *GzipPool) writer(w io.Writer) *gzip.Writer {
	if p != nil {
		if zw, ok := p.writers.Get().(*gzip.Writer); ok {
			zw.Reset(w)
			return zw
		}
	}
	zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
	return zw
}

func (p *GzipPool) putWriter(zw *gzip.Writer) {
	if p != nil {
		zw.Reset(io.Discard) // holds no writer of a response
		p.writers.Put(zw)
	}
}

func (p *GzipPool) reader(r io.Reader) (*gzip.Reader, error) {
	if p != nil {
		if zr, ok := p.readers.Get().(*gzip.Reader); ok {
			if err := zr.Reset(r); err != nil {
				p.readers.Put(zr)
				return nil, err
			}
			return zr, nil
		}
	}
	return gzip.NewReader(r)
}

func (p *GzipPool) putReader(zr *gzip.Reader) {
	if p != nil {
		p.readers.Put(zr)
	}
}

// Modes of an ExtensionsWriter.
const (
	exPending uint8 = iota // no header yet
	exPass                 // left untouched
	exPlain                // streamed through the inserter
	exGzip                 // decoded, streamed through the inserter, encoded again
	exBuffer               // held whole (a small body with a Content-Length)
)

// ExtensionsWriter wraps a ResponseWriter to add Shopify's cost object to
// a GraphQL response's top-level extensions, as the body streams through:
//
//	{"data":{…},"extensions":{"cost":{"requestedQueryCost":…}}}
//
// Only a JSON body (application/json or any +json type) of status 200
// (or any, with AnyStatus) whose top-level value is an object is
// rewritten; anything else passes byte for byte. Where the object goes:
//
//   - no top-level "extensions": `"extensions":{"cost":…}` is inserted
//     before the object's closing brace;
//   - an "extensions" object without "cost": `"cost":…` is inserted
//     before that object's closing brace;
//   - an "extensions" object with the upstream's own "cost": that value
//     (held, at most 4 KiB) is replaced by Build's, which reads it;
//   - "extensions" that is not an object, or a cost value over 4 KiB:
//     nothing is inserted (Skipped says so).
//
// Nothing else of the body changes, and nothing is parsed beyond bracket
// counting outside strings below the top level. A body that ends before
// its object closes is passed as it came.
//
// A body of at most MaxBufferedBody bytes by its Content-Length is held
// whole and sent with its new Content-Length once complete; any other is
// streamed, each Write passed on at once (but for a held cost value), its
// Content-Length removed. A gzip body is decoded and encoded again (at
// gzip.BestSpeed) as it streams, at most maxGzipOut encoded at a time
// however far a chunk decodes; a body that turns out not to be gzip
// passes as it came, and one corrupt part-way ends without the gzip
// trailer, so that its client sees the corruption rather than a shorter
// body. Bytes after the last gzip member that start no other are dropped
// (see gzipRewrite.run). Other content encodings are left untouched (Skipped). A strong
// ETag is weakened, and Accept-Ranges dropped, on a rewritten response.
//
// An ExtensionsWriter is used by one handler goroutine; call Close once
// the handler has returned.
type ExtensionsWriter struct {
	w    http.ResponseWriter
	opts ExtensionsOptions

	mode    uint8
	gzipped bool  // exBuffer: the body is gzip
	status  int   // exBuffer: the status to send once the body is complete
	want    int64 // exBuffer: its Content-Length
	buf     []byte
	ins     inserter
	gz      *gzipRewrite
	err     error // the first error writing to w
	closed  bool
}

// NewExtensionsWriter wraps w.
func NewExtensionsWriter(w http.ResponseWriter, opts ExtensionsOptions) *ExtensionsWriter {
	e := &ExtensionsWriter{w: w, opts: opts}
	e.ins.build, e.ins.skipped = opts.Build, e.skip
	return e
}

// Header returns the underlying writer's header map.
func (e *ExtensionsWriter) Header() http.Header { return e.w.Header() }

// Unwrap returns the underlying writer, for http.ResponseController.
func (e *ExtensionsWriter) Unwrap() http.ResponseWriter { return e.w }

// Inserted reports whether the cost object was written into the body.
func (e *ExtensionsWriter) Inserted() bool { return e.ins.inserted }

func (e *ExtensionsWriter) skip(reason string) {
	if f := e.opts.Skipped; f != nil {
		e.opts.Skipped = nil
		f(reason)
	}
}

// WriteHeader decides from the final header how the body is rewritten,
// if at all; an informational (1xx) header passes through.
func (e *ExtensionsWriter) WriteHeader(code int) {
	if e.mode == exBuffer && code >= 200 {
		return // superfluous: sent once the held body is, with its length
	}
	if e.mode != exPending || code < 200 {
		e.w.WriteHeader(code)
		return
	}
	e.setup(code)
	if e.mode != exBuffer {
		e.w.WriteHeader(code)
	}
}

func (e *ExtensionsWriter) setup(code int) {
	e.mode = exPass
	h := e.w.Header()
	if !e.opts.AnyStatus && code != http.StatusOK || code == http.StatusNoContent ||
		code == http.StatusNotModified || h.Get("Content-Range") != "" {
		return
	}
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	if err != nil || mt != "application/json" && !strings.HasSuffix(mt, "+json") {
		return
	}
	mode := exPlain
	switch enc := strings.ToLower(strings.TrimSpace(h.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		mode = exGzip
	default:
		if !e.opts.NoBody {
			e.skip("content encoding " + enc)
		}
		return
	}
	if e.opts.NoBody {
		// A HEAD response's header is the GET's, whose body would be
		// rewritten: it may not say a length that body would not have
		// (RFC 9110, section 8.6), and its ETag is as weak.
		rewritten(h)
		return
	}
	if cl := h.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n >= 0 && n <= MaxBufferedBody {
			e.mode, e.status, e.want, e.gzipped = exBuffer, code, n, mode == exGzip
			e.buf = make([]byte, 0, n)
			return
		}
	}
	e.mode = mode
	rewritten(h)
	if mode == exGzip {
		e.gz = startGzipRewrite(&e.ins, e.opts.Gzip)
	}
}

// rewritten readies the header of a body about to change: its length is
// no longer known, and its ETag no longer strong.
func rewritten(h http.Header) {
	h.Del("Content-Length")
	h.Del("Accept-Ranges")
	if et := h.Get("Etag"); strings.HasPrefix(et, `"`) {
		h.Set("Etag", "W/"+et)
	}
}

// Write passes p on, through the inserter when the body is rewritten.
func (e *ExtensionsWriter) Write(p []byte) (int, error) {
	if e.mode == exPending {
		e.WriteHeader(http.StatusOK)
	}
	switch e.mode {
	case exPlain:
		e.ins.write(p, e.out)
	case exGzip:
		e.gz.write(p, e.out)
		e.drain()
	case exBuffer:
		if int64(len(e.buf))+int64(len(p)) > e.want {
			// More than the Content-Length said: not ours to fix.
			e.passBuffered()
			return e.w.Write(p)
		}
		e.buf = append(e.buf, p...)
		if int64(len(e.buf)) == e.want {
			e.finishBuffered()
		}
	default:
		return e.w.Write(p)
	}
	if e.err != nil {
		return 0, e.err
	}
	return len(p), nil
}

// out writes rewritten bytes to the client, remembering the first error.
func (e *ExtensionsWriter) out(b []byte) {
	if e.err == nil && len(b) > 0 {
		_, e.err = e.w.Write(b)
	}
}

// drain sends what the gzip goroutine has encoded, or, when the body
// turned out not to be gzip, what came so far, and passes the rest.
func (e *ExtensionsWriter) drain() {
	g := e.gz
	if g.notGzip && g.rawBytes >= 0 {
		e.mode = exPass
		for _, b := range g.raw {
			e.out(b)
		}
		g.raw = nil
		return
	}
	e.out(g.out.Bytes())
	g.out.Reset()
}

// Flush sends what is written so far, except a body held whole.
func (e *ExtensionsWriter) Flush() { _ = e.FlushError() }

// FlushError is Flush, for http.ResponseController.
func (e *ExtensionsWriter) FlushError() error {
	switch e.mode {
	case exBuffer:
		return nil // sent whole, once complete
	case exPending:
		e.WriteHeader(http.StatusOK)
		if e.mode == exBuffer {
			return nil
		}
	case exGzip:
		e.gz.flush()
		e.drain()
	}
	if e.err != nil {
		return e.err
	}
	return http.NewResponseController(e.w).Flush()
}

// Close ends the body: a held cost value, a held body, the gzip trailer.
// Call it once the handler has returned; it writes nothing when nothing
// was written.
func (e *ExtensionsWriter) Close() error {
	if e.closed {
		return e.err
	}
	e.closed = true
	switch e.mode {
	case exPlain:
		e.ins.finish(e.out)
	case exGzip:
		e.gz.close(e.out)
		e.drain()
	case exBuffer:
		// Shorter than its Content-Length: the upstream's failure, passed
		// on as it was.
		e.passBuffered()
	}
	return e.err
}

// passBuffered sends a held body as it came.
func (e *ExtensionsWriter) passBuffered() {
	e.mode = exPass
	e.w.WriteHeader(e.status)
	e.out(e.buf)
	e.buf = nil
}

// finishBuffered rewrites a complete held body and sends it with its new
// Content-Length, or as it came when it is not rewritten.
func (e *ExtensionsWriter) finishBuffered() {
	body := e.buf
	if e.gzipped {
		var err error
		body, err = e.gunzip(body)
		if err != nil || len(body) > maxBufferedDecoded {
			if err == nil {
				e.skip("gzip body decodes to more than 8 MiB")
			}
			e.passBuffered()
			return
		}
	}
	var rw bytes.Buffer
	rw.Grow(len(body) + 256)
	e.ins.write(body, func(b []byte) { rw.Write(b) })
	e.ins.finish(func(b []byte) { rw.Write(b) })
	if !e.ins.inserted {
		e.passBuffered()
		return
	}
	out := rw.Bytes()
	if e.gzipped {
		var zb bytes.Buffer
		zw := e.opts.Gzip.writer(&zb)
		_, _ = zw.Write(out)
		_ = zw.Close()
		e.opts.Gzip.putWriter(zw)
		out = zb.Bytes()
	}
	h := e.w.Header()
	rewritten(h)
	h.Set("Content-Length", strconv.Itoa(len(out)))
	e.mode = exPass // anything more is not ours
	e.buf = nil
	e.w.WriteHeader(e.status)
	e.out(out)
}

// gunzip decodes a held gzip body as gzipRewrite does a streamed one
// (member by member, bytes after a member that start no other dropped),
// up to maxBufferedDecoded bytes and one more.
func (e *ExtensionsWriter) gunzip(body []byte) ([]byte, error) {
	br := bytes.NewReader(body)
	zr, err := e.opts.Gzip.reader(br)
	if err != nil {
		return nil, err
	}
	defer e.opts.Gzip.putReader(zr)
	var out bytes.Buffer
	for {
		zr.Multistream(false)
		if _, err := out.ReadFrom(io.LimitReader(zr, int64(maxBufferedDecoded+1-out.Len()))); err != nil {
			return nil, err
		}
		if out.Len() > maxBufferedDecoded {
			return out.Bytes(), nil
		}
		if err := zr.Reset(br); err != nil {
			if err == io.EOF || out.Len() > 0 {
				return out.Bytes(), nil
			}
			return nil, err
		}
	}
}

// gzipRewrite decodes a gzip body pushed in chunks, runs the inserter over
// it and encodes the result again. The decoder pulls from a Reader, so it
// runs on its own goroutine; each write hands it a chunk and waits until
// it asks for the next (or ends), so the goroutine and the handler never
// run at once: out is the goroutine's between a send on in and the
// receive on idle or done, the handler's otherwise. When out reaches
// maxGzipOut the goroutine hands it over mid-chunk (full), and waits
// until the handler has sent it (resume): a chunk that decodes to
// gigabytes is sent as it decodes, never held.
type gzipRewrite struct {
	pool   *GzipPool
	in     chan []byte
	idle   chan struct{}
	full   chan struct{}
	resume chan struct{}
	done   chan struct{}
	zw     *gzip.Writer
	out    bytes.Buffer

	cur      []byte   // the goroutine's: the chunk being decoded
	eof      bool     // the goroutine's: in is closed
	raw      [][]byte // the handler's: the chunks so far, while no byte was decoded
	rawBytes int
	produced bool // the goroutine decoded a byte (read by the handler after a sync)
	notGzip  bool // the body failed to decode before any byte was: pass raw
}

func startGzipRewrite(ins *inserter, pool *GzipPool) *gzipRewrite {
	g := &gzipRewrite{pool: pool, in: make(chan []byte), idle: make(chan struct{}), full: make(chan struct{}),
		resume: make(chan struct{}), done: make(chan struct{})}
	g.zw = pool.writer(&g.out)
	go g.run(ins)
	<-g.idle // the decoder waits for the first bytes
	return g
}

// run decodes the body member by member (a gzip body may be several
// gzip members, concatenated). Bytes after a member that do not start
// another are not gzip data: what decoders that stop there (browsers,
// curl) take for the body ends with the member, and so does the body
// sent on, whole and with its trailer; the bytes are dropped.
func (g *gzipRewrite) run(ins *inserter) {
	defer close(g.done)
	// Given back when done: after done, only the handler touches g, and
	// never zw (flush and close look at done first).
	defer g.pool.putWriter(g.zw)
	br := bufio.NewReader(g) // a flate.Reader: what a member leaves unread stays here for the next
	zr, err := g.pool.reader(br)
	if err != nil {
		// Not gzip: passed as it came, or, when too much came to keep,
		// cut short where the client's decoder sees it.
		g.notGzip = true
		_ = g.zw.Flush()
		return
	}
	defer g.pool.putReader(zr)
	zr.Multistream(false)
	buf := make([]byte, 32<<10)
	sink := func(b []byte) {
		_, _ = g.zw.Write(b)
		if g.out.Len() >= maxGzipOut {
			g.full <- struct{}{}
			<-g.resume
		}
	}
	for {
		n, err := zr.Read(buf)
		if n > 0 {
			g.produced = true
			ins.write(buf[:n], sink)
		}
		if err == io.EOF {
			// The member's end: another member, or the end of the body.
			if err = zr.Reset(br); err == nil {
				zr.Multistream(false)
				continue
			}
			if err == io.EOF || g.produced {
				// Ended, or trailing bytes that are no member.
				ins.finish(sink)
				_ = g.zw.Close()
				return
			}
		}
		if err != nil {
			// Corrupt part-way: what decoded is sent, without the
			// trailer that would make it look whole.
			g.notGzip = !g.produced
			_ = g.zw.Flush()
			return
		}
	}
}

// Read is the decoder's source: the chunks the handler writes.
func (g *gzipRewrite) Read(p []byte) (int, error) {
	if len(g.cur) == 0 {
		if g.eof {
			return 0, io.EOF // asked again: no handler waits on idle now
		}
		g.idle <- struct{}{}
		chunk, ok := <-g.in
		if !ok {
			g.eof = true
			return 0, io.EOF
		}
		g.cur = chunk
	}
	n := copy(p, g.cur)
	g.cur = g.cur[n:]
	return n, nil
}

// write hands p to the decoder and waits until it has used it all,
// sending what it encodes meanwhile whenever it has maxGzipOut.
func (g *gzipRewrite) write(p []byte, send func([]byte)) {
	if !g.produced && g.rawBytes >= 0 {
		if g.rawBytes+len(p) <= maxRawKept {
			g.raw = append(g.raw, bytes.Clone(p))
			g.rawBytes += len(p)
		} else {
			g.raw, g.rawBytes = nil, -1 // too late to pass it as it came
		}
	}
	select {
	case g.in <- p:
	case <-g.done:
		return
	}
	g.wait(send)
	if g.produced {
		g.raw = nil
	}
}

// wait waits until the goroutine asks for more or ends, sending what it
// hands over meanwhile.
func (g *gzipRewrite) wait(send func([]byte)) {
	for {
		select {
		case <-g.idle:
			return
		case <-g.done:
			return
		case <-g.full:
			g.handOver(send)
		}
	}
}

// handOver sends what the goroutine has encoded and lets it go on, even
// if send panics (then Close still finds it, and ends it).
func (g *gzipRewrite) handOver(send func([]byte)) {
	defer func() {
		g.out.Reset()
		g.resume <- struct{}{}
	}()
	send(g.out.Bytes())
}

// flush encodes what was decoded so far; the goroutine is waiting. Until
// a byte has decoded, nothing is: the body may yet turn out not to be
// gzip, and pass as it came.
func (g *gzipRewrite) flush() {
	select {
	case <-g.done:
	default:
		if g.produced {
			_ = g.zw.Flush()
		}
	}
}

// close ends the input and waits for the goroutine. (It asks for more,
// idle, only when a write ended in a panic: it then reads the end.)
func (g *gzipRewrite) close(send func([]byte)) {
	select {
	case <-g.done:
	default:
		close(g.in)
		for {
			select {
			case <-g.done:
				return
			case <-g.idle:
			case <-g.full:
				g.handOver(send)
			}
		}
	}
}

// UpstreamCost reads the upstream's own extensions.cost value (as
// ExtensionsOptions.Build receives it) as a GraphQL usage report:
// actualQueryCost, else requestedQueryCost, else a bare number.
func UpstreamCost(value []byte) Usage {
	if len(value) == 0 {
		return Usage{}
	}
	s := newUsageScanner(ProviderGraphQL)
	s.write([]byte(`{"extensions":{"cost":`))
	s.write(value)
	s.write([]byte(`}}`))
	return s.usage()
}

// HeaderCost reads a cost header's value as [TapConfig.Header] does.
func HeaderCost(v string) Usage {
	u, _ := headerUsage(v)
	return u
}
