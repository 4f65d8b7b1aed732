package cascade

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func parse(t testing.TB, input string) (*Handler, error) {
	t.Helper()
	// Tokenize, not NewTestDispenser: that one exits the process on a
	// lexer error (an unterminated heredoc), which fuzzing finds.
	tokens, err := caddyfile.Tokenize([]byte(input), "Testfile")
	if err != nil {
		return nil, err
	}
	h := new(Handler)
	err = h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens))
	return h, err
}

func TestUnmarshalCaddyfile(t *testing.T) {
	h, err := parse(t, `rate_limit {
		tree acme {
			match {
				path /v1/*
			}
			tier org {header.X-Org} {
				limit 10000/h
				limit 1_000_000 tokens/h burst 50000
				value acme-corp bigco {
					limit 20000/h
				}
				value internal unlimited
			}
			tier user {
				key {http.auth.user.id}
				missing shared
				limit 100/30m sliding
				limit 100000/month tz Europe/Paris
				limit 4 concurrent
				adaptive
			}
		}
		cost tokens {header.X-Tokens}
		store redis {
			address {$REDIS:localhost:6379} 10.0.0.2:6379
			cluster
			password secret
			db 2
			tls insecure {
				server_name redis.internal
			}
			timeout 150ms
			key_prefix rl:
			breaker 5 2s
			slot_ttl 10s
			tenant_in_flight 64
			lease {
				max_share 20%
				min_remaining 0.01
				ttl 500ms
				max_paths 20000
			}
		}
		on_store_error allow
		mode warn
		headers ietf openai
		jitter 1.5
	}`)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(h)
	for _, want := range []string{
		`"name":"acme"`, `"match":[{"path":["/v1/*"]}]`,
		`"name":"org","key":"{header.X-Org}","limits":[{"count":10000,"per":"h"},{"count":1000000,"per":"h","dimension":"tokens","burst":50000}]`,
		`"acme-corp":{"limits":[{"count":20000,"per":"h"}]}`, `"bigco":{"limits":[{"count":20000,"per":"h"}]}`, `"internal":{"unlimited":true}`,
		`"key":"{http.auth.user.id}","missing":"shared"`, `{"count":100,"per":"30m","algorithm":"sliding"}`,
		`{"count":100000,"per":"month","timezone":"Europe/Paris"}`, `{"count":4,"algorithm":"concurrent"}`, `"adaptive":true`,
		`"costs":[{"dimension":"tokens","value":"{header.X-Tokens}"}]`,
		`"addresses":["{$REDIS:localhost:6379}","10.0.0.2:6379"],"cluster":true`, `"db":2`,
		`"tls":{"server_name":"redis.internal","insecure_skip_verify":true}`, `"timeout":150000000`, `"key_prefix":"rl:"`, `"breaker":{"failures":5,"cooldown":2000000000}`, `"slot_ttl":10000000000`, `"tenant_in_flight":64`,
		`"lease":{"max_share":0.2,"min_remaining":0.01,"ttl":500000000,"max_paths":20000}`,
		`"on_store_error":"allow"`, `"mode":"warn"`, `"headers":{"ietf":true,"x_ratelimit":false,"retry_after":false,"openai":true}`,
		`"jitter":1.5`,
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("JSON lacks %s\n%s", want, got)
		}
	}
}

func TestUnmarshalCaddyfileMholtCompat(t *testing.T) {
	h, err := parse(t, `rate_limit {
		distributed {
			read_interval 5s
			write_interval 5s
		}
		storage file_system /tmp/rl
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
		jitter 0.2
		sweep_interval 30s
	}`)
	if err != nil {
		t.Fatal(err)
	}
	z := h.RateLimits["dynamic_example"]
	if z == nil || z.Key != "{remote_host}" || z.MaxEvents != 2 || z.Window != caddy.Duration(5e9) {
		t.Fatalf("zone = %+v", z)
	}
	if len(h.RateLimits["static_example"].MatcherSetsRaw) != 1 || h.Distributed == nil || h.StorageRaw == nil {
		t.Errorf("match/distributed/storage not kept: %+v", h)
	}
}

