package cascade

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/store"
)

// TestKeptRoundTrip: a kept response decodes to what was encoded; cut
// to its head (as a store under pressure keeps it) it still says its
// status and its request body's hash, and is not replayable.
func TestKeptRoundTrip(t *testing.T) {
	sum := sha256.Sum256([]byte(`{"amount":5}`))
	for _, tc := range []struct {
		name string
		k    kept
	}{
		{"a response", kept{status: 201, bodyLen: 12, bodySum: sum, header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}}, body: []byte(`{"id":1}`)}},
		{"no header, no body", kept{status: 204, header: http.Header{}}},
		{"a stub", kept{status: 200, flags: replayStub, bodyLen: 12, bodySum: sum}},
		{"unchecked", kept{status: 200, flags: replayUnchecked, header: http.Header{}, body: bytes.Repeat([]byte("x"), 1000)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := encodeKept(&tc.k)
			got, err := decodeKept(b)
			if err != nil {
				t.Fatal(err)
			}
			if got.status != tc.k.status || got.flags != tc.k.flags || got.bodyLen != tc.k.bodyLen || got.bodySum != tc.k.bodySum ||
				!bytes.Equal(got.body, tc.k.body) || got.truncated || len(got.header) != len(tc.k.header) {
				t.Fatalf("decoded %+v, want %+v", got, tc.k)
			}
			for name, vals := range tc.k.header {
				if strings.Join(got.header[name], ",") != strings.Join(vals, ",") {
					t.Fatalf("%s: %q, want %q", name, got.header[name], vals)
				}
			}
			if got.replayable() != (tc.k.flags&replayStub == 0) {
				t.Fatalf("replayable %v with flags %b", got.replayable(), tc.k.flags)
			}
			if len(b) <= store.ResponseHead {
				return
			}
			head, err := decodeKept(b[:store.ResponseHead])
			if err != nil || !head.truncated || head.replayable() || head.status != tc.k.status || head.bodySum != tc.k.bodySum || head.bodyLen != tc.k.bodyLen {
				t.Fatalf("its head alone: %+v %v, want truncated with status and hash", head, err)
			}
		})
	}
}

// TestKeptCorrupt: what is not a kept response is an error, never a
// response or a panic.
func TestKeptCorrupt(t *testing.T) {
	good := encodeKept(&kept{status: 200, header: http.Header{"A": {"b"}}, body: []byte("body")})
	long := append(bytes.Clone(good), 'x')
	badStatus := bytes.Clone(good)
	badStatus[2], badStatus[3] = 0, 99
	badVersion := bytes.Clone(good)
	badVersion[0] = 9
	badFields := bytes.Clone(good)
	badFields[store.ResponseHead] = 0x7f // more fields than bytes
	for name, b := range map[string][]byte{"nil": nil, "short": good[:10], "longer than said": long, "status 99": badStatus,
		"another version": badVersion, "fields": badFields} {
		if k, err := decodeKept(b); !errors.Is(err, errKeptCorrupt) {
			t.Errorf("%s: %+v %v, want errKeptCorrupt", name, k, err)
		}
	}
}

func FuzzDecodeKept(f *testing.F) {
	f.Add(encodeKept(&kept{status: 201, header: http.Header{"A": {"b", "c"}}, body: []byte("body")}))
	f.Add(encodeKept(&kept{status: 200, flags: replayStub})[:store.ResponseHead])
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := decodeKept(b)
		if err != nil {
			return
		}
		if k.status < 100 || k.status > 999 || k.bodyLen < 0 {
			t.Fatalf("decoded %+v", k)
		}
		if !k.truncated {
			if again, err := decodeKept(encodeKept(k)); err != nil || again.status != k.status || !bytes.Equal(again.body, k.body) {
				t.Fatalf("re-encoded: %+v %v", again, err)
			}
		}
	})
}

// TestKeptHeader: the hop-by-hop fields, those Connection names and
// Set-Cookie (unless cookies) are not kept.
func TestKeptHeader(t *testing.T) {
	h := http.Header{
		"Connection": {"keep-alive, X-Hop"}, "X-Hop": {"1"}, "Keep-Alive": {"timeout=5"}, "Transfer-Encoding": {"chunked"},
		"Upgrade": {"h2c"}, "Trailer": {"X-Sum"}, "Set-Cookie": {"s=1"}, "Content-Type": {"application/json"}, "X-Request-Id": {"r1"},
	}
	got := keptHeader(h, false)
	if len(got) != 2 || got.Get("Content-Type") == "" || got.Get("X-Request-Id") == "" {
		t.Fatalf("kept %v, want Content-Type and X-Request-Id alone", got)
	}
	if got := keptHeader(h, true); got.Get("Set-Cookie") != "s=1" {
		t.Fatalf("with cookies, kept %v", got)
	}
	if h.Get("X-Hop") == "" {
		t.Fatal("keptHeader changed the header it was given")
	}
}

