package cascade

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-cascade/cascade/engine"
)

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

// TestNetworkOf: keys that are IP addresses of a family with a prefix
// become their network, in the form mholt/caddy-ratelimit gives them;
// everything else is left alone. Each case is also checked against
// mholt's reading through package net.
func TestNetworkOf(t *testing.T) {
	for _, tt := range []struct {
		name   string
		v4, v6 int
		key    string
		want   string
	}{
		{"v4 /24", 24, 0, "192.0.2.7", "192.0.2.0/24"},
		{"v4 /24 other host", 24, 0, "192.0.2.250", "192.0.2.0/24"},
		{"v4 /16", 16, 0, "198.51.100.9", "198.51.0.0/16"},
		{"v4 /32", 32, 0, "192.0.2.7", "192.0.2.7/32"},
		{"v4 /1", 1, 0, "192.0.2.7", "128.0.0.0/1"},
		{"v4 without v4 prefix", 0, 64, "192.0.2.7", "192.0.2.7"},
		{"v6 /64", 0, 64, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"v6 /48", 0, 48, "2001:db8:1:2:3:4:5:6", "2001:db8:1::/48"},
		{"v6 /128", 0, 128, "2001:db8::1", "2001:db8::1/128"},
		{"v6 upper case", 0, 64, "2001:DB8::ABCD", "2001:db8::/64"},
		{"v6 loopback", 0, 64, "::1", "::/64"},
		{"v6 without v6 prefix", 24, 0, "2001:db8::1", "2001:db8::1"},
		{"v4-mapped v6 is v4", 24, 64, "::ffff:192.0.2.7", "192.0.2.0/24"},
		{"v4-mapped v6, no v4 prefix", 0, 64, "::ffff:192.0.2.7", "::ffff:192.0.2.7"},
		{"v4-mapped v6 in hex", 24, 0, "::ffff:c000:207", "192.0.2.0/24"},
		{"v6 with a zone", 0, 64, "fe80::1%eth0", "fe80::1%eth0"},
		{"host:port", 24, 64, "192.0.2.7:443", "192.0.2.7:443"},
		{"bracketed v6", 24, 64, "[2001:db8::1]", "[2001:db8::1]"},
		{"leading zero", 24, 64, "192.0.2.07", "192.0.2.07"},
		{"CIDR already", 24, 64, "192.0.2.0/24", "192.0.2.0/24"},
		{"name", 24, 64, "alice", "alice"},
		{"empty", 24, 64, "", ""},
		{"list of addresses", 24, 64, "192.0.2.7, 198.51.100.1", "192.0.2.7, 198.51.100.1"},
	} {
		if got := engine.NetworkOf(tt.key, tt.v4, tt.v6); got != tt.want {
			t.Errorf("%s: engine.NetworkOf(%q, %d, %d) = %q, want %q", tt.name, tt.key, tt.v4, tt.v6, got, tt.want)
		}
		if got := mholtNetwork(tt.key, tt.v4, tt.v6); got != tt.want {
			t.Errorf("%s: mholt's reading gives %q, want %q", tt.name, got, tt.want)
		}
	}
}

// mholtNetwork is mholt/caddy-ratelimit's reading of ipv4_prefix and
// ipv6_prefix, through package net (ParseIP, To4, CIDRMask, IPNet.String),
// against which engine.NetworkOf is checked.
func mholtNetwork(key string, v4, v6 int) string {
	ip := net.ParseIP(key)
	if ip == nil {
		return key
	}
	bits, size := v6, 128
	if ip.To4() != nil {
		bits, size = v4, 32
	}
	if bits == 0 {
		return key
	}
	mask := net.CIDRMask(bits, size)
	return (&net.IPNet{IP: ip.Mask(mask), Mask: mask}).String()
}

// TestNetworkOfMatchesMholt: for random addresses of both families
// (IPv4-mapped ones and upper-case ones included) and every prefix
// length, engine.NetworkOf agrees with mholt's reading.
func TestNetworkOfMatchesMholt(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 2000; i++ {
		var b [16]byte
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		var key string
		switch i % 4 {
		case 0:
			key = netip.AddrFrom4([4]byte(b[:4])).String()
		case 1:
			key = netip.AddrFrom16(b).String()
		case 2:
			key = "::ffff:" + netip.AddrFrom4([4]byte(b[:4])).String()
		default:
			b[0] = 0x20 // a global unicast address, sometimes with runs of zeros
			for j := 4; j < 16; j++ {
				if rng.UintN(3) == 0 {
					b[j] = 0
				}
			}
			key = strings.ToUpper(netip.AddrFrom16(b).String())
		}
		v4, v6 := int(rng.UintN(33)), int(rng.UintN(129))
		if got, want := engine.NetworkOf(key, v4, v6), mholtNetwork(key, v4, v6); got != want {
			t.Fatalf("engine.NetworkOf(%q, %d, %d) = %q; mholt's reading %q", key, v4, v6, got, want)
		}
	}
}

// TestLogKey: with log_key, the "rate limited" line names the bucket key
// that refused; without it, the key (a client identity) is not logged.
func TestLogKey(t *testing.T) {
	for _, logKey := range []bool{false, true} {
		block := fmt.Sprintf("rate_limit {\n zone TestLogKey_%v {\n  key {http.request.header.X-Client}\n  events 1\n  window 1m\n }\n", logKey)
		if logKey {
			block += " log_key\n"
		}
		h, err := parse(t, block+"}")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		core, logs := observer.New(zapcore.DebugLevel)
		h.logger = zap.New(core)
		cfg := h.engine.Config() // the engine logs denials
		cfg.Logger = h.logger
		h.engine.Close()
		h.engine = engine.New(cfg)
		for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-Client", "alice-7")
			r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer()))
			w := httptest.NewRecorder()
			if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil || w.Code != want {
				t.Fatalf("request %d: %d %v, want %d", i, w.Code, err, want)
			}
		}
		lines := logs.FilterMessage("rate limited").All()
		if len(lines) != 1 {
			t.Fatalf("log_key %v: %d \"rate limited\" lines, want 1", logKey, len(lines))
		}
		key, has := lines[0].ContextMap()["key"].(string)
		if has != logKey || (logKey && !strings.Contains(key, "alice-7")) {
			t.Errorf("log_key %v: key field %q (present %v)", logKey, key, has)
		}
		h.Cleanup()
		cancel()
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
		h.metrics.observe(&decision{Decision: engine.Decision{Reason: "ok"}}, 0) // nil-safe when disabled
		h.metrics.reconcile(nil)
		h.Cleanup()
		cancel()
	}
}
