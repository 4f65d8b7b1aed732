package cascade

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// remainingIn reads r= of a RateLimit header.
func remainingIn(t *testing.T, r resp) int {
	t.Helper()
	m := regexp.MustCompile(`;r=(\d+)`).FindStringSubmatch(r.header.Get("RateLimit"))
	if m == nil {
		t.Fatalf("no remaining in RateLimit %q (status %d, %s)", r.header.Get("RateLimit"), r.status, r.body)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestIdempotency: on both stores, a request with an idempotency key is
// charged once — a duplicate while it is in flight gets 409 and no charge,
// a retry once it has ended (or once its client gave up waiting) is
// admitted without a charge — while a refused request records nothing
// (its retry is decided afresh) and two identities never share a key.
func TestIdempotency(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		up := newCountingUpstream(t, 0)
		port := freePort(t)
		startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree api {
			tier user {header.X-User} {
				limit 10 tokens/h
			}
		}
		cost tokens {header.X-Cost} default 1
		idempotency {
			in_flight 1m
			retries   2
		}
		%s
	}
	reverse_proxy %s
}
`, port, storeBlock, up.addr))
		url := fmt.Sprintf("http://127.0.0.1:%d/", port)
		send := func(user, key string, cost int) resp {
			t.Helper()
			return do(t, "POST", url, "X-User: "+user, "Idempotency-Key: "+key, "X-Cost: "+strconv.Itoa(cost))
		}

		// A first request, in flight in the upstream.
		var wg sync.WaitGroup
		defer wg.Wait()
		defer up.open()
		wg.Go(func() {
			if r := send("alice", `"k1"`, 3); r.status != 200 {
				t.Errorf("the first request: %d %s", r.status, r.body)
			}
		})
		<-up.arrived
		// Its duplicate: 409, charged nothing.
		dup := send("alice", "k1", 3)
		if dup.status != http.StatusConflict || !strings.HasSuffix(dup.problem(t)["type"].(string), "#idempotency-in-flight") {
			t.Fatalf("a duplicate in flight: %d %s, want 409 idempotency-in-flight", dup.status, dup.body)
		}
		if ra, _ := strconv.Atoi(dup.header.Get("Retry-After")); ra < 1 || ra > 60 {
			t.Fatalf("a duplicate's Retry-After %q, want within the minute in_flight", dup.header.Get("Retry-After"))
		}

		// A second, whose client gives up waiting for it once the upstream
		// has it (decided and charged: 2 tokens).
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", url, nil)
		req.Header.Set("X-User", "alice")
		req.Header.Set("Idempotency-Key", "k2")
		req.Header.Set("X-Cost", "2")
		gaveUp := make(chan error, 1)
		go func() {
			res, err := httpClient(t).Do(req)
			if err == nil {
				res.Body.Close()
				err = fmt.Errorf("answered %d", res.StatusCode)
			}
			gaveUp <- err
		}()
		select {
		case <-up.arrived:
		case <-time.After(30 * time.Second):
			t.Fatal("the second request did not reach the upstream within 30 s")
		}
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Fatalf("a request held in the upstream, its client gone: %v, want it cancelled", err)
		}
		up.open()
		wg.Wait()

		// Retries of both once they have ended: admitted, charged nothing
		// (10 − 3 − 2 = 5 left).
		for _, k := range []string{"k1", "k2"} {
			deadline := time.Now().Add(10 * time.Second)
			r := send("alice", k, 3)
			for r.status == http.StatusConflict && time.Now().Before(deadline) { // the server sees the client gone
				time.Sleep(10 * time.Millisecond)
				r = send("alice", k, 3)
			}
			if r.status != 200 || remainingIn(t, r) != 5 {
				t.Fatalf("a retry of %s: %d, %s; want 200 with 5 left (not charged again)", k, r.status, r.header.Get("RateLimit"))
			}
		}
		// Two retries are let through (retries 2); the third is charged
		// as a new request.
		if r := send("alice", "k1", 3); r.status != 200 || remainingIn(t, r) != 5 {
			t.Fatalf("the second retry of k1: %d, %s; want 200 with 5 left", r.status, r.header.Get("RateLimit"))
		}
		if r := send("alice", "k1", 1); r.status != 200 || remainingIn(t, r) != 4 {
			t.Fatalf("the third retry of k1: %d, %s; want 200, charged as new (4 left)", r.status, r.header.Get("RateLimit"))
		}
		// The same key on another target, or with a method that needs
		// none, is another request: charged.
		if r := do(t, "POST", url+"other", "X-User: alice", "Idempotency-Key: k2", "X-Cost: 1"); r.status != 200 || remainingIn(t, r) != 3 {
			t.Fatalf("k2 on another target: %d, %s; want 200, charged (3 left)", r.status, r.header.Get("RateLimit"))
		}
		if r := do(t, "GET", url, "X-User: alice", "Idempotency-Key: k2", "X-Cost: 1"); r.status != 200 || remainingIn(t, r) != 2 {
			t.Fatalf("k2 on a GET: %d, %s; want 200, charged (2 left)", r.status, r.header.Get("RateLimit"))
		}
		if r := send("alice", "k3", 1); r.status != 200 || remainingIn(t, r) != 1 {
			t.Fatalf("a new key: %d, %s; want 200 with 1 left", r.status, r.header.Get("RateLimit"))
		}
		// A refused request records nothing: its retry is decided afresh.
		if r := send("alice", "k4", 2); r.status != http.StatusTooManyRequests {
			t.Fatalf("2 tokens of 1 left: %d", r.status)
		}
		if r := send("alice", "k4", 1); r.status != 200 || remainingIn(t, r) != 0 {
			t.Fatalf("the refused key retried within the limit: %d, %s; want 200, charged (0 left)", r.status, r.header.Get("RateLimit"))
		}
		// Another identity with the same key is another request.
		if r := send("bob", "k1", 3); r.status != 200 || remainingIn(t, r) != 7 {
			t.Fatalf("bob's k1: %d, %s; want 200, charged on bob's bucket (7 left)", r.status, r.header.Get("RateLimit"))
		}
		// A key that cannot be one is refused.
		if r := send("bob", strings.Repeat("x", 256), 1); r.status != http.StatusBadRequest {
			t.Fatalf("a 256-byte key: %d, want 400", r.status)
		}
		if r := do(t, "GET", url, "X-User: bob", "X-Cost: 1"); r.status != 200 || remainingIn(t, r) != 6 {
			t.Fatalf("without a key: %d, %s; want 200, charged", r.status, r.header.Get("RateLimit"))
		}
	})
}

// TestIdempotencyErrors: idempotency's configuration errors name the fix.
func TestIdempotencyErrors(t *testing.T) {
	for _, tt := range []struct{ name, handler, want string }{
		{"argument", "idempotency on", "takes no arguments"},
		{"bad ttl", "idempotency {\n ttl soon\n }", `ttl "soon"`},
		{"in flight beyond ttl", "idempotency {\n ttl 1m\n in_flight 1h\n }", "a record must outlive its request"},
		{"unknown option", "idempotency {\n size 3\n }", `unknown option "size"`},
		{"bad retries", "idempotency {\n retries many\n }", `retries "many"`},
		{"behind a decision endpoint", "idempotency\n forwarded", "decision endpoint"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := configError(t, "", tt.handler)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// TestIdempotencyKeyReuse: one idempotency key reused for unrelated
// requests (other methods, targets, costs) after the first ended gets
// nothing free: they are other requests, charged (and refused once the
// limits are spent).
func TestIdempotencyKeyReuse(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		up := newCountingUpstream(t, 0)
		up.open()
		port := freePort(t)
		startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree api {
			tier user {header.X-User} {
				limit 2/h
				limit 100 tokens/h
				limit 1 concurrent
			}
		}
		cost tokens {header.X-Cost} default 1
		idempotency
		%s
	}
	reverse_proxy %s
}
`, port, storeBlock, up.addr))
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		if r := do(t, "POST", base+"/v1/first", "X-User: mallory", "Idempotency-Key: k", "X-Cost: 1"); r.status != 200 {
			t.Fatalf("first: %d", r.status)
		}
		ok := 0
		for i := range 20 {
			r := do(t, []string{"GET", "POST", "DELETE"}[i%3], base+"/other/"+strconv.Itoa(i), "X-User: mallory", "Idempotency-Key: k", "X-Cost: 100")
			if r.status == 200 {
				ok++
			}
		}
		t.Logf("limit 2/h and 100 tokens/h: 20 unrelated requests reusing one key -> %d admitted, upstream served %d", ok, up.served.Load())
		if ok > 1 {
			t.Errorf("%d of 20 unrelated requests admitted with a reused key, want at most the 1 the limits allow", ok)
		}
	})
}

