package cascade

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/store"
)

// Idempotency replay (IdempotencyConfig.Replay): the first request of an
// idempotency key passes with its body hashed as the upstream reads it
// and its response recorded as it is written; once it has ended, its
// response is kept in the store (engine.Decision.Keep), or, after a
// server error, its record is forgotten. A retry finds the kept response
// before any decision (engine.Decision.Response) and is answered with it.

// replayedHeader marks a response answered from the store.
const replayedHeader = "Idempotent-Replayed"

// A kept response is
//
//	head (store.ResponseHead bytes, what a retry needs if the rest is gone):
//	  [0]      format version (replayVersion)
//	  [1]      flags (replayStub, replayUnchecked)
//	  [2:4]    status
//	  [4:8]    the whole encoding's length: shorter means the store kept the head alone
//	  [8:16]   the request body's length
//	  [16:48]  the request body's SHA-256
//	  [48:64]  zero
//	then the header fields (a count, then each field's name and value,
//	uvarint lengths first) and the body.
const (
	replayVersion   = 1
	replayStub      = 1 << 0 // the response was not kept (too large, a stream): status only
	replayUnchecked = 1 << 1 // the request body was not read whole: its hash is unknown
	replayHeadEnd   = 48
)

// kept is a decoded kept response.
type kept struct {
	status    int
	flags     byte
	bodyLen   int64
	bodySum   [sha256.Size]byte
	header    http.Header
	body      []byte
	truncated bool // the store kept its head alone
}

// replayable reports whether k can be answered with as it was sent.
func (k *kept) replayable() bool { return k.flags&replayStub == 0 && !k.truncated }

