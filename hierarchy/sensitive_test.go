package hierarchy

import (
	"strings"
	"testing"
)

func TestCredentialKey(t *testing.T) {
	for key, want := range map[string]bool{
		"{http.request.header.Authorization}":                    true,
		"{header.Authorization}":                                 true,
		"{http.request.header.proxy-authorization}":              true,
		"{http.request.header.X-Api-Key}":                        true,
		"{http.request.header.X-Auth-Token}":                     true,
		"{http.request.header.X-Client-Secret}":                  true,
		"{http.request.cookie.session}":                          true,
		"{http.request.header.Cookie}":                           true,
		"{cookie.anything}":                                      true,
		"{http.request.uri.query.api_key}":                       true,
		"org-{http.request.header.X-Org}-{header.authorization}": true,
		"{http.request.header.X-Jwt}":                            true,
		"{http.request.header.X-Access-Bearer}":                  true,
		"{http.request.header.X-Credential}":                     true,
		"{http.request.header.X-Api-Pass}":                       true,
		"{http.request.header.X-Signature}":                      true,
		"{http.request.uri}":                                     true,
		"{http.request.uri.query}":                               true,
		"{http.request.orig_uri}":                                true,
		"{http.vars.tenant}":                                     true,
		"{vars.tenant}":                                          true,
		"{http.request.header.X-Org}":                            false,
		"{http.request.uri.path}":                                false,
		"{http.auth.user.id}":                                    false,
		"{client_ip}":                                            false,
		"{http.vars.client_ip}":                                  false, // what the Caddyfile makes of {client_ip}
		"{vars.client_ip}":                                       false,
		"{http.request.remote.host}":                             false,
		"global":                                                 false,
		`\{header.Authorization}`:                                false,
	} {
		if got := CredentialKey(key); got != want {
			t.Errorf("CredentialKey(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestSensitiveCompiles(t *testing.T) {
	off, on := false, true
	tr := &Tree{Name: "t", Tiers: []*Tier{
		{Name: "auto", Key: "{http.request.header.Authorization}", Limits: []*Limit{{Count: 1, Per: "min"}}},
		{Name: "lifted", Key: "{http.request.header.Authorization}", Sensitive: &off, Limits: []*Limit{{Count: 1, Per: "min"}}},
		{Name: "forced", Key: "{http.request.header.X-User}", Sensitive: &on, Limits: []*Limit{{Count: 1, Per: "min"}}},
		{Name: "plain", Key: "{http.request.header.X-User}", Limits: []*Limit{{Count: 1, Per: "min"}}},
	}}
	if err := tr.Compile(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, true, false} {
		if got := tr.Tiers[i].IsSensitive(); got != want {
			t.Errorf("tier %s: sensitive %v, want %v", tr.Tiers[i].Name, got, want)
		}
	}
	var plan Plan
	tr.Resolve([]string{"Bearer sk-1", "Bearer sk-2", "carol", "dave"}, &plan)
	show := func(v string) string { return "fp(" + v + ")" }
	key := tr.RedactKey(plan.Buckets[len(plan.Buckets)-1].Key, show)
	for _, s := range []string{"auto=fp(Bearer%20sk-1)", "lifted=Bearer%20sk-2", "forced=fp(carol)", "plain=dave"} {
		if !strings.Contains(key, s) {
			t.Errorf("redacted key %s: %q", key, s)
		}
	}
	if !strings.HasPrefix(key, "{t|auto=fp(") {
		t.Errorf("the hash tag is not redacted: %s", key)
	}
	// A key of a tree that does not have the tier: every value hidden.
	if got := (&Tree{Name: "t"}).RedactKey("{t|x=a}x=a/y=b#1", show); got != "{t|x=fp(a)}x=fp(a)/y=fp(b)#1" {
		t.Errorf("unknown tiers: %s", got)
	}
}

// FuzzRedactKey: any key text, RedactKey never panics and never lets a
// sensitive segment's value through.
func FuzzRedactKey(f *testing.F) {
	f.Add("{t|k=Bearer%20sk}k=Bearer%20sk/u=x#k")
	f.Add("{t|")
	f.Add("k=v/=/#")
	f.Add("{{}}||==//##")
	tr := &Tree{Name: "t", Tiers: []*Tier{
		{Name: "k", Key: "{http.request.header.Authorization}", Limits: []*Limit{{Count: 1, Per: "min"}}},
		{Name: "u", Key: "{http.request.header.X-User}", Limits: []*Limit{{Count: 1, Per: "min"}}},
	}}
	if err := tr.Compile(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key string) {
		out := tr.RedactKey(key, func(string) string { return "FP" })
		// The segments are the tag's and the path's, before the limit's id.
		var segs []string
		rest := out
		if head, ok := strings.CutPrefix(rest, "{t|"); ok {
			if tag, after, ok := strings.Cut(head, "}"); ok {
				segs, rest = strings.Split(tag, "/"), after
			}
		}
		path, _, _ := strings.Cut(rest, "#")
		for _, seg := range append(segs, strings.Split(path, "/")...) {
			if v, ok := strings.CutPrefix(seg, "k="); ok && v != "FP" {
				t.Fatalf("RedactKey(%q) = %q: segment %q shows a sensitive value", key, out, seg)
			}
		}
		CredentialKey(key)
	})
}
