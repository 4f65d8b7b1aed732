package cascade

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// The configuration examples of mholt/caddy-ratelimit's README, quoted as
// they are there: v0.1.0's (the release) and master's (which adds
// ipv4_prefix/ipv6_prefix and disable_metrics). Both READMEs have the
// first three.

// mholtReadmeCaddyfile is the README's "Caddyfile example".
const mholtReadmeCaddyfile = `:80

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
`

// mholtReadmeOrder is the README's global option to order rate_limit.
const mholtReadmeOrder = `{
	order rate_limit after basic_auth
}
`

// mholtReadmeJSON is the README's "JSON example".
const mholtReadmeJSON = `{
	"apps": {
		"http": {
			"servers": {
				"demo": {
					"listen": [":80"],
					"routes": [
						{
							"handle": [
								{
									"handler": "rate_limit",
									"rate_limits": {
										"static_example": {
											"match": [
												{"method": ["GET"]}
											],
											"key": "static",
											"window": "1m",
											"max_events": 100
										},
										"dynamic_example": {
											"key": "{http.request.remote.host}",
											"window": "5s",
											"max_events": 2
										}
									},
									"distributed": {},
									"log_key": true
								},
								{
									"handler": "static_response",
									"body": "I'm behind the rate limiter!"
								}
							]
						}
					]
				}
			}
		}
	}
}`

// mholtReadmePrefixCaddyfile is master's "Network prefix rate limiting"
// Caddyfile (a handler directive, so it goes in a site).
const mholtReadmePrefixCaddyfile = `rate_limit {
	zone per_network {
		key         {remote_host}
		events      100
		window      1m
		ipv6_prefix 64
	}
}`

// mholtReadmePrefixJSON is master's "Network prefix rate limiting" handler JSON.
const mholtReadmePrefixJSON = `{
	"handler": "rate_limit",
	"rate_limits": {
		"per_network": {
			"key": "{http.request.remote.host}",
			"window": "1m",
			"max_events": 100,
			"ipv6_prefix": 64
		}
	}
}`

// TestMholtReadmeConfigsLoad: every configuration example of mholt's
// READMEs (v0.1.0 and master) adapts and provisions in Cascade unmodified,
// and means there what it means in mholt.
//
// Not here, because they are no configuration in mholt either: the syntax
// summaries (<name>, <duration>, ...; the JSON one also has a trailing
// comma), for which the last case writes every subdirective with values;
// and the route example's "..." elisions, filled in below.
func TestMholtReadmeConfigsLoad(t *testing.T) {
	site := func(body string) string { return ":80 {\n" + body + "\n}\n" }
	tests := []struct {
		name      string
		caddyfile string // or
		json      string // a whole config
		want      []string
	}{
		{name: "Caddyfile example (v0.1.0, master)", caddyfile: mholtReadmeCaddyfile, want: []string{
			`"static_example":{"key":"static","match":[{"method":["GET"]}],"max_events":100,"window":60000000000}`,
			`"dynamic_example":{"key":"{http.request.remote.host}","max_events":2,"window":5000000000}`,
			`"log_key":true`, `"distributed":{}`,
		}},
		{name: "order global option (v0.1.0, master), with the Caddyfile example",
			caddyfile: mholtReadmeOrder + "\n" + mholtReadmeCaddyfile, want: []string{`"log_key":true`}},
		{name: "route block (v0.1.0, master), elisions filled in", caddyfile: site(`route {
	# Uncritical resource without rate limit
	respond /ping "pong"

	# Apply rate limit
	rate_limit {
		zone dynamic_example {
			key    {remote_host}
			events 2
			window 5s
		}
	}

	# Critical resources after rate limiting
	respond "critical"
}`), want: []string{`"dynamic_example"`}},
		{name: "network prefix Caddyfile (master)", caddyfile: site(mholtReadmePrefixCaddyfile), want: []string{
			`"per_network":{"ipv6_prefix":64,"key":"{http.request.remote.host}","max_events":100,"window":60000000000}`,
		}},
		{name: "JSON example (v0.1.0, master)", json: mholtReadmeJSON},
		{name: "network prefix JSON (master)",
			json: `{"apps":{"http":{"servers":{"demo":{"listen":[":80"],"routes":[{"handle":[` + mholtReadmePrefixJSON + `]}]}}}}}`},
		{name: "every subdirective of the syntax (master)", caddyfile: site(`rate_limit {
	zone all_options {
		match {
			method GET POST
		}
		key         {remote_host}
		window      10s
		events      5
		ipv4_prefix 24
		ipv6_prefix 64
	}
	distributed {
		read_interval  5s
		write_interval 5s
		purge_age 1h
	}
	log_key
	disable_metrics
	storage file_system /tmp/caddy-ratelimit
	jitter  0.2
	sweep_interval 1m
}
respond "ok"`), want: []string{
			`"all_options":{"ipv4_prefix":24,"ipv6_prefix":64,"key":"{http.request.remote.host}","match":[{"method":["GET","POST"]}],"max_events":5,"window":10000000000}`,
			`"jitter":0.2`, `"log_key":true`, `"disable_metrics":true`, `"sweep_interval":60000000000`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := []byte(tt.json)
			if tt.caddyfile != "" {
				var warnings []caddyconfig.Warning
				var err error
				cfg, warnings, err = caddyconfig.GetAdapter("caddyfile").Adapt([]byte(tt.caddyfile), nil)
				if err != nil {
					t.Fatalf("does not adapt: %v\n%s", err, tt.caddyfile)
				}
				for _, w := range warnings {
					t.Logf("adapter warning: %s", w)
				}
			}
			var c caddy.Config
			dec := json.NewDecoder(strings.NewReader(string(cfg)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&c); err != nil {
				t.Fatalf("config does not decode: %v\n%s", err, cfg)
			}
			c.Admin = &caddy.AdminConfig{Disabled: true}
			if err := caddy.Validate(&c); err != nil { // provisions every module, starts nothing
				t.Fatalf("does not provision: %v\n%s", err, cfg)
			}
			compact := compactJSON(t, cfg)
			for _, w := range tt.want {
				if !strings.Contains(compact, w) {
					t.Errorf("config lacks %s\n%s", w, compact)
				}
			}
		})
	}
}

// compactJSON is b without spaces, object keys sorted.
func compactJSON(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