// TestIdempotentRetriesPayTheirUsage: retrying an LLM call with one
// idempotency key buys no tokens. The first request is charged its
// estimate and reconciled to the 900 tokens the upstream reports; its one
// free retry (retries defaults to 1) is charged nothing up front but its
// own 900 tokens after; the next is charged as a new request. Without
// both, four calls with one key used 3,600 tokens and were charged 900.
func TestIdempotentRetriesPayTheirUsage(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		up := newFakeLLM(t, 30, 870)
		url := llmSiteLimit(t, up.srv.URL, storeBlock+"\n\t\tidempotency", "reconcile {\n provider openai\n }", "limit 5000 tokens/h") + "/v1/chat/completions"
		body := fmt.Sprintf(pythagoras, "")
		start := time.Now()
		for i := range 3 {
			// A retry sent just as the request before it ends may find it
			// still in flight (409): it is sent again.
			deadline := time.Now().Add(propagation)
			for {
				r := post(t, url, body, "X-User: eve", "Idempotency-Key: k1")
				if r.status == 200 {
					break
				}
				if r.status != http.StatusConflict || time.Now().After(deadline) {
					t.Fatalf("call %d: %d %s", i+1, r.status, r.body)
				}
				time.Sleep(20 * time.Millisecond) // waiting for the request before to end, not timing an algorithm
			}
		}
		// Three calls reached the upstream: 3 × 900 tokens, whatever was
		// estimated or replayed.
		waitRemaining(t, url, body, 64, 5000-3*900, start, "X-User: eve")
		if n := len(up.bodies); n < 3 {
			t.Fatalf("the upstream saw %d calls, want 3", n)
		}
	})
}

// TestIdempotencyOneFreeRetryByDefault: without retries set, one retry of
// a request is admitted without a charge and the next is charged as a new
// request: each key buys one free repeat, not three.
func TestIdempotencyOneFreeRetryByDefault(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url := site(t, fmt.Sprintf(`
	tree api {
		tier user {header.X-User} {
			limit 10/h
		}
	}
	idempotency
	%s
`, storeBlock))
		var left []int
		for i := range 3 {
			deadline := time.Now().Add(propagation)
			for {
				r := do(t, "POST", url, "X-User: zoe", "Idempotency-Key: k1")
				if r.status == 200 {
					left = append(left, remainingIn(t, r))
					break
				}
				if r.status != http.StatusConflict || time.Now().After(deadline) {
					t.Fatalf("call %d: %d %s", i+1, r.status, r.body)
				}
				time.Sleep(20 * time.Millisecond) // waiting for the request before to end, not timing an algorithm
			}
		}
		if want := []int{9, 9, 8}; !slices.Equal(left, want) {
			t.Fatalf("remaining after a request and two retries: %v, want %v (one free retry)", left, want)
		}
	})
}
