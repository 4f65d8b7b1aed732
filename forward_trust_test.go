package cascade

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// endpointRateLimit is a decision endpoint's rate_limit block (forwarded
// with the given block) on the memory store named store: by-client paths
// limited to 2 a minute per client address ({client_ip}), dear paths to
// 1 a minute per user.
func endpointRateLimit(forwarded, store string) string {
	return fmt.Sprintf(`	rate_limit {
		forwarded %s
		store memory {
			name %s
		}
		tree clients {
			match {
				path /by-client*
			}
			tier client {client_ip} {
				limit 2/min
			}
		}
		tree dear {
			match {
				path /dear*
			}
			tier user {header.X-User} {
				missing shared
				limit 1/min
			}
		}
	}
`, forwarded, store)
}

// startEndpoints runs two decision endpoints with the same trees on one
// memory store: untrusted's server trusts only 10.0.0.0/8, so that this
// test (on 127.0.0.1) is not its trusted proxy; trusted's trusts
// 127.0.0.1 (strictly: right to left, when strict). It returns their URLs.
func startEndpoints(t *testing.T, forwarded string, strict bool) (untrusted, trusted string) {
	t.Helper()
	u, tr := freePort(t), freePort(t)
	store := fmt.Sprintf("fwd%d", testSeq.Add(1))
	strictOpt := ""
	if strict {
		strictOpt = "trusted_proxies_strict"
	}
	sites := fmt.Sprintf("http://127.0.0.1:%d {\n%s}\nhttp://127.0.0.1:%d {\n%s}\n",
		u, endpointRateLimit(forwarded, store), tr, endpointRateLimit(forwarded, store))
	startCaddy(t, sites, fmt.Sprintf(`servers :%d {
		trusted_proxies static 10.0.0.0/8
	}
	servers :%d {
		trusted_proxies static 127.0.0.1/32
		%s
	}`, u, tr, strictOpt))
	return fmt.Sprintf("http://127.0.0.1:%d/", u), fmt.Sprintf("http://127.0.0.1:%d/", tr)
}

// send sends a request with headers given as "Name: value" strings, a
// header named twice sent on two lines.
func send(t *testing.T, method, url string, headers ...string) resp {
	t.Helper()
	return request(t, http.Header.Add, method, url, headers...)
}

// statuses sends the same request n times and returns the statuses.
func statuses(t *testing.T, n int, url string, headers ...string) []int {
	t.Helper()
	var got []int
	for range n {
		got = append(got, send(t, "GET", url, headers...).status)
	}
	return got
}

func wantStatuses(t *testing.T, what string, got []int, want ...int) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
}

// TestForwardedUntrustedPeer: a peer that is not one of the server's
// trusted proxies cannot have a forwarded request decided (it would drain
// another client's bucket, or rotate fake addresses) nor report: 403
// #untrusted-proxy, and nothing is charged, as the same client's full
// allowance through the trusted proxy then shows.
func TestForwardedUntrustedPeer(t *testing.T) {
	untrusted, trusted := startEndpoints(t, "{\n report /report\n }", false)
	victim := []string{"X-Forwarded-Method: GET", "X-Forwarded-Uri: /by-client", "X-Forwarded-For: 203.0.113.7"}
	for i := range 4 {
		r := send(t, "GET", untrusted, victim...)
		if r.status != http.StatusForbidden || r.header.Get("RateLimit") != "" {
			t.Fatalf("attempt %d from an untrusted peer: %d %v %s", i, r.status, r.header, r.body)
		}
		if p := r.problem(t); !strings.HasSuffix(p["type"].(string), "#untrusted-proxy") || !strings.Contains(p["detail"].(string), "trusted_proxies") {
			t.Fatalf("the refusal: %v", p)
		}
	}
	if r := send(t, "POST", untrusted+"report", "Cascade-Decision: x"); r.status != http.StatusForbidden {
		t.Fatalf("a report from an untrusted peer: %d %s", r.status, r.body)
	}
	wantStatuses(t, "the victim through its trusted proxy", statuses(t, 3, trusted, victim...), 200, 200, 429)
}

