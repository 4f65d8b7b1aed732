package cascade

import (
	"maps"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/caddy-cascade/cascade/storeconfig"
)

// TestUnknownOptionSuggests: a typo gets the option it is a typo of, a
// misplaced option where it goes, and anything else the list of options.
func TestUnknownOptionSuggests(t *testing.T) {
	tree := func(body string) string {
		return "rate_limit {\n tree api {\n  tier org {header.X-Org} {\n" + body + "\n  }\n }\n}"
	}
	for _, tc := range []struct {
		name, input string
		want        []string
	}{
		{"typo in a tier", tree("   limit 10/s\n   mising shared"), []string{`tier org: unknown option "mising": did you mean "missing"?`, "expected key, missing, limit"}},
		{"typo at the top", "rate_limit {\n on_store_eror deny\n}", []string{`did you mean "on_store_error"?`}},
		{"typo in a redis store", "rate_limit {\n store redis {\n  adress 127.0.0.1:6379\n }\n}", []string{`store redis: unknown option "adress": did you mean "address"?`}},
		{"typo in a cost", "rate_limit {\n cost tokens llm {\n  provder openai\n }\n}", []string{`did you mean "provider"?`}},
		{"no near option", tree("   limit 10/s\n   frobnicate 3"), []string{`tier org: unknown option "frobnicate" (expected key, missing, limit, value, plan, adaptive, penalty or sensitive)`}},
		{"short words need one edit", "rate_limit {\n tree api {\n  tie org {header.X-Org} {\n   limit 1/s\n  }\n }\n}", []string{`did you mean "tier"?`}},
		{"limit directly in a tree", "rate_limit {\n tree api {\n  limit 100/min\n }\n}", []string{"tree api: limit is not an option here: a limit belongs to a tier", "tier <name> {header.X-Key} { limit 100/min }"}},
		{"limit directly in rate_limit", "rate_limit {\n limit 100/min\n}", []string{"rate_limit: limit is not an option here: a limit belongs to a tier of a tree"}},
		{"tier outside a tree", "rate_limit {\n tier org {header.X-Org} {\n  limit 1/s\n }\n}", []string{"a tier belongs to a tree"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.input)
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q\nwant it to contain %q", err, want)
				}
			}
			if !strings.Contains(err.Error(), "Testfile:") {
				t.Errorf("error %q does not name the file and line", err)
			}
		})
	}
}

// TestReferenceNamesEveryOption: docs/caddyfile.md's syntax block names
// every option each block's parser takes, so the reference cannot fall
// behind the parser.
func TestReferenceNamesEveryOption(t *testing.T) {
	doc, err := os.ReadFile("docs/caddyfile.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]string{
		"rate_limit": handlerOptions, "tree": treeOptions, "tier": tierOptions, "value": valueOptions, "plan": planOptions,
		"zone": zoneOptions, "store memory": memoryOptions, "idempotency": idempotencyOptions,
		"route": routeOptions, "forwarded": forwardedOptions, "alerts": alertsOptions, "entitlements": entitlementsOptions,
		"cost llm": llmOptions, "cost graphql": graphqlOptions, "reconcile": reconcileOptions,
	}
	maps.Copy(blocks, storeconfig.CaddyfileOptions())
	for block, opts := range blocks {
		for _, opt := range opts {
			if !regexp.MustCompile(`(?m)(^|[\s{;|\[])` + regexp.QuoteMeta(opt) + `([\s;}\]]|$)`).Match(doc) {
				t.Errorf("docs/caddyfile.md does not name %s's option %s", block, opt)
			}
		}
	}
}

// TestEveryMistakeNamed: a mistake in one option does not hide those of
// the next: each is named, with its line, in order.
func TestEveryMistakeNamed(t *testing.T) {
	input := "rate_limit {\n" +
		" tree api {\n  tier org {header.X-Org} {\n   mising shared\n  }\n }\n" + // line 4
		" mode enforcing\n" + // line 7
		" zone z {\n  key {remote_host}\n  events ten\n  window 1m\n }\n" + // line 10
		" on_store_eror deny\n" + // line 13
		"}"
	_, err := parse(t, input)
	if err == nil {
		t.Fatal("no error")
	}
	msg := err.Error()
	at := -1
	for _, want := range []string{`"mising"`, "Testfile:4", "Testfile:7", "Testfile:10", `"on_store_eror"`, "Testfile:13"} {
		i := strings.Index(msg, want)
		if i < 0 {
			t.Fatalf("error %q\ndoes not name %s", msg, want)
		}
		if i < at {
			t.Fatalf("error %q\nnames %s out of order", msg, want)
		}
		at = i
	}
}

// TestOptionLeftovers: what an option's parser does not read is an error,
// not a flag silently set (shed_at_floor off turning it on).
func TestOptionLeftovers(t *testing.T) {
	for _, opt := range []string{"shed_at_floor off", "use_error_routes false", "max_wait 2s extra", "jitter 0.2 0.3",
		"max_queued 5 6", "status_code 429 430", "disable_metrics now", "log_key {\n  x\n }"} {
		t.Run(opt, func(t *testing.T) {
			_, err := parse(t, "rate_limit {\n zone z {\n  key {remote_host}\n  events 5\n  window 1m\n }\n "+opt+"\n}")
			if err == nil || !strings.Contains(err.Error(), "unexpected") || !strings.Contains(err.Error(), "Testfile:7") {
				t.Fatalf("error %v: want the leftover named, at line 7", err)
			}
		})
	}
}
