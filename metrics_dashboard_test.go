package cascade

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// metricsHas fails t for each of want that the admin API's /metrics lacks.
func metricsHas(t *testing.T, api string, want ...string) {
	t.Helper()
	_, body := call(t, "GET", api+"/metrics", nil, nil)
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("no %s in /metrics", w)
		}
	}
	if t.Failed() {
		var ours []string
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, "cascade_") {
				ours = append(ours, l)
			}
		}
		t.Logf("cascade's series:\n%s", strings.Join(ours, "\n"))
	}
}

// TestMetricsWouldBlock: each denial by a tree in warn or shadow mode is
// counted for that tree and its mode, once per request, the denials of
// two trees of one request both; every request passes.
func TestMetricsWouldBlock(t *testing.T) {
	site, api := adminSite(t, `
		mode warn
		tree dashwarn {
			tier user {header.X-User} {
				limit 1/min
			}
		}
		tree dashshadow {
			tier team {header.X-Team} {
				limit 2/min
			}
		}
`+memoryStore().block(t))
	if code, body := call(t, "PUT", api+"/rate_limit/mode/dashshadow", `{"mode":"shadow"}`, nil); code != http.StatusOK {
		t.Fatalf("mode: %d %s", code, body)
	}
	for i, req := range []struct{ user, team string }{
		{"alice", "red"},  // charged: alice 1/1, red 1/2
		{"alice", "red"},  // warn denies (nothing charged)
		{"bob", "red"},    // charged: bob 1/1, red 2/2
		{"carol", "red"},  // shadow denies
		{"alice", "red"},  // both deny
		{"alice", "blue"}, // warn denies
	} {
		if r := do(t, "GET", site, "X-User: "+req.user, "X-Team: "+req.team); r.status != http.StatusOK {
			t.Fatalf("request %d: %d, want it passed", i, r.status)
		}
	}
	metricsHas(t, api,
		`cascade_would_block_total{mode="warn",tree="dashwarn"} 3`,
		`cascade_would_block_total{mode="shadow",tree="dashshadow"} 2`,
	)
}

// TestMetricsWouldBlockEnforced: a refusal of an enforcing tree is not a
// would-be block.
func TestMetricsWouldBlockEnforced(t *testing.T) {
	site, api := adminSite(t, `
		tree dashenforce {
			tier user {header.X-User} {
				limit 1/min
			}
		}
`+memoryStore().block(t))
	if got := admitN(t, 3, site, "X-User: alice"); got != 1 {
		t.Fatalf("admitted %d of 3 under 1/min", got)
	}
	_, body := call(t, "GET", api+"/metrics", nil, nil)
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "cascade_would_block_total{") && strings.Contains(l, `tree="dashenforce"`) {
			t.Errorf("an enforced refusal counted as a would-be block: %s", l)
		}
	}
}

// TestMetricsLimitCapacity: each configured limit of each tier, and of
// its plan blocks, is exported with its capacity; a value's override is
// not.
func TestMetricsLimitCapacity(t *testing.T) {
	site, api := adminSite(t, `
		tree dashcap {
			plan {header.X-Plan} default free
			tier org {header.X-Org} {
				limit 100/min burst 150
				limit 5000 tokens/h
				plan pro {
					limit 1000/min
				}
				plan enterprise unlimited
			}
			tier user {header.X-User} {
				limit 5/min
				value vip {
					limit 7/min
				}
			}
		}
		cost tokens {header.X-Tokens}
`+memoryStore().block(t))
	admitN(t, 2, site, "X-Org: acme", "X-User: alice", "X-Tokens: 10")
	metricsHas(t, api,
		`cascade_limit_capacity{dimension="requests",plan="",policy="org.requests",tier="org",tree="dashcap"} 150`,
		`cascade_limit_capacity{dimension="tokens",plan="",policy="org.tokens",tier="org",tree="dashcap"} 5000`,
		`cascade_limit_capacity{dimension="requests",plan="pro",policy="org",tier="org",tree="dashcap"} 1000`,
		`cascade_limit_capacity{dimension="requests",plan="",policy="user",tier="user",tree="dashcap"} 5`,
	)
	_, body := call(t, "GET", api+"/metrics", nil, nil)
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "cascade_limit_capacity{") && strings.Contains(l, `tree="dashcap"`) &&
			(strings.HasSuffix(l, " 7") || strings.Contains(l, `plan="enterprise"`)) {
			t.Errorf("exported: %s", l)
		}
	}
}

// TestMetricsBuildInfo: the build's version and Go's are exported.
func TestMetricsBuildInfo(t *testing.T) {
	_, api := adminSite(t, opsTree+memoryStore().block(t))
	metricsHas(t, api, `cascade_build_info{go_version="`+runtime.Version()+`",version="`+moduleVersion()+`"} 1`)
	if v := moduleVersion(); v != "(devel)" {
		t.Errorf("version %q in a test binary, want (devel)", v)
	}
}

// TestMetricsStoresOfOneRedis: two stores on one Redis (other key
// prefixes) share a name in the metrics; the scrape still succeeds, with
// one series each.
func TestMetricsStoresOfOneRedis(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	block := func(prefix string) string {
		return fmt.Sprintf("store redis {\n address %s\n key_prefix %s%d:\n insecure_bus\n }", addr, prefix, testSeq.Add(1))
	}
	_, api := adminSiteThen(t, `
		tree one {
			tier user {header.X-User} {
				limit 10/day
			}
		}
		`+block("a"), `rate_limit {
		tree two {
			tier user {header.X-User} {
				limit 10/day
			}
		}
		`+block("b")+`
	}
	respond "ok" 200`)
	code, body := call(t, "GET", api+"/metrics", nil, nil)
	if code != 200 || !strings.Contains(body, `cascade_store_breaker_open{node=`) {
		t.Fatalf("/metrics with two stores on one Redis: %d\n%s", code, grepLines(body, "cascade_store_breaker"))
	}
}

// TestMetricsWouldBlockBesideEnforced: a tree in shadow mode that denies a
// request a tree that enforces admits is counted too (the engine decides
// such a request again on the enforcing tree alone).
func TestMetricsWouldBlockBesideEnforced(t *testing.T) {
	site, api := adminSite(t, `
		tree besideenforce {
			tier user {header.X-User} {
				limit 100/day
			}
		}
		tree besideshadow {
			tier team {header.X-Team} {
				limit 1/day
			}
		}
`+memoryStore().block(t))
	if code, body := call(t, "PUT", api+"/rate_limit/mode/besideshadow", `{"mode":"shadow"}`, nil); code != http.StatusOK {
		t.Fatalf("mode: %d %s", code, body)
	}
	if n := admitN(t, 3, site, "X-User: alice", "X-Team: red"); n != 3 {
		t.Fatalf("admitted %d of 3: the enforcing tree admits them all", n)
	}
	metricsHas(t, api, `cascade_would_block_total{mode="shadow",tree="besideshadow"} 2`)
}