// TestForwardedNoTrustedProxies: a decision endpoint whose server trusts
// no proxy says so when it starts (WARN), and refuses every request.
func TestForwardedNoTrustedProxies(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	startCaddy(t, fmt.Sprintf("http://127.0.0.1:%d {\n%s}\n", port, endpointRateLimit("", fmt.Sprintf("fwd%d", testSeq.Add(1)))),
		fmt.Sprintf("log {\n output file %s\n level WARN\n }", logFile))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	wantStatuses(t, "forwarded requests", statuses(t, 2, url, "X-Forwarded-Uri: /by-client", "X-Forwarded-For: 203.0.113.7"), 403, 403)
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "its server has none") || !strings.Contains(string(b), `"level":"warn"`) {
		t.Fatalf("no warning that the server trusts no proxy:\n%s", b)
	}
	if n := strings.Count(string(b), "refused a peer that is not one of its server's trusted_proxies (logged once)"); n != 1 {
		t.Fatalf("the refusal of an untrusted peer logged %d times, want once:\n%s", n, b)
	}
}

// TestForwardedClient: behind a trusted proxy the client is the one Caddy
// resolves from X-Forwarded-For ({client_ip}), not the last address of
// the header's first line: two clients behind the same proxy hop have a
// bucket each. With trusted_proxies_strict, Caddy reads every line right
// to left, so the fake addresses a client prepends (rotated to get a
// fresh bucket each time) are never its key.
func TestForwardedClient(t *testing.T) {
	_, trusted := startEndpoints(t, "", false)
	alice := []string{"X-Forwarded-Uri: /by-client", "X-Forwarded-For: 203.0.113.7, 10.0.0.2"}
	bob := []string{"X-Forwarded-Uri: /by-client", "X-Forwarded-For: 203.0.113.8, 10.0.0.2"}
	wantStatuses(t, "alice", statuses(t, 2, trusted, alice...), 200, 200)
	wantStatuses(t, "bob, behind the same hop", statuses(t, 2, trusted, bob...), 200, 200)
	wantStatuses(t, "alice again", statuses(t, 1, trusted, alice...), 429)

	_, strict := startEndpoints(t, "", true)
	var got []int
	for i := range 3 {
		got = append(got, send(t, "GET", strict, "X-Forwarded-Uri: /by-client",
			fmt.Sprintf("X-Forwarded-For: 198.51.100.%d", i+1), // the client's own line, a fresh fake each time
			"X-Forwarded-For: 203.0.113.9").status)             // the line its proxy added
	}
	wantStatuses(t, "a client rotating fake addresses", got, 200, 200, 429)
}

// TestForwardedTwoURIs: a request that names two original URIs (a proxy
// that sets X-Original-URI and passes a client's X-Forwarded-Uri: /cheap)
// is refused 400 #bad-forwarded, charging nothing, rather than decided as
// the cheap one while the proxy serves the dear one; uri_header names the
// one header to read.
func TestForwardedTwoURIs(t *testing.T) {
	_, trusted := startEndpoints(t, "", false)
	for _, two := range [][]string{
		{"X-Forwarded-Uri: /cheap", "X-Original-URI: /dear"},
		{"X-Forwarded-Uri: /cheap", "X-Forwarded-Uri: /dear"},
	} {
		r := send(t, "GET", trusted, append(two, "X-User: u")...)
		if r.status != http.StatusBadRequest || r.header.Get("RateLimit") != "" {
			t.Fatalf("%v: %d %v %s", two, r.status, r.header, r.body)
		}
		if p := r.problem(t); !strings.HasSuffix(p["type"].(string), "#bad-forwarded") || !strings.Contains(p["detail"].(string), "two") {
			t.Fatalf("%v: %v", two, p)
		}
	}
	wantStatuses(t, "u on the dear path", statuses(t, 2, trusted, "X-Original-URI: /dear", "X-User: u"), 200, 429)

	_, nginx := startEndpoints(t, "{\n uri_header X-Original-URI\n }", false)
	wantStatuses(t, "with uri_header X-Original-URI", statuses(t, 2, nginx, "X-Forwarded-Uri: /cheap", "X-Original-URI: /dear", "X-User: v"), 200, 429)
	if r := send(t, "GET", nginx, "X-Forwarded-Uri: /dear", "X-User: w"); r.status != 400 || !strings.Contains(r.body, "X-Original-URI (uri_header)") {
		t.Fatalf("without the uri_header: %d %s", r.status, r.body)
	}
}