// TestCaddyfileErrors: every mistake names its line and says how to fix it.
func TestCaddyfileErrors(t *testing.T) {
	tests := []struct {
		name, input, want string
	}{
		{"argument", "rate_limit 10 {\n}", "takes a block"},
		{"unknown option", "rate_limit {\n\tlimits 5\n}", `rate_limit: unknown option "limits"`},
		{"bad period", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/fortnight\n  }\n }\n}", "limit 5/fortnight: unknown period"},
		{"two algorithms", "rate_limit {\n tree t {\n  tier a k {\n   limit 30/10m fixed sliding\n  }\n }\n}", "limit: sliding after fixed: give one algorithm"},
		{"fixed month", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/month fixed\n  }\n }\n}", "limit 5/month fixed: a month has no fixed length"},
		{"no period", "rate_limit {\n tree t {\n  tier a k {\n   limit 5\n  }\n }\n}", "limit 5: no period"},
		{"bad count", "rate_limit {\n tree t {\n  tier a k {\n   limit -5/h\n  }\n }\n}", "must be a positive whole number"},
		{"bad burst", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/h burst x\n  }\n }\n}", "burst \"x\""},
		{"stray word", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/h fast\n  }\n }\n}", "unexpected \"fast\""},
		{"gcra month", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/month gcra\n  }\n }\n}", "a month has no fixed length"},
		{"sliding burst", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/h burst 2 sliding\n  }\n }\n}", "burst applies only to the gcra"},
		{"no key", "rate_limit {\n tree t {\n  tier user {\n   limit 5/h\n  }\n }\n}", "tier user has no key"},
		{"bad missing", "rate_limit {\n tree t {\n  tier a k {\n   missing ignore\n  }\n }\n}", "missing \"ignore\": use one of deny, shared, skip"},
		{"empty tree", "rate_limit {\n tree t {\n }\n}", "tree t has no tiers"},
		{"empty value", "rate_limit {\n tree t {\n  tier a k {\n   value x {\n   }\n  }\n }\n}", "value x has no limits"},
		{"zone without events", "rate_limit {\n zone z {\n  key static\n  window 1m\n }\n}", "requires both a window and maximum events"},
		{"bad store", "rate_limit {\n store etcd\n}", "unknown store \"etcd\""},
		{"bad mode", "rate_limit {\n mode strict\n}", "mode \"strict\": use one of enforce, warn, shadow"},
		{"bad header family", "rate_limit {\n headers github\n}", "unknown family \"github\""},
		{"cost usage", "rate_limit {\n cost tokens\n}", "usage: cost <dimension>"},
		{"bad timeout", "rate_limit {\n store redis {\n  timeout soon\n }\n}", "timeout \"soon\""},
		{"bad breaker", "rate_limit {\n store redis {\n  breaker never\n }\n}", "breaker \"never\": give the failures in a row"},
		{"lease argument", "rate_limit {\n store redis {\n  lease on\n }\n}", "lease takes no arguments"},
		{"bad lease share", "rate_limit {\n store redis {\n  lease {\n   max_share 2\n  }\n }\n}", "lease max_share \"2\": give a fraction"},
		{"bad lease min_remaining", "rate_limit {\n store redis {\n  lease {\n   min_remaining 100%\n  }\n }\n}", "lease min_remaining \"100%\""},
		{"bad lease ttl", "rate_limit {\n store redis {\n  lease {\n   ttl 2m\n  }\n }\n}", "lease ttl \"2m\": give a positive duration of at most a minute"},
		{"bad lease max_paths", "rate_limit {\n store redis {\n  lease {\n   max_paths 0\n  }\n }\n}", "lease max_paths \"0\": give a positive number of paths"},
		{"unknown lease option", "rate_limit {\n store redis {\n  lease {\n   size 3\n  }\n }\n}", "lease: unknown option \"size\""},
		{"bad breaker cooldown", "rate_limit {\n store redis {\n  breaker 3 soon\n }\n}", "breaker cooldown \"soon\""},
		{"bad tz", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/day calendar tz Mars/Base\n  }\n }\n}", "timezone \"Mars/Base\""},
		{"concurrent with a period", "rate_limit {\n tree t {\n  tier a k {\n   limit 5 concurrent 1m\n  }\n }\n}", "a concurrency limit takes no period"},
		{"bad slot_ttl", "rate_limit {\n store redis {\n  slot_ttl -1s\n }\n}", "slot_ttl \"-1s\""},
		{"bad tenant_in_flight", "rate_limit {\n store redis {\n  tenant_in_flight -3\n }\n}", "tenant_in_flight \"-3\": use a non-negative whole number"},
		{"redis URL", "rate_limit {\n store redis {\n  address redis://127.0.0.1:6379\n }\n}", "is a URL: write host:port"},
		{"redis address without port", "rate_limit {\n store redis {\n  address 127.0.0.1\n }\n}", "missing port in address"},
		{"redis addresses joined", "rate_limit {\n store redis {\n  address a:1,b:2\n }\n}", "give several addresses as separate arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(t, tt.input)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), "Testfile:") {
				t.Errorf("error %q does not name its line", err)
			}
		})
	}
}