// TestRecorder: what a recorder keeps of the responses written through
// it, and that the client gets each as written.
func TestRecorder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		write  func(w http.ResponseWriter)
		status int
		body   string
		whyNot string
	}{
		{"written", func(w http.ResponseWriter) { w.WriteHeader(201); io.WriteString(w, "a"); io.WriteString(w, "b") }, 201, "ab", ""},
		{"implicit 200", func(w http.ResponseWriter) { io.WriteString(w, "ok") }, 200, "ok", ""},
		{"an early hint first", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(202) }, 202, "", ""},
		{"too large", func(w http.ResponseWriter) { io.WriteString(w, "12345"); io.WriteString(w, "678901") }, 200, "", "its body is larger than max_body"},
		{"announced too large", func(w http.ResponseWriter) { w.Header().Set("Content-Length", "11"); w.WriteHeader(200) }, 200, "", "its body is larger than max_body"},
		{"a stream", func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
			io.WriteString(w, "data: 1\n\n")
		}, 200, "", "it is a stream (text/event-stream)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent := httptest.NewRecorder()
			rec := &recorder{ResponseWriter: sent, max: 10}
			tc.write(rec)
			if rec.status != tc.status || string(rec.body) != tc.body || rec.whyNot != tc.whyNot {
				t.Fatalf("recorded %d %q (%q), want %d %q (%q)", rec.status, rec.body, rec.whyNot, tc.status, tc.body, tc.whyNot)
			}
			if sent.Code != tc.status && !(tc.status == 202 && sent.Code == 103) {
				t.Fatalf("sent %d, want %d", sent.Code, tc.status)
			}
		})
	}
	// Gone: a response that can be kept is recorded to its end, unsent; one
	// that cannot stops the request.
	sent := httptest.NewRecorder()
	stopped := false
	rec := &recorder{ResponseWriter: sent, max: 10, stop: func() { stopped = true }, until: time.Now().Add(time.Hour)}
	defer rec.done()
	rec.WriteHeader(200)
	rec.Gone()
	if n, err := io.WriteString(rec, "later"); n != 5 || err != nil || string(rec.body) != "later" || sent.Body.Len() != 0 || stopped {
		t.Fatalf("after the client went: wrote %d %v, recorded %q, sent %q, stopped %v", n, err, rec.body, sent.Body, stopped)
	}
	if _, err := io.WriteString(rec, "too much now"); !errors.Is(err, errClientGone) || !stopped {
		t.Fatalf("too large once gone: %v stopped %v, want errClientGone and the request stopped", err, stopped)
	}
}

// TestHashingBody: the hash covers the body whether its reader read it
// all, part (the rest is read by finish) or none.
func TestHashingBody(t *testing.T) {
	body := strings.Repeat("0123456789", 1000)
	want := sha256.Sum256([]byte(body))
	for _, read := range []int{0, 10, len(body)} {
		b := newHashingBody(io.NopCloser(strings.NewReader(body)))
		io.CopyN(io.Discard, b, int64(read))
		b.Close()
		if _, err := b.Read(make([]byte, 1)); !errors.Is(err, http.ErrBodyReadAfterClose) {
			t.Fatalf("a read after Close: %v", err)
		}
		n, sum, whole := b.finish()
		if n != int64(len(body)) || sum != want || !whole {
			t.Fatalf("read %d first: finished %d %x whole %v", read, n, sum, whole)
		}
	}
	b := newHashingBody(io.NopCloser(strings.NewReader(strings.Repeat("x", replayDrain+10))))
	if _, _, whole := b.finish(); whole {
		t.Fatal("a body longer than replayDrain left unread: finished whole")
	}
	if n, sum, whole := newHashingBody(http.NoBody).finish(); n != 0 || sum != sha256.Sum256(nil) || !whole {
		t.Fatal("no body: not the empty hash")
	}
}

