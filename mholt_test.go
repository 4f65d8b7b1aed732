package cascade

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// mholtREADMECaddyfiles are the Caddyfiles of mholt/caddy-ratelimit's
// README (v0.1.0's, and the network prefix example its later README
// adds), as a user would paste them.
var mholtREADMECaddyfiles = map[string]string{
	"example": `:80

rate_limit {
	distributed
	zone static_example {
		match {
			method GET
		}
		key    static
		events 100
		window 1m
	}
	zone dynamic_example {
		key    {remote_host}
		events 2
		window 5s
	}
	log_key
}

respond "I'm behind the rate limiter!"
`,
	"network prefix": `:80

rate_limit {
	zone per_network {
		key         {remote_host}
		events      100
		window      1m
		ipv6_prefix 64
	}
}

respond "ok"
`,
	"every subdirective": `:80

rate_limit {
	zone z {
		match {
			method GET
		}
		key         {remote_host}
		window      1m
		events      10
		ipv4_prefix 24
		ipv6_prefix 0
	}
	distributed {
		read_interval  5s
		write_interval 5s
		purge_age      1m
	}
	log_key
	storage file_system /tmp/rl
	jitter  0.2
	sweep_interval 1m
	disable_metrics
}

respond "ok"
`,
}

// TestMholtREADMECaddyfilesLoad: mholt's README Caddyfiles adapt and
// provision in Cascade unmodified (caddy validate), every subdirective
// set as mholt sets it.
func TestMholtREADMECaddyfilesLoad(t *testing.T) {
	for name, cf := range mholtREADMECaddyfiles {
		t.Run(name, func(t *testing.T) {
			raw, err := adapt(t, cf)
			if err != nil {
				t.Fatalf("adapting: %v", err)
			}
			var cfg caddy.Config
			if err := json.Unmarshal(raw, &cfg); err != nil {
				t.Fatal(err)
			}
			if err := caddy.Validate(&cfg); err != nil {
				t.Fatalf("caddy validate: %v", err)
			}
		})
	}
	block := strings.SplitN(strings.SplitN(mholtREADMECaddyfiles["every subdirective"], "rate_limit", 2)[1], "respond", 2)[0]
	h, err := parse(t, "rate_limit"+block)
	if err != nil {
		t.Fatal(err)
	}
	z := h.RateLimits["z"]
	if !h.LogKey || !h.DisableMetrics || z == nil || z.IPv4Prefix != 24 || z.IPv6Prefix != 0 || h.Jitter != 0.2 {
		t.Fatalf("parsed %+v, zone %+v", h, z)
	}
}

// TestZonePrefixErrors: a prefix longer than its family's address is
// refused at its line, and in JSON at provision.
func TestZonePrefixErrors(t *testing.T) {
	for _, tt := range []struct{ line, want string }{
		{"ipv4_prefix 33", "zone z: ipv4_prefix 33: use 1 to 32 bits (24 groups a /24), or 0 for none, at Testfile:6"},
		{"ipv6_prefix 129", "zone z: ipv6_prefix 129: use 1 to 128 bits (64 groups a /64), or 0 for none, at Testfile:6"},
		{"ipv4_prefix -1", `ipv4_prefix "-1": use a non-negative whole number, at Testfile:6`},
		{"ipv4_prefix", "ipv4_prefix needs a number, at Testfile:6"},
	} {
		_, err := parse(t, "rate_limit {\n zone z {\n  key {remote_host}\n  events 2\n  window 5s\n  "+tt.line+"\n }\n}")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.line, err, tt.want)
		}
	}
	if _, err := (&Zone{Key: "{remote_host}", MaxEvents: 1, Window: caddy.Duration(1e9), IPv6Prefix: 200}).tree("z"); err == nil ||
		!strings.Contains(err.Error(), "ipv6_prefix 200: use 1 to 128 bits") {
		t.Errorf("JSON ipv6_prefix 200: %v", err)
	}
}

func TestNetworkOf(t *testing.T) {
	for _, tt := range []struct {
		key    string
		v4, v6 int
		want   string
	}{
		{"192.0.2.7", 24, 0, "192.0.2.0/24"},
		{"192.0.2.200", 24, 64, "192.0.2.0/24"},
		{"192.0.2.7", 0, 64, "192.0.2.7"},           // no IPv4 prefix: as it is
		{"192.0.2.7", 32, 0, "192.0.2.7/32"},        // mholt's form even for a whole address
		{"::ffff:192.0.2.7", 16, 0, "192.0.0.0/16"}, // IPv4-mapped: IPv4
		{"2001:db8:1:2:3:4:5:6", 0, 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 24, 0, "2001:db8:1:2:3:4:5:6"},
		{"2001:db8::1", 0, 48, "2001:db8::/48"},
		{"fe80::1%eth0", 0, 64, "fe80::1%eth0"}, // zoned: as it is (mholt cannot parse it either)
		{"alice", 24, 64, "alice"},
		{"", 24, 64, ""},
		{"192.0.2.7:443", 24, 0, "192.0.2.7:443"},
	} {
		if got := networkOf(tt.key, tt.v4, tt.v6); got != tt.want {
			t.Errorf("networkOf(%q, %d, %d) = %q, want %q", tt.key, tt.v4, tt.v6, got, tt.want)
		}
	}
}

// TestZoneIPv4PrefixSharesABucket: with ipv4_prefix 24, clients of one /24
// share a zone's bucket and a client of another /24 has its own; with
// ipv6_prefix 64, likewise for a /64.
func TestZoneIPv4PrefixSharesABucket(t *testing.T) {
	url := site(t, `
		zone net {
			key         {http.request.header.X-Client}
			events      2
			window      1m
			ipv4_prefix 24
			ipv6_prefix 64
		}`)
	for i, tt := range []struct {
		client string
		want   int
	}{
		{"192.0.2.7", 200},
		{"192.0.2.200", 200},
		{"192.0.2.99", 429}, // the /24's two are spent
		{"198.51.100.1", 200},
		{"2001:db8:1:2::1", 200},
		{"2001:db8:1:2:ffff::9", 200},
		{"2001:db8:1:2::77", 429},
		{"2001:db8:1:3::1", 200},
	} {
		if r := do(t, "GET", url, "X-Client: "+tt.client); r.status != tt.want {
			t.Fatalf("request %d from %s: %d, want %d", i, tt.client, r.status, tt.want)
		}
	}
}

// TestDisableMetrics: a handler with disable_metrics provisions without
// registering or counting anything.
func TestDisableMetrics(t *testing.T) {
	for _, disable := range []bool{false, true} {
		h, err := parse(t, fmt.Sprintf("rate_limit {\n zone z {\n  key static\n  events 1\n  window 1m\n }\n %s\n}", map[bool]string{true: "disable_metrics"}[disable]))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		if got := h.metrics == nil; got != disable {
			t.Errorf("disable_metrics %v: metrics nil = %v", disable, got)
		}
		families, err := ctx.GetMetricsRegistry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		registered := false
		for _, f := range families {
			registered = registered || strings.HasPrefix(f.GetName(), "cascade_")
		}
		if registered == disable {
			t.Errorf("disable_metrics %v: cascade metrics registered = %v", disable, registered)
		}
		h.metrics.observe(&decision{reason: "ok"}, 0) // nil-safe when disabled
		h.metrics.reconcile(nil)
		h.Cleanup()
		cancel()
	}
}
