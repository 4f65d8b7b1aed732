package cost

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync/atomic"
)

// Request is what an [Estimator] sees of a request: the request itself and,
// when the estimator reads bodies, the bytes [PeekBody] peeked.
type Request struct {
	// HTTP is the incoming request. Estimators must not read HTTP.Body: it
	// belongs to the upstream.
	HTTP *http.Request
	// Body holds the first bytes of the body (all of it unless Truncated).
	Body []byte
	// Truncated reports that the body is longer than the bytes peeked.
	Truncated bool
}

// NewRequest prepares r for estimation by e: when e reads bodies, it peeks
// at most max bytes (see [PeekBody]); otherwise it leaves the body alone.
// An error reading the body is returned as an *InputError: 413 when the
// server's own body limit (http.MaxBytesReader) was hit, else 400.
func NewRequest(r *http.Request, e Estimator, max int64) (*Request, error) {
	req := &Request{HTTP: r}
	if e == nil || !e.NeedsBody() {
		return req, nil
	}
	body, truncated, err := PeekBody(r, max)
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, &InputError{
				Status: http.StatusRequestEntityTooLarge,
				Type:   TypeBodyTooLarge,
				Title:  "Request body too large",
				Detail: fmt.Sprintf("the body is larger than the %d bytes allowed", mbe.Limit),
				Err:    err,
			}
		}
		return nil, &InputError{
			Status: http.StatusBadRequest,
			Type:   TypeBodyRead,
			Title:  "Could not read the request body",
			Detail: err.Error(),
			Err:    err,
		}
	}
	req.Body, req.Truncated = body, truncated
	return req, nil
}

// PeekBody reads at most max bytes of r.Body and puts back a body that
// replays them and then continues with the rest of the original stream, so
// whoever reads r.Body next (the upstream) receives every original byte, in
// order, whatever the body's size. Closing the new body closes the original.
//
// truncated reports that the body holds more than max bytes; body then holds
// exactly the first max bytes. r.ContentLength is left as it was: the bytes
// are the same, so it stays correct (-1 stays "unknown"). When the whole body
// was read, r.GetBody is set so that a transport may replay it.
//
// A read error other than EOF is returned (wrapped) together with the bytes
// read before it; the re-attached body replays those bytes and then returns
// the same error, so the upstream sees what it would have seen.
//
// A nil or http.NoBody body, or max <= 0, reads nothing: body is nil and
// truncated reports whether the request may carry a body at all.
func PeekBody(r *http.Request, max int64) (body []byte, truncated bool, err error) {
	const peekPrealloc = 64 << 10
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	if max <= 0 {
		return nil, r.ContentLength != 0, nil
	}
	// Read one byte more than max: that is how we know there is more.
	limit := max + 1
	if limit <= 0 { // max is the largest int64
		limit = math.MaxInt64
	}
	var buf bytes.Buffer
	if r.ContentLength >= 0 && r.ContentLength < limit {
		// Size known: one allocation for the common body. The +1 lets
		// ReadFrom see EOF without growing the buffer. A declared length
		// is only a claim: beyond 64 KiB the buffer grows as bytes come,
		// or a client declaring 8 MiB and sending nothing would hold
		// 8 MiB per connection.
		buf.Grow(int(min(r.ContentLength+1, peekPrealloc)))
	} else {
		buf.Grow(int(min(limit, 4096)))
	}
	orig := r.Body
	_, rerr := buf.ReadFrom(io.LimitReader(orig, limit))
	data := buf.Bytes()

	rb := &replayBody{buf: data, rest: orig, readErr: rerr}
	if int64(len(data)) > max {
		truncated = true
		body = data[:max]
	} else {
		body = data
		if rerr == nil {
			// LimitReader stopped before max+1 bytes without an error: the
			// original reached EOF. Nothing remains to read from it.
			rb.eof = true
			full := data
			r.GetBody = func() (io.ReadCloser, error) {
				return io.NopCloser(bytes.NewReader(full)), nil
			}
		}
	}
	r.Body = rb
	if rerr != nil {
		return body, truncated, fmt.Errorf("reading request body: %w", rerr)
	}
	return body, truncated, nil
}

// replayBody replays the peeked bytes, then the rest of the original body.
type replayBody struct {
	buf     []byte
	off     int
	rest    io.ReadCloser // the original body; Close always reaches it
	readErr error         // error met while peeking, replayed after buf
	eof     bool          // the original already returned EOF
	closed  atomic.Bool
}

func (b *replayBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.off < len(b.buf) {
		n := copy(p, b.buf[b.off:])
		b.off += n
		return n, nil
	}
	if b.readErr != nil {
		return 0, b.readErr
	}
	if b.eof {
		return 0, io.EOF
	}
	return b.rest.Read(p)
}

// WriteTo lets io.Copy hand the peeked bytes over in one write, then stream
// the rest, without an intermediate buffer for the replayed part.
func (b *replayBody) WriteTo(w io.Writer) (int64, error) {
	var total int64
	if b.closed.Load() {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.off < len(b.buf) {
		n, err := w.Write(b.buf[b.off:])
		b.off += n
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	if b.readErr != nil {
		return total, b.readErr
	}
	if b.eof {
		return total, nil
	}
	n, err := io.Copy(w, onlyReader{b.rest})
	total += n
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return total, err
}

func (b *replayBody) Close() error {
	b.closed.Store(true)
	return b.rest.Close()
}

// onlyReader hides any WriterTo of the original body from io.Copy so that
// WriteTo cannot recurse into itself through a wrapped replayBody.
type onlyReader struct{ io.Reader }