// TestProvisionErrors: mistakes only visible in the whole config are caught
// by `caddy validate`.
func TestProvisionErrors(t *testing.T) {
	tests := []struct{ name, rl, want string }{
		{"dimension without cost", "tree t {\n tier a k {\n  limit 5 tokens/h\n }\n}", "tree t counts tokens, but no cost says what a request costs in tokens"},
		{"nothing", "mode warn", "no limits configured"},
		{"duplicate tree", "tree t {\n tier a k {\n  limit 5/h\n }\n}\ntree t {\n tier a k {\n  limit 5/h\n }\n}", "defined twice"},
		{"bad cost", "tree t {\n tier a k {\n  limit 5 tokens/h\n }\n}\ncost tokens many", "neither a placeholder nor a non-negative integer"},
		{"braces in prefix", "tree t {\n tier a k {\n  limit 5/h\n }\n}\nstore redis {\n key_prefix {x}\n}", "must not contain braces"},
		{"zone name", "zone \"my zone\" {\n key static\n events 1\n window 1s\n}", "tree name \"my zone\""},
		{"shorthand placeholders are fine", "tree t {\n tier ip {client_ip} {\n  limit 5/h\n }\n tier user {header.X-User} {\n  limit 5/h\n }\n tier p {env.NOPE}{path.0} {\n  limit 5/h\n }\n}\nmode bogus", "mode \"bogus\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := adapt(t, "{\n admin off\n}\n:0 {\n rate_limit {\n"+tt.rl+"\n }\n}\n")
			if err == nil {
				err = caddy.Validate(mustConfig(t, cfg))
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func mustConfig(t testing.TB, cfg []byte) *caddy.Config {
	t.Helper()
	var c caddy.Config
	if err := json.Unmarshal(cfg, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// FuzzCaddyfile: the parser never panics, and whatever it accepts
// marshals to JSON that parses back to the same config.
func FuzzCaddyfile(f *testing.F) {
	for _, s := range []string{
		"rate_limit {\n tree t {\n  tier a {header.X} {\n   limit 5/h burst 2\n   value v { \n limit 1 tokens/day calendar tz UTC\n }\n  }\n }\n cost tokens 3\n}",
		"rate_limit {\n zone z {\n  key static\n  events 1\n  window 1s\n }\n jitter 20\n}",
		"rate_limit {\n zone z {\n  key {remote_host}\n  events 1\n  window 1s\n  ipv4_prefix 24\n  ipv6_prefix 64\n }\n log_key\n disable_metrics\n}",
		"rate_limit {\n tree t {\n  tier a {header.X} {\n   limit 5000/min sliding\n   limit 50/s sliding approx\n  }\n }\n}",
		"rate_limit {\n store redis {\n  address a:1 b:2\n  tls insecure {\n server_name x\n }\n }\n headers none\n}",
		"rate_limit {\n tree {\n}",
		"rate_limit {\n tree t {\n  tier a {header.Authorization} {\n   sensitive off\n   limit 1/s\n  }\n }\n fingerprint_secret {env.X}\n}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		h, err := parse(t, input)
		if err != nil {
			return
		}
		b, err := json.Marshal(h)
		if err != nil {
			t.Fatalf("accepted config does not marshal: %v", err)
		}
		var back Handler
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("accepted config does not round-trip: %v\n%s", err, b)
		}
		b2, _ := json.Marshal(&back)
		if string(b) != string(b2) {
			t.Fatalf("round trip changed the config:\n%s\n%s", b, b2)
		}
	})
}

func TestUnmarshalCaddyfileCosts(t *testing.T) {
	h, err := parse(t, `rate_limit {
		cost tokens llm {
			provider openai
			chars_per_token 3.5
			default_max_tokens 1024
			image_tokens 800
			max_body_bytes 2MiB
			on_malformed default
			default_cost 2000
			reconcile {
				provider openai
				format sse
				actual weighted 1 3
			}
		}
		cost points graphql {
			model github
			default_list_size 10
			max_depth 12
			max_aliases 20
			max_cost 5000
			schema schema.graphql
			reconcile {
				header X-Query-Cost
			}
		}
		cost bytes body_size
		cost credits {header.X-Credits} default 1
	}`)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(h.Costs)
	for _, want := range []string{
		`"llm":{"provider":"openai","chars_per_token":3.5,"default_max_tokens":1024,"image_tokens":800,"max_body_bytes":2097152,"on_malformed":"default","default_cost":2000}`,
		`"reconcile":{"format":"sse","provider":"openai","actual":{"mode":"weighted","input_weight":1,"output_weight":3}}`,
		`"graphql":{"model":"github","default_list_size":10,"max_depth":12,"max_aliases":20,"max_cost":5000,"schema":"@schema.graphql"}`,
		`"reconcile":{"header":"X-Query-Cost"}`,
		`{"dimension":"bytes","body_size":true}`,
		`{"dimension":"credits","value":"{header.X-Credits}","default":1}`,
	} {
		if !strings.Contains(string(got), want) {
			t.Errorf("JSON lacks %s\n%s", want, got)
		}
	}
	for _, bad := range []struct{ in, want string }{
		{"rate_limit {\n cost tokens llm {\n  provider gemini\n }\n}", `provider "gemini"`},
		{"rate_limit {\n cost tokens llm {\n  max_depth 3\n }\n}", `unknown option "max_depth"`},
		{"rate_limit {\n cost tokens llm {\n  reconcile {\n   actual weighted 1\n  }\n }\n}", "usage: actual"},
		{"rate_limit {\n cost pts graphql {\n  max_body_bytes lots\n }\n}", `max_body_bytes "lots"`},
		{"rate_limit {\n cost tokens\n}", "usage: cost"},
	} {
		if _, err := parse(t, bad.in); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want %q", bad.in, err, bad.want)
		}
	}
}

// TestJitterIsAFraction: jitter is mholt/caddy-ratelimit's plain fraction,
// with no upper bound, so a larger setting never gives less jitter.
func TestJitterIsAFraction(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		err  bool
	}{
		{"0.2", 0.2, false}, {"1", 1, false}, {"1.5", 1.5, false}, {"20", 20, false},
		{"-0.1", 0, true}, {"NaN", 0, true}, {"Inf", 0, true}, {"lots", 0, true},
	} {
		h, err := parse(t, "rate_limit {\n zone z {\n key static\n events 1\n window 1s\n }\n jitter "+tc.in+"\n}")
		if (err != nil) != tc.err || (err == nil && h.Jitter != tc.want) {
			t.Errorf("jitter %s: %v, %v; want %v (error %v)", tc.in, h.Jitter, err, tc.want, tc.err)
		}
	}
}

// TestMholtJSONLoads: mholt/caddy-ratelimit's handler JSON, log_key and a
// jitter above 1 included, is accepted as it is.
func TestMholtJSONLoads(t *testing.T) {
	var h Handler
	raw := `{"rate_limits":{"z":{"key":"{remote_host}","max_events":2,"window":5000000000}},"jitter":2,"log_key":true,"sweep_interval":60000000000}`
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields() // as Caddy loads modules
	if err := dec.Decode(&h); err != nil {
		t.Fatalf("decoding mholt's JSON: %v", err)
	}
	if err := h.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if !h.LogKey || h.Jitter != 2 || h.RateLimits["z"] == nil {
		t.Fatalf("decoded %+v", h)
	}
}

// TestCaddyfileErrorsNameTheLine: mistakes that are only visible once a
// block is read are reported at the line that makes them.
func TestCaddyfileErrorsNameTheLine(t *testing.T) {
	tests := []struct{ name, input, want string }{
		{"tier twice", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/h\n  }\n  tier a j {\n   limit 5/h\n  }\n }\n}",
			"tier a appears twice in its tree: give each tier its own name, at Testfile:6"},
		{"tree twice", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/h\n  }\n }\n tree t {\n  tier a k {\n   limit 5/h\n  }\n }\n}",
			"tree t defined twice: give each tree its own name, at Testfile:7"},
		{"tier without limits", "rate_limit {\n tree t {\n  tier a k {\n   missing skip\n  }\n }\n}",
			"tier a has no limits: add one in its block, e.g. limit 1000/h, at Testfile:3"},
		{"tier without key", "rate_limit {\n tree t {\n  tier user {\n   limit 5/h\n  }\n }\n}",
			"tier user has no key: write tier user {header.X-user}, or key <placeholder> in its block, at Testfile:3"},
		{"dimension without cost", "rate_limit {\n tree t {\n  tier a k {\n   limit 5/h\n   limit 500 tokens/h\n  }\n }\n}",
			"tree t counts tokens, but no cost says what a request costs in tokens: add 'cost tokens <number or placeholder>' (or llm, graphql, body_size), at Testfile:5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parse(t, tt.input); err == nil || err.Error() != tt.want {
				t.Fatalf("error = %v\nwant    %s", err, tt.want)
			}
		})
	}
	// A cost line after the tree that needs it is fine.
	if _, err := parse(t, "rate_limit {\n tree t {\n  tier a k {\n   limit 500 tokens/h\n  }\n }\n cost tokens 5\n}"); err != nil {
		t.Fatal(err)
	}
}

