package admin

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// FuzzOverrideBody: whatever the body of PUT /rate_limit/overrides/…, the
// API answers a 4xx error or an override that the tree's check and the
// runtime state take; nothing panics, and an accepted override is in force.
func FuzzOverrideBody(f *testing.F) {
	tr := &hierarchy.Tree{Name: "api", Tiers: []*hierarchy.Tier{{Name: "user", Key: "{http.request.header.X-User}",
		Limits: []*hierarchy.Limit{{Count: 10, Per: "min"}, {Count: 1000, Per: "h", Dimension: "tokens"}}}}}
	if err := tr.Compile(); err != nil {
		f.Fatal(err)
	}
	rt, err := control.New(control.NewMemoryBackend(), control.Options{Poll: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { rt.Close() })
	e := engine.New(engine.Config{Trees: []*engine.Tree{{Tree: tr}}, Runtime: rt})
	f.Cleanup(e.Close)
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for _, body := range []string{
		`{"limits":[{"count":5,"per":"min"},{"count":50,"per":"h","dimension":"tokens"}],"note":"pilot"}`,
		`{"limits":[{"count":5,"per":"min"}]}`,
		`{"limits":[{"count":5,"per":"min"}],"replace":true}`,
		`{"unlimited":true,"expires":"2027-01-01T00:00:00Z"}`,
		`{"limits":[null]}`,
		`{"limits":[{"count":-1,"per":"fortnight"}],"unlimited":true}`,
		`{"expires":"yesterday"}`,
		`{"limits":[]}{"limits":[]}`,
		`{"note":"` + strings.Repeat("x", 2000) + `"}`,
	} {
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("PUT", "/rate_limit/overrides/api/user/alice", strings.NewReader(body))
		alice := "alice"
		o, err := overrideOf(r, "api", "user", &alice, now)
		if err != nil {
			var apiErr caddy.APIError
			if !errors.As(err, &apiErr) || apiErr.HTTPStatus/100 != 4 {
				t.Fatalf("body %q: %v, want a 4xx API error", body, err)
			}
			return
		}
		if e.CheckOverride(o) != nil {
			return
		}
		if _, err := rt.SetOverride(context.Background(), o); err != nil {
			return // refused by the runtime's own checks (a note too long, …)
		}
		if rt.Snapshot().Override("api", "user", "alice") == nil {
			t.Fatalf("body %q: accepted, but not in force", body)
		}
		if _, err := rt.DeleteOverride(context.Background(), "api", "user", "alice"); err != nil {
			t.Fatal(err)
		}
	})
}
