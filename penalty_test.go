package cascade

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestPenalty: a user the tier's limit refuses three times within a minute
// is refused outright for an hour from the third refusal (problem type
// penalty, Retry-After of the hour), on the memory store and on Redis;
// other users are not; the box is no policy in the headers; an admin reset
// lets the user out and forgets its strikes.
func TestPenalty(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		url, api := adminSite(t, `
		tree api {
			tier user {header.X-User} {
				limit 2/min
				penalty 1h after 3 within 1m
			}
		}
		`+storeBlock)
		box := func() {
			t.Helper()
			for i := range 2 {
				r := do(t, "GET", url, "X-User: ann")
				if r.status != 200 || r.header.Get("RateLimit-Policy") != `"user";q=2;w=60` {
					t.Fatalf("request %d: %d, RateLimit-Policy %q", i, r.status, r.header.Get("RateLimit-Policy"))
				}
			}
			for i := range 2 {
				r := do(t, "GET", url, "X-User: ann")
				if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "#limited") {
					t.Fatalf("refusal %d: %d %s, want 429 limited", i, r.status, r.body)
				}
			}
			// The third refusal boxes, and says so; so does the next.
			for i := range 2 {
				r := do(t, "GET", url, "X-User: ann")
				retry, _ := strconv.Atoi(r.header.Get("Retry-After"))
				if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "#penalty") || retry < 3590 || retry > 3601 {
					t.Fatalf("refusal %d in the box: %d, Retry-After %q, %s; want 429 penalty with an hour to wait", i, r.status, r.header.Get("Retry-After"), r.body)
				}
				if r.header.Get("RateLimit") != "" {
					t.Fatalf("a penalty refusal has RateLimit %q: the box is no policy", r.header.Get("RateLimit"))
				}
			}
		}
		box()
		if r := do(t, "GET", url, "X-User: bob"); r.status != 200 {
			t.Fatalf("another user: %d", r.status)
		}
		// A reset of the user lets it out, strikes forgotten: boxed again
		// only after three more refusals.
		if code, body := call(t, "POST", api+"/rate_limit/reset?tree=api&user=ann", nil, nil); code != 200 {
			t.Fatalf("reset: %d %s", code, body)
		}
		box()
	})
}

// TestPenaltyErrors: a bad penalty is refused at the line that wrote it,
// naming the fix.
func TestPenaltyErrors(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"no count", "penalty 10m", "usage: penalty <for> after <refusals> [within <duration>]"},
		{"bad count", "penalty 10m after many", `penalty after "many": give a whole number of refusals`},
		{"zero count", "penalty 10m after 0", "penalty 10m after 0: give how many refusals put a value in the box"},
		{"bad duration", "penalty soon after 3", `penalty "soon": give how long a value is refused`},
		{"bad window", "penalty 10m after 3 within ever", `penalty within "ever"`},
		{"extra", "penalty 10m after 3 within 1m please", "usage: penalty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := configError(t, tc.body, "")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "Caddyfile:13") { // the penalty's line, after the global options
				t.Fatalf("error %v does not name the penalty's line", err)
			}
		})
	}
}

// TestPenaltyJSON: the Caddyfile's penalty is the tier's JSON penalty.
func TestPenaltyJSON(t *testing.T) {
	cfg, err := adapt(t, globalOptions("")+"http://127.0.0.1:1 {\n rate_limit {\n tree t {\n tier k fixed {\n limit 1/s\n penalty 10m after 5 within 1m\n }\n }\n }\n}")
	if err != nil {
		t.Fatal(err)
	}
	if want := `"penalty":{"after":5,"for":"10m","within":"1m"}`; !strings.Contains(string(cfg), want) {
		t.Fatalf("%s\nwant %s", cfg, want)
	}
	if err := caddy.Validate(mustConfig(t, cfg)); err != nil {
		t.Fatal(err)
	}
}
