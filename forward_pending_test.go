package cascade

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"
)

// heldEndpoint runs a decision endpoint whose LLM tree charges each org
// the tokens of its chat completions, reconciled from reports, with the
// forwarded block's options, and returns its URL.
func heldEndpoint(t *testing.T, options string) string {
	t.Helper()
	port := freePort(t)
	startCaddy(t, fmt.Sprintf(`http://127.0.0.1:%d {
	rate_limit {
		forwarded {
			report /report
			%s
		}
		store memory {
			name held%d
		}
		tree llm {
			tier org {header.X-Org} {
				limit 100000000 tokens/h
			}
		}
		cost tokens llm {
			reconcile
		}
	}
}
`, port, options, testSeq.Add(1)), "servers {\n trusted_proxies static 127.0.0.1/32\n }")
	return fmt.Sprintf("http://127.0.0.1:%d/", port)
}

// heldDecide has org's chat completion decided, and returns the id of
// the decision held for its report.
func heldDecide(t *testing.T, endpoint, org string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", endpoint, strings.NewReader(`{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"x"}]}`))
	for k, v := range map[string]string{"X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/v1/chat/completions",
		"X-Org": org, "Content-Type": "application/json"} {
		req.Header.Set(k, v)
	}
	res, err := httpClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	id := res.Header.Get(decisionHeader)
	if res.StatusCode != 200 || id == "" {
		t.Fatalf("%s's decision: %d, id %q", org, res.StatusCode, id)
	}
	return id
}

// heldReport reports a response for the decision id and returns the
// status: 204 reconciled, 404 no longer held.
func heldReport(t *testing.T, endpoint, id string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", endpoint+"report", strings.NewReader(`{"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`))
	req.Header.Set(decisionHeader, id)
	req.Header.Set("Content-Type", "application/json")
	res, err := httpClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// TestForwardedHeldPerTenant: one tenant's flood of decisions waiting for
// their reports drops its own oldest, never another tenant's: when every
// place is taken (max_held), and at its own bound (max_held_per_tenant).
func TestForwardedHeldPerTenant(t *testing.T) {
	for _, tc := range []struct{ name, options string }{
		{"every place taken", "max_held 4"},
		{"at the tenant's bound", "max_held 100\n max_held_per_tenant 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoint := heldEndpoint(t, tc.options)
			quiet := heldDecide(t, endpoint, "quiet")
			var loud []string
			for range 20 {
				loud = append(loud, heldDecide(t, endpoint, "loud"))
			}
			if s := heldReport(t, endpoint, quiet); s != 204 {
				t.Fatalf("the quiet tenant's report after the loud one's flood: %d, want 204 (still held)", s)
			}
			if s := heldReport(t, endpoint, loud[0]); s != 404 {
				t.Fatalf("the loud tenant's oldest: %d, want 404 (dropped)", s)
			}
			if s := heldReport(t, endpoint, loud[len(loud)-1]); s != 204 {
				t.Fatalf("the loud tenant's newest: %d, want 204", s)
			}
		})
	}
}

// TestHeldBounds drives held with random tenants and reports against its
// contract: never more than max in all nor perTenant of one tenant; a
// decision is dropped only for its age, for its own tenant's bound, or
// when all is full and its tenant holds at least as many as any other.
func TestHeldBounds(t *testing.T) {
	c := &ForwardedConfig{MaxHeld: 20, MaxHeldPerTenant: 8}
	const ttl = 150 * time.Millisecond
	p := &pendingReports{}
	now := time.Unix(0, 0)
	live := map[string]*pendingDecision{} // what the model holds
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		now = now.Add(time.Millisecond)
		if rng.IntN(4) == 0 && len(live) > 0 { // a report
			for id, hd := range live {
				got := p.take(id, now)
				if want := !now.After(hd.expires); (got != nil) != want {
					t.Fatalf("step %d: take %s: %v, want held %v", i, id, got, want)
				}
				delete(live, id)
				break
			}
			continue
		}
		tenant := fmt.Sprintf("t%d", min(rng.IntN(6), rng.IntN(6))) // some tenants busier
		counts := map[string]int{}                                  // held once the expired are dropped
		for _, hd := range live {
			if !now.After(hd.expires) {
				counts[hd.tenant]++
			}
		}
		ownBound := counts[tenant] >= c.MaxHeldPerTenant
		if ownBound {
			counts[tenant]--
		}
		full := sum(counts) >= c.MaxHeld
		hd := &pendingDecision{id: fmt.Sprint(i), tenant: tenant, expires: now.Add(ttl)}
		p.add(hd, c, now)
		for id, l := range live {
			if p.byID[id] != nil {
				continue
			}
			switch {
			case now.After(l.expires):
			case ownBound && l.tenant == tenant:
				ownBound = false
			case full && counts[l.tenant] >= maxOf(counts):
				full = false
			default:
				t.Fatalf("step %d: %s's decision dropped (held %v, adding for %s)", i, l.tenant, counts, tenant)
			}
			delete(live, id)
		}
		live[hd.id] = hd
		per := map[string]int{}
		for _, l := range live {
			per[l.tenant]++
		}
		if len(live) != len(p.byID) || len(live) > c.MaxHeld {
			t.Fatalf("step %d: %d held (%d in the model), max %d", i, len(p.byID), len(live), c.MaxHeld)
		}
		for tn, n := range per {
			if n > c.MaxHeldPerTenant || p.tenants[tn].queue.n != n {
				t.Fatalf("step %d: %s holds %d (%d counted), bound %d", i, tn, n, p.tenants[tn].queue.n, c.MaxHeldPerTenant)
			}
		}
	}
}

func sum(m map[string]int) (s int) {
	for _, n := range m {
		s += n
	}
	return s
}

func maxOf(m map[string]int) (x int) {
	for _, n := range m {
		x = max(x, n)
	}
	return x
}