// TestReplayOptions: the Caddyfile's replay options, and their mistakes.
func TestReplayOptions(t *testing.T) {
	block := func(opts string) string {
		return "rate_limit {\n tree api {\n  tier u {header.X-User} {\n   limit 1/s\n  }\n }\n idempotency {\n" + opts + "\n }\n}"
	}
	h, err := parse(t, block("  replay\n  replay_cookies"))
	if err != nil || !h.Idempotency.Replay || !h.Idempotency.ReplayCookies || h.Idempotency.MaxBody != 0 {
		t.Fatalf("replay, replay_cookies: %+v %v", h.Idempotency, err)
	}
	if err := h.Idempotency.provision(); err != nil || h.Idempotency.MaxBody != 1<<20 {
		t.Fatalf("provisioned: max_body %d %v, want 1 MiB", h.Idempotency.MaxBody, err)
	}
	if h, err := parse(t, block("  replay max_body 2MiB")); err != nil || h.Idempotency.MaxBody != 2<<20 {
		t.Fatalf("replay max_body 2MiB: %+v %v", h.Idempotency, err)
	}
	for opts, want := range map[string]string{
		"  replay max_body":       "write `replay` alone or `replay max_body <size>`",
		"  replay 2MiB":           "write `replay` alone or `replay max_body <size>`",
		"  replay max_body lots":  `max_body "lots": give a size from 1B to 64 MiB`,
		"  replay max_body 65MiB": "give a size from 1B to 64 MiB",
		"  replay_cookies yes":    "replay_cookies takes no value",
		"  replay_cookie":         `did you mean "replay_cookies"?`,
	} {
		if _, err := parse(t, block(opts)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", opts, err, want)
		}
	}
	for _, c := range []IdempotencyConfig{{MaxBody: 10}, {ReplayCookies: true}, {Replay: true, MaxBody: -1}} {
		if err := c.provision(); err == nil {
			t.Errorf("%+v: provisioned", c)
		}
	}
}

// TestReplayIdentity: under replay, a request's operation is its caller's:
// the identity fields (and a client certificate) are part of it, other
// fields are not; without replay only the method, target and key are.
func TestReplayIdentity(t *testing.T) {
	op := func(c *IdempotencyConfig, headers ...string) string {
		t.Helper()
		r := httptest.NewRequest("POST", "/charges?x=1", nil)
		r.Header.Set("Idempotency-Key", "k1")
		for _, h := range headers {
			k, v, _ := strings.Cut(h, ": ")
			r.Header.Add(k, v)
		}
		key, err := c.key(r)
		if err != nil || key == "" {
			t.Fatalf("key: %q %v", key, err)
		}
		return key
	}
	replay := &IdempotencyConfig{Replay: true}
	custom := &IdempotencyConfig{Replay: true, Identity: []string{"x-tenant-token"}}
	plain := &IdempotencyConfig{}
	for _, c := range []*IdempotencyConfig{replay, custom, plain} {
		if err := c.provision(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		c    *IdempotencyConfig
		a, b []string
		same bool
	}{
		{"another Authorization", replay, []string{"Authorization: Bearer a"}, []string{"Authorization: Bearer b"}, false},
		{"another cookie", replay, []string{"Cookie: session=a"}, []string{"Cookie: session=b"}, false},
		{"another API key", replay, []string{"X-Api-Key: a"}, []string{"X-Api-Key: b"}, false},
		{"one value or two", replay, []string{"Cookie: a=1", "Cookie: b=2"}, []string{"Cookie: a=1b=2"}, false},
		{"a field that is no identity", replay, []string{"X-Trace: 1"}, []string{"X-Trace: 2"}, true},
		{"a custom identity", custom, []string{"X-Tenant-Token: a"}, []string{"X-Tenant-Token: b"}, false},
		{"a default one, not in a custom identity", custom, []string{"Cookie: session=a"}, []string{"Cookie: session=b"}, true},
		{"without replay, credentials do not count", plain, []string{"Authorization: Bearer a"}, []string{"Authorization: Bearer b"}, true},
	} {
		if got := op(tc.c, tc.a...) == op(tc.c, tc.b...); got != tc.same {
			t.Errorf("%s: same operation %v, want %v", tc.name, got, tc.same)
		}
	}
	if err := (&IdempotencyConfig{Replay: true, Identity: []string{"Bad Field"}}).provision(); err == nil {
		t.Error("an identity field with a space: provisioned")
	}
}