// encodeKept encodes a response for the store.
func encodeKept(k *kept) []byte {
	n := store.ResponseHead + binary.MaxVarintLen64 + len(k.body)
	for name, vals := range k.header {
		for _, v := range vals {
			n += 2*binary.MaxVarintLen64 + len(name) + len(v)
		}
	}
	b := make([]byte, store.ResponseHead, n)
	b[0], b[1] = replayVersion, k.flags
	binary.BigEndian.PutUint16(b[2:], uint16(k.status))
	binary.BigEndian.PutUint64(b[8:], uint64(k.bodyLen))
	copy(b[16:replayHeadEnd], k.bodySum[:])
	names := make([]string, 0, len(k.header))
	fields := 0
	for name, vals := range k.header {
		names = append(names, name)
		fields += len(vals)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(fields))
	for _, name := range names {
		for _, v := range k.header[name] {
			b = binary.AppendUvarint(b, uint64(len(name)))
			b = append(b, name...)
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	b = append(b, k.body...)
	binary.BigEndian.PutUint32(b[4:], uint32(len(b)))
	return b
}

// errKeptCorrupt says a kept response cannot be read.
var errKeptCorrupt = errors.New("a kept response cannot be read (another format, or damaged)")

// decodeKept reads what encodeKept wrote, or its head alone.
func decodeKept(b []byte) (*kept, error) {
	if len(b) < replayHeadEnd || b[0] != replayVersion {
		return nil, errKeptCorrupt
	}
	k := &kept{
		flags:   b[1],
		status:  int(binary.BigEndian.Uint16(b[2:])),
		bodyLen: int64(binary.BigEndian.Uint64(b[8:])),
	}
	copy(k.bodySum[:], b[16:replayHeadEnd])
	total := int(binary.BigEndian.Uint32(b[4:]))
	if k.status < 100 || k.status > 999 || k.bodyLen < 0 || total < store.ResponseHead || len(b) > total {
		return nil, errKeptCorrupt
	}
	if len(b) < total {
		k.truncated = true
		return k, nil
	}
	rest := b[store.ResponseHead:]
	fields, rest, ok := uvarint(rest)
	if !ok || fields > uint64(len(rest)) {
		return nil, errKeptCorrupt
	}
	k.header = make(http.Header, fields)
	for range fields {
		var name, value []byte
		if name, rest, ok = lengthPrefixed(rest); !ok {
			return nil, errKeptCorrupt
		}
		if value, rest, ok = lengthPrefixed(rest); !ok {
			return nil, errKeptCorrupt
		}
		key := string(name)
		k.header[key] = append(k.header[key], string(value))
	}
	k.body = rest
	return k, nil
}

func uvarint(b []byte) (uint64, []byte, bool) {
	v, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, b, false
	}
	return v, b[n:], true
}

func lengthPrefixed(b []byte) (field, rest []byte, ok bool) {
	n, b, ok := uvarint(b)
	if !ok || n > uint64(len(b)) {
		return nil, b, false
	}
	return b[:n], b[n:], true
}

// hopByHop are the header fields that describe one connection, not the
// response: never kept.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// keptHeader is the part of header a replay sends again: without the
// hop-by-hop fields (and those Connection names), and without Set-Cookie
// unless cookies.
func keptHeader(header http.Header, cookies bool) http.Header {
	out := header.Clone()
	for _, f := range out.Values("Connection") {
		for name := range strings.SplitSeq(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				out.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		out.Del(name)
	}
	if !cookies {
		out.Del("Set-Cookie")
	}
	return out
}

// recorder passes a response on and records it for replay: its status,
// its header as sent, and its body while it fits max. A response that
// cannot be replayed as it was sent (a stream, a protocol switch, too
// large) is recorded as its status alone.
//
// Once the client has gone (Gone), a response that can still be kept is
// recorded to its end without being sent, so that the retry the client
// will send finds it; one that cannot be kept is stopped (stop).
type recorder struct {
	http.ResponseWriter
	max     int64
	cookies bool
	stop    context.CancelFunc // cancels the request for its handlers
	until   time.Time          // once its client has gone, the request is stopped then (its in_flight)
	timer   *time.Timer        // stops the request at until, once its client has gone

	mu     sync.Mutex
	status int
	header http.Header
	body   []byte
	whyNot string // why the response cannot be kept whole ("" while it can)
	gone   bool   // the client has gone: nothing more is sent
	ended  bool   // the request has ended (done): Gone starts no timer
}

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *recorder) WriteHeader(code int) {
	w.mu.Lock()
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
		w.header = keptHeader(w.Header(), w.cookies)
		ct, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type"))
		switch {
		case code == http.StatusSwitchingProtocols:
			w.notKept("it switched protocols")
		case ct == "text/event-stream":
			w.notKept("it is a stream (text/event-stream)")
		case w.Header().Get("Trailer") != "":
			w.notKept("it has trailers")
		}
		if n, err := strconv.ParseInt(w.Header().Get("Content-Length"), 10, 64); err == nil && n > w.max {
			w.notKept("its body is larger than max_body")
		}
	}
	gone := w.gone
	w.mu.Unlock()
	if !gone {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *recorder) Write(b []byte) (int, error) {
	w.mu.Lock()
	status := w.status
	w.mu.Unlock()
	if status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if !w.gone {
		if _, err = w.ResponseWriter.Write(b); err != nil {
			w.gone = true // the client has gone (or cannot be written to)
		}
	}
	if w.whyNot == "" {
		if int64(len(w.body)+len(b)) > w.max {
			w.notKept("its body is larger than max_body")
		} else {
			w.body = append(w.body, b...)
			return len(b), nil // recorded whole, sent or not
		}
	}
	if w.gone && err == nil {
		err = errClientGone
	}
	return len(b), err
}

// errClientGone fails the writes of a response not kept once its client
// has gone.
var errClientGone = errors.New("the client has gone")

// notKept records why the response cannot be kept; with its client gone,
// the request is stopped, as it would have been without replay. w.mu is
// held.
func (w *recorder) notKept(why string) {
	if w.whyNot == "" {
		w.whyNot, w.body = why, nil
	}
	if w.gone && w.stop != nil {
		w.stop()
	}
}

// Gone says the client has gone: a response that can still be kept is
// recorded to its end, unsent, until the request's in_flight is over
// (after it a retry is a new attempt: the first must not run on beside
// it); otherwise the request is stopped.
func (w *recorder) Gone() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gone = true
	if w.stop == nil || w.ended {
		return
	}
	if w.whyNot != "" {
		w.stop()
		return
	}
	w.timer = time.AfterFunc(time.Until(w.until), w.stop)
}

