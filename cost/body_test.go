package cost

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// randomBody returns n deterministic pseudo-random bytes.
func randomBody(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 42))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// hideLength wraps a reader so the request has no known length.
type hideLength struct{ io.Reader }

func TestPeekBody(t *testing.T) {
	tests := []struct {
		name          string
		size          int
		max           int64
		knownLength   bool
		wantPeek      int
		wantTruncated bool
	}{
		{"empty", 0, 16, true, 0, false},
		{"smaller than max", 10, 16, true, 10, false},
		{"exactly max", 16, 16, true, 16, false},
		{"one over max", 17, 16, true, 16, true},
		{"much larger", 1 << 20, 1024, true, 1024, true},
		{"unknown length small", 10, 16, false, 10, false},
		{"unknown length exactly max", 16, 16, false, 16, false},
		{"unknown length larger", 100000, 1000, false, 1000, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := randomBody(tt.size)
			var body io.Reader = bytes.NewReader(orig)
			if !tt.knownLength {
				body = hideLength{body}
			}
			r := httptest.NewRequest(http.MethodPost, "/", body)
			wantCL := r.ContentLength
			peek, truncated, err := PeekBody(r, tt.max)
			if err != nil {
				t.Fatal(err)
			}
			if len(peek) != tt.wantPeek || truncated != tt.wantTruncated {
				t.Fatalf("peek %d bytes truncated=%v, want %d %v", len(peek), truncated, tt.wantPeek, tt.wantTruncated)
			}
			if !bytes.Equal(peek, orig[:len(peek)]) {
				t.Fatal("peeked bytes differ from the body's first bytes")
			}
			if r.ContentLength != wantCL {
				t.Fatalf("ContentLength changed from %d to %d", wantCL, r.ContentLength)
			}
			got, err := io.ReadAll(r.Body)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, orig) {
				t.Fatalf("replayed body differs: %d bytes, want %d", len(got), len(orig))
			}
			if (r.GetBody != nil) == truncated {
				t.Fatalf("GetBody set=%v with truncated=%v", r.GetBody != nil, truncated)
			}
			if r.GetBody != nil {
				rc, _ := r.GetBody()
				again, _ := io.ReadAll(rc)
				if !bytes.Equal(again, orig) {
					t.Fatal("GetBody replays different bytes")
				}
			}
		})
	}
}

type closeRecorder struct {
	io.Reader
	closed int
}

func (c *closeRecorder) Close() error { c.closed++; return nil }

func TestPeekBodyClose(t *testing.T) {
	for _, size := range []int{5, 50} {
		orig := &closeRecorder{Reader: bytes.NewReader(randomBody(size))}
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body = orig
		if _, _, err := PeekBody(r, 10); err != nil {
			t.Fatal(err)
		}
		if orig.closed != 0 {
			t.Fatal("PeekBody closed the original body")
		}
		buf := make([]byte, 3)
		if _, err := r.Body.Read(buf); err != nil {
			t.Fatal(err)
		}
		if err := r.Body.Close(); err != nil {
			t.Fatal(err)
		}
		if orig.closed != 1 {
			t.Fatalf("size %d: original closed %d times, want 1", size, orig.closed)
		}
		if _, err := r.Body.Read(buf); !errors.Is(err, http.ErrBodyReadAfterClose) {
			t.Fatalf("read after close: %v, want ErrBodyReadAfterClose", err)
		}
	}
}

type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func TestPeekBodyReadErrorIsReplayed(t *testing.T) {
	boom := errors.New("connection reset")
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body = io.NopCloser(&failingReader{data: []byte("partial"), err: boom})
	peek, _, err := PeekBody(r, 100)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	if string(peek) != "partial" {
		t.Fatalf("peek = %q", peek)
	}
	got, err := io.ReadAll(r.Body)
	if string(got) != "partial" || !errors.Is(err, boom) {
		t.Fatalf("replay = %q, %v; want the bytes then the same error", got, err)
	}
}

func TestPeekBodyNoBody(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	peek, truncated, err := PeekBody(r, 10)
	if peek != nil || truncated || err != nil {
		t.Fatalf("got %q %v %v", peek, truncated, err)
	}
	if r.Body != http.NoBody {
		t.Fatalf("body replaced: %T", r.Body)
	}
}

// TestPeekBodyUpstreamIntegrity sends bodies through a proxy that peeks, to
// a real upstream, and checks the upstream receives the same bytes, with the
// same framing, for bodies below, at and above the peek bound.
func TestPeekBodyUpstreamIntegrity(t *testing.T) {
	type seen struct {
		sum    [32]byte
		n      int
		cl     int64
		chunks bool
	}
	got := make(chan seen, 1)
	upstream := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("upstream read: %v", err)
		}
		got <- seen{sha256.Sum256(b), len(b), r.ContentLength, len(r.TransferEncoding) > 0}
	}))

	const max = 64 << 10
	forward := testTransport(t)
	proxy := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := PeekBody(r, max); err != nil {
			t.Errorf("peek: %v", err)
		}
		out, _ := http.NewRequest(http.MethodPost, upstream.URL, r.Body)
		out.ContentLength = r.ContentLength
		resp, err := forward.RoundTrip(out)
		if err != nil {
			t.Errorf("forward: %v", err)
			return
		}
		resp.Body.Close()
	}))
	client := testClient(t)

	for _, size := range []int{0, 1, max - 1, max, max + 1, 3 << 20} {
		for _, chunked := range []bool{false, true} {
			orig := randomBody(size)
			var body io.Reader = bytes.NewReader(orig)
			if chunked {
				body = hideLength{body}
			}
			req, _ := http.NewRequest(http.MethodPost, proxy.URL, body)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			s := <-got
			if s.n != size || s.sum != sha256.Sum256(orig) {
				t.Fatalf("size %d chunked=%v: upstream got %d bytes, different content=%v", size, chunked, s.n, s.sum != sha256.Sum256(orig))
			}
			if !chunked && size > 0 && s.cl != int64(size) {
				t.Fatalf("size %d: upstream Content-Length %d", size, s.cl)
			}
		}
	}
}