// TestLooksLikeHeader: constant keys that are probably header names
// written without their placeholder draw a warning; others do not.
func TestLooksLikeHeader(t *testing.T) {
	for key, want := range map[string]bool{
		"X-User": true, "x-api-key": true, "Authorization": true, "global": false, "all": false, "x": false, "premium-tier": false,
	} {
		if got := looksLikeHeader(key); got != want {
			t.Errorf("looksLikeHeader(%q) = %v, want %v", key, got, want)
		}
	}
}

// TestLLMCostForms: the minimal LLM cost and its one-line empty block parse
// alike.
func TestLLMCostForms(t *testing.T) {
	for _, form := range []string{"cost tokens llm", "cost tokens llm {}", "cost tokens llm {\n}", "cost tokens llm { }"} {
		h, err := parse(t, "rate_limit {\n tree t {\n tier u {header.X-U} {\n limit 10 tokens/h\n }\n }\n "+form+"\n denial_log no_values\n}")
		if err != nil {
			t.Errorf("%q: %v", form, err)
			continue
		}
		if len(h.Costs) != 1 || h.Costs[0].LLM == nil || h.DenialLog != "no_values" {
			t.Errorf("%q: %+v", form, h.Costs)
		}
	}
	if _, err := parse(t, "rate_limit {\n denial_log loud\n}"); err == nil || !strings.Contains(err.Error(), "values, no_values, off") {
		t.Errorf("denial_log loud: %v", err)
	}
}