// done stops the timer Gone started, if any.
func (w *recorder) done() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// Flush passes a flush on (streaming upstreams flush; a flushed response
// may still be kept).
func (w *recorder) Flush() {
	w.mu.Lock()
	gone := w.gone
	w.mu.Unlock()
	if !gone {
		_ = http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// trailers reports whether a response's header, once it has ended, holds
// trailers: announced (Trailer), or set after the body (http.TrailerPrefix).
func trailers(h http.Header) bool {
	if len(h["Trailer"]) > 0 {
		return true
	}
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// hashingBody hashes a request body as it is read, for its retries to be
// compared with. It may be read by another goroutine than the handler's
// (a transport writing it upstream), hence the lock.
type hashingBody struct {
	mu     sync.Mutex
	body   io.ReadCloser
	sum    hash.Hash
	n      int64
	eof    bool
	closed bool
}

func newHashingBody(body io.ReadCloser) *hashingBody {
	b := &hashingBody{body: body, sum: sha256.New()}
	if body == nil || body == http.NoBody {
		b.body, b.eof = http.NoBody, true
	}
	return b
}

func (b *hashingBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := b.body.Read(p)
	b.sum.Write(p[:n])
	b.n += int64(n)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// Close ends reading for whoever reads; the body beneath stays open for
// finish, and the server closes it after the handler.
func (b *hashingBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// replayDrain is how much of a request body its upstream left unread is
// read to complete its hash; past it the hash is unknown and retries are
// answered unchecked.
const replayDrain = 1 << 20

// finish reads what is left of the body (up to replayDrain) and returns
// its length and hash, whole false when it could not be read to the end.
func (b *hashingBody) finish() (n int64, sum [sha256.Size]byte, whole bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.eof {
		m, err := io.CopyN(b.sum, b.body, replayDrain+1)
		b.n += m
		b.eof = err == io.EOF
	}
	b.sum.Sum(sum[:0])
	return b.n, sum, b.eof
}

// sameBody reports whether the request body r carries is the one k was
// kept for, reading at most one byte more than that one's length.
func sameBody(r *http.Request, k *kept) (bool, error) {
	if k.flags&replayUnchecked != 0 {
		return true, nil // its hash is unknown: not told apart
	}
	body := r.Body
	if body == nil {
		body = http.NoBody
	}
	sum := sha256.New()
	n, err := io.Copy(sum, io.LimitReader(body, k.bodyLen+1))
	if err != nil {
		return false, fmt.Errorf("reading the request body: %w", err)
	}
	return n == k.bodyLen && bytes.Equal(sum.Sum(nil), k.bodySum[:]), nil
}

// serveRecorded passes the first request of an idempotency key under
// replay, and keeps its response for its retries (or forgets its record
// after a server error). Its handlers run on even if its client goes (a
// client that timed out will retry, and is to find the response), unless
// the response turns out not to be keepable.
//
//go:noinline
func (h *Handler) serveRecorded(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, d *decision) error {
	ctx, stop := context.WithCancel(context.WithoutCancel(r.Context()))
	defer stop()
	rec := &recorder{ResponseWriter: w, max: h.Idempotency.MaxBody, cookies: h.Idempotency.ReplayCookies, stop: stop,
		until: time.Now().Add(time.Duration(h.Idempotency.InFlight))}
	defer rec.done()
	defer context.AfterFunc(r.Context(), rec.Gone)()
	body := newHashingBody(r.Body)
	r.Body = body
	d.recording = true
	err := h.serveDecided(rec, r, detached{next: next, ctx: ctx}, d, 0, nil)
	h.keepRecorded(r, d, rec, body, err)
	return err
}

// detached runs next on the request with ctx for its context.
type detached struct {
	next caddyhttp.Handler
	ctx  context.Context
}

func (h detached) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	return h.next.ServeHTTP(w, r.WithContext(h.ctx))
}

// keepRecorded keeps the response rec recorded, or forgets d's record
// when the operation may not have happened: a server error, a handler's
// error before any response.
func (h *Handler) keepRecorded(r *http.Request, d *decision, rec *recorder, body *hashingBody, err error) {
	if !d.KeepsResponse() {
		return // given back (a refund) meanwhile: a retry is a new request
	}
	rec.mu.Lock()
	status := rec.status
	rec.mu.Unlock()
	switch {
	case status >= 500, err != nil && status == 0:
		d.Forget()
		return
	case err != nil:
		rec.mu.Lock()
		rec.notKept("it was cut short") // its status was sent: the operation happened
		rec.mu.Unlock()
	case status == 0:
		rec.WriteHeader(http.StatusOK) // nothing written: the server sends 200 and no body
	}
	if trailers(rec.Header()) {
		rec.mu.Lock()
		rec.notKept("it has trailers")
		rec.mu.Unlock()
	}
	rec.mu.Lock()
	k := &kept{status: rec.status, header: rec.header, body: rec.body}
	whyNot := rec.whyNot
	rec.mu.Unlock()
	var whole bool
	k.bodyLen, k.bodySum, whole = body.finish()
	if !whole {
		k.flags |= replayUnchecked
	}
	if whyNot != "" {
		k.flags |= replayStub
		k.header, k.body = nil, nil
		if ce := h.logger.Check(zap.DebugLevel, "idempotency: a response not kept for replay"); ce != nil {
			ce.Write(zap.Int("status", k.status), zap.String("why", whyNot))
		}
	}
	_ = d.Keep(context.WithoutCancel(r.Context()), encodeKept(k))
}

// replay answers a retry with the response kept for its first request:
// refused when its body differs (the key reused for another request) or
// when that response could not be kept.
//
//go:noinline
func (h *Handler) replay(w http.ResponseWriter, r *http.Request, d *decision) error {
	k, err := decodeKept(d.Response)
	if err != nil {
		h.logger.Warn("idempotency: a kept response cannot be read; its retry is refused as not replayable", zap.Error(err))
		k = &kept{flags: replayStub | replayUnchecked}
	}
	same, err := sameBody(r, k)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return caddyhttp.Error(http.StatusRequestEntityTooLarge, err)
		}
		return caddyhttp.Error(http.StatusBadRequest, err)
	}
	if !same {
		return h.problem(w, r, http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency key reused",
			"this idempotency key was used for a request with another body: use a new key for a new request", d)
	}
	if !k.replayable() {
		detail := "the response to the first request with this idempotency key could not be kept, and that request is not run again: use a new key for a new request"
		if k.status != 0 {
			detail = fmt.Sprintf("the response to the first request with this idempotency key (status %d) could not be kept, and that request is not run again: use a new key for a new request", k.status)
		}
		p := engine.NewProblem(http.StatusConflict, "idempotency_not_replayable", "Response not replayable", detail, &d.Decision)
		p.OriginalStatus = k.status
		return h.writeProblem(w, r, p)
	}
	hdr := w.Header()
	clear(hdr) // the first's header as it was sent, no more (a Server field its upstream removed)
	for name, vals := range k.header {
		hdr[name] = vals
	}
	hdr.Set(replayedHeader, "true")
	w.WriteHeader(k.status)
	_, err = w.Write(k.body)
	return err
}
