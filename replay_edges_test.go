package cascade

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// attackUpstream serves the operations of the tests of replay's edges, as
// an attacker would use them. Each counts its runs.
//
//	/transfer  201, the account its session cookie names (an API that
//	           authenticates by cookie, not Authorization)
//	/report    200, a body of reportSize bytes
//	/generate  200 application/x-ndjson, a line every 100 ms for 6 s, as
//	           an LLM server streams a generation (Ollama's /api/generate);
//	           it notes when its request was cancelled and how many runs
//	           are active at once
type attackUpstream struct {
	addr      string
	mu        sync.Mutex
	runs      map[string]int
	active    atomic.Int32
	maxActive atomic.Int32
	cancelled chan time.Time
}

const reportSize = 1_000_000

func newAttackUpstream(t *testing.T) *attackUpstream {
	t.Helper()
	u := &attackUpstream{runs: map[string]int{}, cancelled: make(chan time.Time, 8)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = l.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(u.serve)}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return u
}

func (u *attackUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.runs[r.URL.Path]++
	n := u.runs[r.URL.Path]
	u.mu.Unlock()
	switch r.URL.Path {
	case "/transfer":
		c, err := r.Cookie("session")
		if err != nil {
			http.Error(w, "log in", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transfer":%d,"account":%q,"iban":"secret-of-%s","body":%q}`, n, c.Value, c.Value, body)
	case "/grpcish":
		// A failure reported in an unannounced trailer (as gRPC reports
		// its status, the HTTP status being 200).
		w.Header().Set("Content-Type", "application/grpc")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush() // chunked: the trailers can follow
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "14")
		w.Header().Set(http.TrailerPrefix+"Grpc-Message", "backend unavailable")
	case "/export":
		// Its status at once, its body a second later (an export job).
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		time.Sleep(time.Second)
		fmt.Fprintf(w, "export %d", n)
	case "/report":
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write([]byte(strings.Repeat("r", reportSize)))
	case "/generate":
		a := u.active.Add(1)
		defer u.active.Add(-1)
		for m := u.maxActive.Load(); a > m && !u.maxActive.CompareAndSwap(m, a); m = u.maxActive.Load() {
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		for i := range 60 {
			fmt.Fprintf(w, "{\"token\":%d,\"run\":%d}\n", i, n)
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				u.cancelled <- time.Now()
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

func (u *attackUpstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[path]
}

// TestReplayCallerByCookie: behind a tree keyed by address (two users
// behind one NAT share its values), a caller identified by its session
// cookie never gets another's kept response: the cookie is part of the
// record's identity.
func TestReplayCallerByCookie(t *testing.T) {
	up := newAttackUpstream(t)
	site, _ := proxiedSite(t, up.addr, fmt.Sprintf(`
		tree api {
			tier ip {remote_host} {
				limit 1000/day
			}
		}
		idempotency {
			replay
		}
		%s`, memoryStore().block(t)))
	url := site + "/transfer"
	alice := post(t, url, `{"amount":5}`, "Cookie: session=alice", "Idempotency-Key: order-42")
	if alice.status != http.StatusCreated || !strings.Contains(alice.body, `"account":"alice"`) {
		t.Fatalf("alice's transfer: %d %s", alice.status, alice.body)
	}
	mallory := post(t, url, `{"amount":5}`, "Cookie: session=mallory", "Idempotency-Key: order-42")
	if strings.Contains(mallory.body, "secret-of-alice") || mallory.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("mallory (another session, same address, alice's key) got alice's kept response: %d replayed=%q %s",
			mallory.status, mallory.header.Get("Idempotent-Replayed"), mallory.body)
	}
}

// TestReplayFreeBounded: a kept response is answered free retries times
// (10 by default); after that a replay is charged as any request, so a
// caller whose limit is spent is refused (429), and replaying one large
// response is no way to read it from the store without bound.
func TestReplayFreeBounded(t *testing.T) {
	up := newAttackUpstream(t)
	site, _ := proxiedSite(t, up.addr, fmt.Sprintf(`
		tree api {
			tier user {header.X-User} {
				limit 2/day
			}
		}
		idempotency {
			replay
		}
		%s`, redisStore().block(t)))
	url := site + "/report"
	if r := post(t, url, `{}`, "X-User: mallory", "Idempotency-Key: r1"); r.status != http.StatusOK || len(r.body) != reportSize {
		t.Fatalf("the first request: %d, %d bytes", r.status, len(r.body))
	}
	post(t, url, `{}`, "X-User: mallory") // spends the limit
	if r := post(t, url, `{}`, "X-User: mallory"); r.status != http.StatusTooManyRequests {
		t.Fatalf("the limit spent, a new request: %d, want 429", r.status)
	}
	served, refused := 0, 0
	for range 40 {
		r := post(t, url, `{}`, "X-User: mallory", "Idempotency-Key: r1")
		switch r.status {
		case http.StatusOK:
			served += len(r.body)
		case http.StatusTooManyRequests:
			refused++
		}
	}
	if up.count("/report") != 2 { // the keyed first, the keyless one
		t.Fatalf("the upstream ran %d times, want 2", up.count("/report"))
	}
	if refused == 0 {
		t.Fatalf("a caller over its limit (2/day) got 40 more answers, %d MB read from Redis and sent, none refused or charged", served>>20)
	}
}

// TestReplayDetachedBounded: a first request whose client left during a
// keepable response (an LLM generation streamed as ndjson) runs on, but
// not past in_flight: a retry after it, a new attempt, never runs beside
// it.
func TestReplayDetachedBounded(t *testing.T) {
	up := newAttackUpstream(t)
	site, _ := proxiedSite(t, up.addr, fmt.Sprintf(`
		tree api {
			tier user {header.X-User} {
				limit 100/day
			}
		}
		idempotency {
			in_flight 1s
			ttl 1h
			replay
		}
		%s`, memoryStore().block(t)))
	url := site + "/generate"
	req, _ := http.NewRequest("POST", url, strings.NewReader(`{"prompt":"hi"}`))
	req.Header.Set("X-User", "alice")
	req.Header.Set("Idempotency-Key", "g1")
	client := &http.Client{Transport: &http.Transport{}}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	if err != nil || !strings.Contains(line, `"token":0`) {
		t.Fatalf("the first line: %q %v", line, err)
	}
	res.Body.Close() // the user pressed stop: the client leaves
	client.CloseIdleConnections()
	left := time.Now()

	time.Sleep(1500 * time.Millisecond) // past in_flight
	retryAt := time.Since(left)
	retry := post(t, url, `{"prompt":"hi"}`, "X-User: alice", "Idempotency-Key: g1")
	select {
	case at := <-up.cancelled:
		t.Logf("the first run was cancelled %v after its client left", at.Sub(left))
	default:
	}
	if m := up.maxActive.Load(); m > 1 {
		t.Fatalf("one key ran the operation %d times at once: the first, detached since its client left, still ran when a retry %v later (past in_flight 1s) started a new one (retry: %d replayed=%q)",
			m, retryAt.Round(time.Millisecond), retry.status, retry.header.Get("Idempotent-Replayed"))
	}
}

// TestReplayTrailers: a response with trailers is not replayable, also
// when they were not announced (set after the body, as gRPC servers send
// grpc-status): a retry gets 409, never the body without its status.
func TestReplayTrailers(t *testing.T) {
	up := newAttackUpstream(t)
	site, _ := proxiedSite(t, up.addr, fmt.Sprintf(`
		tree api {
			tier user {header.X-User} {
				limit 100/day
			}
		}
		idempotency {
			replay
		}
		%s`, memoryStore().block(t)))
	url := site + "/grpcish"
	send := func() (*http.Response, string) {
		req, _ := http.NewRequest("POST", url, strings.NewReader("call"))
		req.Header.Set("X-User", "alice")
		req.Header.Set("Idempotency-Key", "t1")
		res, err := httpClient(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	first, _ := send()
	if first.Trailer.Get("Grpc-Status") != "14" {
		t.Fatalf("the first response's trailers: %v, want Grpc-Status 14", first.Trailer)
	}
	retry, body := send()
	if retry.StatusCode != http.StatusConflict && retry.Trailer.Get("Grpc-Status") != "14" {
		t.Fatalf("a retry of a response with trailers: %d replayed=%q %q, trailers %v: want 409 not replayable (or its trailers), got it replayed without them",
			retry.StatusCode, retry.Header.Get("Idempotent-Replayed"), body, retry.Trailer)
	}
}

// TestReplayChargeOnKeepsRecord: with charge_on, a response that does not
// count is given back when its status is written, but its record stays:
// a duplicate while its body is still coming is refused as in flight, and
// the upstream runs once.
func TestReplayChargeOnKeepsRecord(t *testing.T) {
	up := newAttackUpstream(t)
	site, _ := proxiedSite(t, up.addr, fmt.Sprintf(`
		tree api {
			tier user {header.X-User} {
				limit 100/day
			}
		}
		charge_on status 201
		idempotency {
			replay
		}
		%s`, memoryStore().block(t)))
	url := site + "/export"
	first := make(chan resp, 1)
	go func() { first <- post(t, url, `{}`, "X-User: alice", "Idempotency-Key: e1") }()
	waitFor(t, "the first export to reach the upstream", func() bool { return up.count("/export") > 0 })
	time.Sleep(200 * time.Millisecond) // its status written, its body still coming
	dup := post(t, url, `{}`, "X-User: alice", "Idempotency-Key: e1")
	<-first
	if n := up.count("/export"); n != 1 {
		t.Fatalf("the upstream ran /export %d times for one key: a duplicate while the first was in flight got %d %q (want 409 in flight)",
			n, dup.status, truncate(dup.body, 100))
	}
}