func TestNewRequestPeeksOnlyWhenNeeded(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"a":1}`))
	req, err := NewRequest(r, Constant{N: 1}, 100)
	if err != nil || req.Body != nil {
		t.Fatalf("constant estimator peeked: %q %v", req.Body, err)
	}
	req, err = NewRequest(r, &LLM{}, 100)
	if err != nil || string(req.Body) != `{"a":1}` {
		t.Fatalf("LLM estimator got %q %v", req.Body, err)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != `{"a":1}` {
		t.Fatalf("body after peek = %q", b)
	}
	if BodyLimit(&LLM{}, 1) != DefaultLLMMaxBodyBytes || BodyLimit(Constant{}, 5) != 0 || BodyLimit(BodySize{}, 5) != 5 {
		t.Fatal("BodyLimit")
	}
}

func TestBodySizeAndHeader(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("hello"))
	if n, err := (BodySize{}).Estimate(&Request{HTTP: r}); n != 5 || err != nil {
		t.Fatalf("known length: %d %v", n, err)
	}
	r.ContentLength = -1
	if n, err := (BodySize{}).Estimate(&Request{HTTP: r, Body: []byte("hello")}); n != 5 || err != nil {
		t.Fatalf("peeked: %d %v", n, err)
	}
	_, err := (BodySize{}).Estimate(&Request{HTTP: r, Body: []byte("hel"), Truncated: true})
	var ie *InputError
	if !errors.As(err, &ie) || ie.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("truncated unknown length: %v", err)
	}

	h := Header{Name: "X-Cost"}
	r.Header.Set("X-Cost", "42")
	if n, err := h.Estimate(&Request{HTTP: r}); n != 42 || err != nil {
		t.Fatalf("header: %d %v", n, err)
	}
	for _, v := range []string{"-1", "abc", "1.5"} {
		r.Header.Set("X-Cost", v)
		if _, err := h.Estimate(&Request{HTTP: r}); !errors.As(err, &ie) || ie.Type != TypeInvalidHeader {
			t.Fatalf("header %q: %v", v, err)
		}
	}
	r.Header.Del("X-Cost")
	if _, err := h.Estimate(&Request{HTTP: r}); !errors.As(err, &ie) || ie.Type != TypeMissingHeader {
		t.Fatalf("missing header: %v", err)
	}
	h.Default = 7
	if n, _ := h.Estimate(&Request{HTTP: r}); n != 7 {
		t.Fatalf("default: %d", n)
	}
	if (Header{}).Validate() == nil || (Constant{N: -1}).Validate() == nil {
		t.Fatal("Validate accepted bad config")
	}
}

// TestPeekBodyWriteTo: transports copy bodies with io.Copy, which uses
// WriteTo; it must deliver the same bytes as Read.
func TestPeekBodyWriteTo(t *testing.T) {
	for _, size := range []int{0, 10, 5000} {
		orig := randomBody(size)
		r := httptest.NewRequest(http.MethodPost, "/", hideLength{bytes.NewReader(orig)})
		if _, _, err := PeekBody(r, 100); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		n, err := io.Copy(&out, r.Body)
		if err != nil || n != int64(size) || !bytes.Equal(out.Bytes(), orig) {
			t.Fatalf("size %d: copied %d, %v", size, n, err)
		}
	}
}

func TestPeekBodyLimits(t *testing.T) {
	orig := randomBody(100)
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(orig))
	peek, truncated, err := PeekBody(r, math.MaxInt64)
	if err != nil || truncated || !bytes.Equal(peek, orig) {
		t.Fatalf("max int64: %d bytes, %v, %v", len(peek), truncated, err)
	}

	rec := httptest.NewRecorder()
	r = httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(orig))
	r.Body = http.MaxBytesReader(rec, r.Body, 10)
	_, err = NewRequest(r, &LLM{}, 1000)
	var ie *InputError
	if !errors.As(err, &ie) || ie.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("MaxBytesReader: %v", err)
	}
	r = httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body = io.NopCloser(&failingReader{err: errors.New("reset")})
	if _, err = NewRequest(r, &LLM{}, 1000); !errors.As(err, &ie) || ie.Status != 400 || ie.Type != TypeBodyRead {
		t.Fatalf("read error: %v", err)
	}
}

// TestPeekBodyDoesNotTrustContentLength: a declared length is a claim, not
// bytes: a body that declares 8 MiB and sends none gets a small buffer, not
// 8 MiB held for as long as the client keeps its connection open.
func TestPeekBodyDoesNotTrustContentLength(t *testing.T) {
	r := httptest.NewRequest("POST", "/", strings.NewReader(""))
	r.ContentLength = 8<<20 - 1
	body, _, err := PeekBody(r, DefaultLLMMaxBodyBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) != 0 || cap(body) > 64<<10+1 {
		t.Fatalf("0 bytes read, %d bytes reserved for a declared 8 MiB", cap(body))
	}
	// A body that does arrive is read whole, however large.
	big := strings.Repeat("x", 3<<20)
	r = httptest.NewRequest("POST", "/", strings.NewReader(big))
	if body, _, err = PeekBody(r, DefaultLLMMaxBodyBytes); err != nil || string(body) != big {
		t.Fatalf("a 3 MiB body: %d bytes, %v", len(body), err)
	}
}