// TestPlaceholdersOption: placeholders takes all or refused, in the
// Caddyfile and in JSON.
func TestPlaceholdersOption(t *testing.T) {
	for _, v := range []string{"all", "refused"} {
		h, err := parse(t, "rate_limit {\n zone z {\n key {remote_host}\n events 1\n window 1m\n }\n placeholders "+v+"\n}")
		if err != nil || h.Placeholders != v {
			t.Errorf("placeholders %s: %q, %v", v, h.Placeholders, err)
		}
	}
	for _, bad := range []string{"placeholders", "placeholders none", "placeholders refused all"} {
		if _, err := parse(t, "rate_limit {\n "+bad+"\n}"); err == nil || !strings.Contains(err.Error(), "placeholders") {
			t.Errorf("%s: %v, want an error naming placeholders", bad, err)
		}
	}
	h := &Handler{Placeholders: "none"}
	if err := h.Validate(); err == nil || !strings.Contains(err.Error(), "use all or refused") {
		t.Errorf("JSON placeholders none: %v", err)
	}
}

// TestSensitiveCaddyfile: `sensitive` forces a tier's values to be shown
// as fingerprints, `sensitive off` lifts it (JSON "sensitive": false), a
// bad value names its line and the fix, and fingerprint_secret is checked
// at validation.
func TestSensitiveCaddyfile(t *testing.T) {
	h, err := parse(t, `rate_limit {
		tree t {
			tier a {header.Authorization} {
				sensitive off
				limit 5/h
			}
			tier b {header.X-User} {
				sensitive
				limit 5/h
			}
			tier c {header.X-Api-Key} {
				limit 5/h
			}
		}
		zone z {
			key {header.X-Token}
			events 1
			window 1s
			sensitive on
		}
		fingerprint_secret {env.FP_SECRET}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	tiers := h.Trees[0].Tiers
	if s := tiers[0].Sensitive; s == nil || *s {
		t.Errorf("sensitive off: %v", s)
	}
	if s := tiers[1].Sensitive; s == nil || !*s {
		t.Errorf("sensitive: %v", s)
	}
	if tiers[2].Sensitive != nil {
		t.Errorf("no sensitive line: %v, want nil (detected from the key)", *tiers[2].Sensitive)
	}
	if s := h.RateLimits["z"].Sensitive; s == nil || !*s {
		t.Errorf("zone sensitive on: %v", s)
	}
	b, _ := json.Marshal(h)
	if !strings.Contains(string(b), `"sensitive":false`) || !strings.Contains(string(b), `"fingerprint_secret":"{env.FP_SECRET}"`) {
		t.Errorf("JSON: %s", b)
	}

	for input, want := range map[string]string{
		"rate_limit {\n tree t {\n  tier a {header.X} {\n   sensitive maybe\n  }\n }\n}":  "tier a: sensitive \"maybe\": write sensitive (its values are secrets, shown as fingerprints) or sensitive off (shown as they are), at Testfile:4",
		"rate_limit {\n tree t {\n  tier a {header.X} {\n   sensitive off on\n  }\n }\n}": "sensitive takes at most one argument",
		"rate_limit {\n fingerprint_secret\n}":                                            "usage: fingerprint_secret <secret>",
	} {
		if _, err := parse(t, input); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", input, err, want)
		}
	}

	tree := "tree t {\n tier a {header.Authorization} {\n  limit 5/h\n }\n}\n"
	t.Setenv("CASCADE_FP_EMPTY", "")
	for rl, want := range map[string]string{
		tree + "fingerprint_secret short":                  "fingerprint_secret is 5 bytes: give at least 16",
		tree + "fingerprint_secret {env.CASCADE_FP_EMPTY}": "fingerprint_secret:",
	} {
		cfg, err := adapt(t, "{\n admin off\n}\n:0 {\n rate_limit {\n"+rl+"\n }\n}\n")
		if err == nil {
			err = caddy.Validate(mustConfig(t, cfg))
		}
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "short\"") {
			t.Errorf("%s: error %v, want %q", rl, err, want)
		}
	}
}
