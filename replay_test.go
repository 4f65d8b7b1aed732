package cascade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// opsUpstream is an API whose operations are not idempotent: each POST
// runs once more (counted per path) and answers with its number.
//
//	/op     201, a JSON body naming the operation and echoing the request body, a cookie
//	/fail   503 the first time, then as /op
//	/big    200, a 2 MiB body
//	/sse    200, an event stream
//	/hold   as /op, once release is closed
//	/slow   as /op, after slow
type opsUpstream struct {
	addr    string
	slow    time.Duration
	release chan struct{}
	open    func() // lets the operations held on /hold answer
	mu      sync.Mutex
	runs    map[string]int
}

func newOpsUpstream(t *testing.T, slow time.Duration) *opsUpstream {
	t.Helper()
	u := &opsUpstream{slow: slow, release: make(chan struct{}), runs: map[string]int{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = l.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(u.serve)}
	go srv.Serve(l)
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() { close(u.release) })
		srv.Close()
	})
	u.open = func() { once.Do(func() { close(u.release) }) }
	return u
}

func (u *opsUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.runs[r.URL.Path]++
	n := u.runs[r.URL.Path]
	u.mu.Unlock()
	switch r.URL.Path {
	case "/fail":
		if n == 1 {
			http.Error(w, "the database is down", http.StatusServiceUnavailable)
			return
		}
	case "/big":
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write([]byte(strings.Repeat("x", 2<<20)))
		return
	case "/sse":
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
		}
		return
	case "/v1/customers": // as Stripe's API answers
		if n == 1 {
			time.Sleep(u.slow)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", "req_"+strconv.Itoa(n))
		fmt.Fprintf(w, `{"id":"cus_%d","object":"customer","email":%q}`, n, r.PostFormValue("email"))
		return
	case "/hold":
		<-u.release
	case "/slow":
		time.Sleep(u.slow)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Operation", strconv.Itoa(n))
	w.Header().Add("X-Multi", "a")
	w.Header().Add("X-Multi", "b")
	http.SetCookie(w, &http.Cookie{Name: "session", Value: "s" + strconv.Itoa(n)})
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"operation":%d,"path":%q,"body":%q}`, n, r.URL.Path, body)
}

func (u *opsUpstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.runs[path]
}

// sameResponse fails t unless retry is first as it was sent — status,
// every header field but the replay's mark and Set-Cookie (which is not
// kept), body — marked replayed, without a cookie.
func sameResponse(t *testing.T, first, retry resp) {
	t.Helper()
	if retry.status != first.status || retry.body != first.body {
		t.Fatalf("a retry got %d %q, want the first response %d %q", retry.status, truncate(retry.body, 200), first.status, truncate(first.body, 200))
	}
	if got := retry.header.Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("a replayed response's Idempotent-Replayed: %q, want true", got)
	}
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("the first response is marked replayed")
	}
	if c := retry.header.Values("Set-Cookie"); len(c) != 0 {
		t.Fatalf("a replayed response sets cookies %q: they are not kept without replay_cookies", c)
	}
	for name, want := range first.header {
		if name == "Set-Cookie" {
			continue
		}
		if got := retry.header[name]; strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("a replayed response's %s: %q, want the first's %q", name, got, want)
		}
	}
	for name := range retry.header {
		if _, ok := first.header[name]; !ok && name != "Idempotent-Replayed" {
			t.Fatalf("a replayed response has %s: %q, which the first had not", name, retry.header[name])
		}
	}
}

// replayRateLimit is the rate_limit block of the replay tests: a user's
// requests per day (a calendar window: a slow machine counts the same).
func replayRateLimit(storeBlock, idempotency string) string {
	return fmt.Sprintf(`
		tree api {
			tier user {header.X-User} {
				limit 100/day
			}
		}
		idempotency {
			in_flight 1m
			replay max_body 1MiB
			%s
		}
		%s`, idempotency, storeBlock)
}

// replayStores are the stores replay is tested on: memory, a Redis and
// the 3-master Cluster.
func replayStores() []storeKind {
	cluster := storeKind{"cluster", func(t *testing.T) string {
		return fmt.Sprintf("store redis {\n address %s\n key_prefix t%d:\n timeout 2s\n }",
			strings.Join(redistest.SharedCluster(t).Addrs(), " "), testSeq.Add(1))
	}}
	return []storeKind{memoryStore(), redisStore(), cluster}
}

// TestReplay: through a real Caddy with an upstream that counts its
// operations, on the memory store, a Redis and a Cluster — a POST with a
// key runs the upstream once for any number of retries, each answered
// with the first response; a reused key with another body is refused
// (422); a duplicate in flight is refused (409); after a 5xx a retry is a
// new attempt; a response too large to keep, or a stream, is refused on
// retry (409 not replayable) and never run again; retries are not
// charged; requests without a key, and another user's, are their own.
func TestReplay(t *testing.T) {
	for _, k := range replayStores() {
		t.Run(k.name, func(t *testing.T) {
			up := newOpsUpstream(t, 0)
			site, _ := proxiedSite(t, up.addr, replayRateLimit(k.block(t), ""))
			base := site
			send := func(path, user, key, body string) resp {
				t.Helper()
				h := []string{"X-User: " + user}
				if key != "" {
					h = append(h, "Idempotency-Key: "+key)
				}
				return post(t, base+path, body, h...)
			}

			first := send("/op", "alice", "k1", `{"amount":5}`)
			if first.status != http.StatusCreated || !strings.Contains(first.body, `"operation":1`) {
				t.Fatalf("the first request: %d %s", first.status, first.body)
			}
			for range 5 {
				sameResponse(t, first, send("/op", "alice", "k1", `{"amount":5}`))
			}
			if n := up.count("/op"); n != 1 {
				t.Fatalf("the upstream ran /op %d times for a request and 5 retries, want 1", n)
			}
			// Not charged: alice has 100 − 1 (the first) − 1 (this one) left.
			if r := send("/op", "alice", "", `{}`); remainingIn(t, r) != 98 {
				t.Fatalf("after a request and its retries, a new one: %s, want 98 left (retries uncharged)", r.header.Get("RateLimit"))
			}

			// The key reused for another body: 422, never run.
			r := send("/op", "alice", "k1", `{"amount":500}`)
			if r.status != http.StatusUnprocessableEntity || !strings.HasSuffix(r.problem(t)["type"].(string), "#idempotency-key-reused") {
				t.Fatalf("a reused key with another body: %d %s, want 422 idempotency-key-reused", r.status, r.body)
			}
			// Another user's request with the same key and body is another request.
			if r := send("/op", "bob", "k1", `{"amount":5}`); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("bob's request with alice's key: %d %v, want it run", r.status, r.header)
			}
			// So is one with other credentials, whatever the tree identifies.
			if r := post(t, base+"/op", `{"amount":5}`, "X-User: alice", "Idempotency-Key: k1", "Authorization: Bearer mallory"); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("alice's key with other credentials: %d %v, want it run", r.status, r.header)
			}
			if n := up.count("/op"); n != 4 {
				t.Fatalf("the upstream ran /op %d times, want 4 (alice's first, her keyless one, bob's, mallory's)", n)
			}

			// A duplicate while the first is in flight: 409.
			held := make(chan resp, 1)
			go func() { held <- send("/hold", "alice", "k2", `{}`) }()
			waitFor(t, "the held request to reach the upstream", func() bool { return up.count("/hold") > 0 })
			if r := send("/hold", "alice", "k2", `{}`); r.status != http.StatusConflict || !strings.HasSuffix(r.problem(t)["type"].(string), "#idempotency-in-flight") {
				t.Fatalf("a duplicate in flight: %d %s, want 409 idempotency-in-flight", r.status, r.body)
			}
			up.open()
			heldFirst := <-held
			if heldFirst.status != http.StatusCreated {
				t.Fatalf("the held request: %d %s", heldFirst.status, heldFirst.body)
			}
			sameResponse(t, heldFirst, send("/hold", "alice", "k2", `{}`))

			// A 5xx first: a retry is a new attempt, which is then kept.
			if r := send("/fail", "alice", "k3", `{}`); r.status != http.StatusServiceUnavailable {
				t.Fatalf("/fail: %d, want 503", r.status)
			}
			second := send("/fail", "alice", "k3", `{}`)
			if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("a retry after a 503: %d replayed=%q, want a new attempt (201)", second.status, second.header.Get("Idempotent-Replayed"))
			}
			sameResponse(t, second, send("/fail", "alice", "k3", `{}`))
			if n := up.count("/fail"); n != 2 {
				t.Fatalf("the upstream ran /fail %d times, want 2 (the 503, the new attempt)", n)
			}

			// Too large to keep, or a stream: refused on retry, never run again.
			for _, path := range []string{"/big", "/sse"} {
				if r := send(path, "alice", "k4"+path, `{}`); r.status != http.StatusOK {
					t.Fatalf("%s: %d", path, r.status)
				}
				for range 2 {
					r := send(path, "alice", "k4"+path, `{}`)
					p := r.problem(t)
					if r.status != http.StatusConflict || !strings.HasSuffix(p["type"].(string), "#idempotency-not-replayable") || p["original_status"] != float64(200) {
						t.Fatalf("a retry of %s: %d %s, want 409 idempotency-not-replayable with original_status 200", path, r.status, r.body)
					}
				}
				if n := up.count(path); n != 1 {
					t.Fatalf("the upstream ran %s %d times, want 1", path, n)
				}
			}

			// Without a key, every request runs.
			for range 2 {
				send("/op", "carol", "", `{}`)
			}
			if n := up.count("/op"); n != 6 {
				t.Fatalf("the upstream ran /op %d times, want 6 (two keyless of carol's)", n)
			}
		})
	}
}

// TestReplayCookies: replay_cookies keeps Set-Cookie for replay.
func TestReplayCookies(t *testing.T) {
	up := newOpsUpstream(t, 0)
	site, _ := proxiedSite(t, up.addr, replayRateLimit(memoryStore().block(t), "replay_cookies"))
	url := site + "/op"
	first := post(t, url, "{}", "X-User: alice", "Idempotency-Key: c1")
	retry := post(t, url, "{}", "X-User: alice", "Idempotency-Key: c1")
	if got, want := retry.header.Values("Set-Cookie"), first.header.Values("Set-Cookie"); len(want) != 1 || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("with replay_cookies a retry sets %q, want the first's %q", got, want)
	}
	if up.count("/op") != 1 {
		t.Fatalf("the upstream ran %d times, want 1", up.count("/op"))
	}
}

// TestReplayClientTimedOut: a client that gives up before the response
// and retries is answered with the response of the operation its first
// attempt started — which ran once, to its end, although its client had
// gone — after 409s while it still ran.
func TestReplayClientTimedOut(t *testing.T) {
	up := newOpsUpstream(t, time.Second)
	site, _ := proxiedSite(t, up.addr, replayRateLimit(memoryStore().block(t), ""))
	url := site + "/slow"
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(`{"amount":5}`))
	req.Header.Set("X-User", "alice")
	req.Header.Set("Idempotency-Key", "t1")
	if res, err := httpClient(t).Do(req); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		if res != nil {
			res.Body.Close()
		}
		t.Fatalf("the first attempt: %v, want it to time out", err)
	}
	conflicts := 0
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := post(t, url, `{"amount":5}`, "X-User: alice", "Idempotency-Key: t1")
		if r.status == http.StatusConflict {
			conflicts++
			if time.Now().After(deadline) {
				t.Fatal("still in flight after 30 s")
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || !strings.Contains(r.body, `"operation":1`) {
			t.Fatalf("a retry: %d %v %s, want the first attempt's response replayed", r.status, r.header, r.body)
		}
		break
	}
	if conflicts == 0 {
		t.Fatal("no retry was refused while the operation ran (409)")
	}
	if n := up.count("/slow"); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

// TestReplayCurl: curl's own retry loop (a timeout, then 409s, retried)
// ends with the one operation's response.
func TestReplayCurl(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is needed (scripts/test.sh installs it)")
	}
	up := newOpsUpstream(t, 1500*time.Millisecond)
	site, _ := proxiedSite(t, up.addr, replayRateLimit(memoryStore().block(t), ""))
	out, err := exec.Command("curl", "-sS", "--retry", "8", "--retry-all-errors", "--retry-delay", "1", "--max-time", "1",
		"-H", "X-User: alice", "-H", "Idempotency-Key: curl-1", "-H", "Content-Type: application/json",
		"--data", `{"amount":5}`, site+"/slow").Output()
	if err != nil {
		t.Fatalf("curl: %v: %s", err, out)
	}
	if !strings.Contains(string(out), `"operation":1`) {
		t.Fatalf("curl ended with %s, want the operation's response", out)
	}
	if n := up.count("/slow"); n != 1 {
		t.Fatalf("the upstream ran %d times under curl's retries, want 1", n)
	}
}

// TestReplayStripeSDK: the official Stripe SDK, which sends an
// Idempotency-Key with every POST and retries on a timeout and on a 409,
// creates one customer per call against an API that did not build
// idempotency, although its first attempt timed out while the API was
// still creating it.
func TestReplayStripeSDK(t *testing.T) {
	up := newOpsUpstream(t, 1500*time.Millisecond)
	site, _ := proxiedSite(t, up.addr, fmt.Sprintf(`
		tree api {
			tier key {header.Authorization} {
				limit 100/day
			}
		}
		idempotency {
			replay
		}
		%s`, memoryStore().block(t)))
	var out struct {
		Results []struct {
			OK      bool
			ID      string
			Status  int
			Message string
		}
		Attempts []struct {
			At  int
			Key string
		}
	}
	runNode(t, "stripe.mjs", map[string]any{"base": site, "calls": 2, "timeout": 500, "retries": 8}, &out)
	if len(out.Results) != 2 || !out.Results[0].OK || out.Results[0].ID != "cus_1" || !out.Results[1].OK || out.Results[1].ID != "cus_2" {
		t.Fatalf("the SDK's two creations: %+v, want cus_1 and cus_2", out.Results)
	}
	if n := up.count("/v1/customers"); n != 2 {
		t.Fatalf("the API created %d customers, want 2", n)
	}
	// The first creation took several attempts (a timeout, then 409s
	// while the API ran), all with one key; the second, one.
	if len(out.Attempts) < 3 {
		t.Fatalf("the SDK made %d attempts, want the first creation retried: %+v", len(out.Attempts), out.Attempts)
	}
	firstKey := out.Attempts[0].Key
	for _, a := range out.Attempts[:len(out.Attempts)-1] {
		if a.Key == "" || a.Key != firstKey {
			t.Fatalf("the first creation's attempts sent keys %+v, want one key", out.Attempts)
		}
	}
	if last := out.Attempts[len(out.Attempts)-1].Key; last == firstKey || last == "" {
		t.Fatalf("the second creation sent key %q, want a new one", last)
	}
}

// TestReplayAcrossInstances: two Caddy processes sharing a Redis (and
// the Cluster): a retry sent to the other instance is answered from the
// store; and when the instance running a first request is killed, its
// retries are refused as in flight until in_flight, then are a new
// attempt.
func TestReplayAcrossInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs Caddy processes")
	}
	for _, dep := range redistest.Deployments() {
		t.Run(dep.Name, func(t *testing.T) {
			up := newOpsUpstream(t, 0)
			block := fmt.Sprintf(`
			tree api {
				tier user {header.X-User} {
					limit 100/day
				}
			}
			idempotency {
				in_flight 4s
				replay
			}
			store redis {
				address %s
				key_prefix replay%d:
				timeout 2s
			}`, strings.Join(dep.Addrs(t), " "), testSeq.Add(1))
			ps := startProxies(t, 2, block, up.addr)
			a, b := ps[0].site, ps[1].site

			first := post(t, a+"op", `{"amount":5}`, "X-User: alice", "Idempotency-Key: x1")
			if first.status != http.StatusCreated {
				t.Fatalf("the first request, on A: %d %s", first.status, first.body)
			}
			sameResponse(t, first, post(t, b+"op", `{"amount":5}`, "X-User: alice", "Idempotency-Key: x1"))
			sameResponse(t, first, post(t, a+"op", `{"amount":5}`, "X-User: alice", "Idempotency-Key: x1"))
			if n := up.count("/op"); n != 1 {
				t.Fatalf("the upstream ran %d times, want 1", n)
			}

			// A is killed while its request is in the upstream.
			go func() {
				req, _ := http.NewRequest("POST", a+"hold", strings.NewReader("{}"))
				req.Header.Set("X-User", "alice")
				req.Header.Set("Idempotency-Key", "x2")
				if res, err := http.DefaultClient.Do(req); err == nil {
					res.Body.Close()
				}
			}()
			waitFor(t, "the held request to reach the upstream", func() bool { return up.count("/hold") > 0 })
			killed := time.Now()
			ps[0].stop()
			r := post(t, b+"hold", "{}", "X-User: alice", "Idempotency-Key: x2")
			if r.status != http.StatusConflict {
				t.Fatalf("a retry on B right after the kill (%v): %d %s, want 409 in flight", time.Since(killed), r.status, r.body)
			}
			up.open() // new attempts are answered at once
			var after resp
			for deadline := time.Now().Add(30 * time.Second); ; {
				after = post(t, b+"hold", "{}", "X-User: alice", "Idempotency-Key: x2")
				if after.status != http.StatusConflict || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if after.status != http.StatusCreated || after.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("a retry once in_flight is over: %d replayed=%q, want a new attempt", after.status, after.header.Get("Idempotent-Replayed"))
			}
			if waited := time.Since(killed); waited < 2*time.Second {
				t.Fatalf("the new attempt came %v after the kill, well before in_flight (4s)", waited)
			}
			if n := up.count("/hold"); n != 2 {
				t.Fatalf("the upstream ran /hold %d times, want 2 (the killed instance's, the new attempt)", n)
			}
			sameResponse(t, after, post(t, b+"hold", "{}", "X-User: alice", "Idempotency-Key: x2"))
		})
	}
}

// waitFor polls cond until it holds, for at most 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for %s", what)
		}
	}
}
