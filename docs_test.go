package cascade

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/caddy-cascade/cascade/engine"
)

// The documentation is tested so that it cannot rot: every relative link
// of README.md and docs/*.md must lead somewhere (a file that exists and,
// for a #fragment, a heading of that file that GitHub gives that anchor),
// and every Caddyfile shown must adapt with Cascade registered.

// docFiles are the documents under test, relative to the repository root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md"}, files...)
}

// mdLine is a line of a Markdown document outside its fenced code blocks.
type mdLine struct {
	n    int // 1-based
	text string
}

// mdBlock is a fenced code block.
type mdBlock struct {
	line int    // of the opening fence, 1-based
	lang string // the first word of the info string, lower case
	body string
}

// parseMarkdown splits a document into its lines outside fenced code
// blocks and its fenced code blocks.
func parseMarkdown(text string) (prose []mdLine, blocks []mdBlock) {
	var (
		in    bool
		fence string
		cur   mdBlock
		body  []string
	)
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimLeft(line, " ")
		if !in {
			if f := leadingFence(trimmed); f != "" && len(line)-len(trimmed) < 4 {
				in, fence = true, f
				info := strings.Fields(strings.TrimPrefix(trimmed, f))
				cur = mdBlock{line: i + 1}
				if len(info) > 0 {
					cur.lang = strings.ToLower(info[0])
				}
				body = body[:0]
				continue
			}
			prose = append(prose, mdLine{i + 1, line})
			continue
		}
		if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
			in = false
			cur.body = strings.Join(body, "\n") + "\n"
			blocks = append(blocks, cur)
			continue
		}
		body = append(body, line)
	}
	return prose, blocks
}

// leadingFence returns the fence (``` or ~~~, three or more) a line opens
// with, or "".
func leadingFence(s string) string {
	for _, c := range []byte{'`', '~'} {
		n := 0
		for n < len(s) && s[n] == c {
			n++
		}
		if n >= 3 {
			return s[:n]
		}
	}
	return ""
}

var (
	headingRE   = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	inlineLink  = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refLinkDef  = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	codeSpan    = regexp.MustCompile("`+[^`]*`+")
	mdLinkText  = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlAnchor  = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	uriScheme   = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	syntaxParam = regexp.MustCompile(`<[A-Za-z…][^<>\n]*>`)
	envVarRE    = regexp.MustCompile(`\{\$([A-Za-z_][A-Za-z0-9_]*)(:[^}]*)?\}`)
)

// githubAnchor is the anchor GitHub gives a heading: its rendered text in
// lower case, without punctuation but hyphens and underscores, spaces
// turned into hyphens.
func githubAnchor(heading string) string {
	s := mdLinkText.ReplaceAllString(heading, "$1")
	s = strings.ToLower(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a document's headings (a repeated one
// numbered -1, -2…, as GitHub does) and explicit HTML anchors.
func anchors(text string) map[string]bool {
	prose, _ := parseMarkdown(text)
	seen := map[string]int{}
	out := map[string]bool{}
	for _, l := range prose {
		for _, m := range htmlAnchor.FindAllStringSubmatch(l.text, -1) {
			out[m[1]] = true
		}
		m := headingRE.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		a := githubAnchor(m[2])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocsLinks: every relative link of the README and docs/ resolves.
func TestDocsLinks(t *testing.T) {
	cache := map[string]map[string]bool{}
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := cache[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		cache[path] = anchors(string(b))
		return cache[path], nil
	}
	var checked, withAnchor int
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		prose, _ := parseMarkdown(string(b))
		for _, l := range prose {
			text := codeSpan.ReplaceAllString(l.text, "")
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
				targets = append(targets, m[1])
			}
			if m := refLinkDef.FindStringSubmatch(text); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if target == "" || uriScheme.MatchString(target) {
					continue // absolute: not this test's to fetch
				}
				checked++
				where := fmt.Sprintf("%s:%d: link %q", file, l.n, target)
				path, frag, _ := strings.Cut(target, "#")
				if p, err := url.PathUnescape(path); err == nil {
					path = p
				}
				dest := file
				if path != "" {
					if filepath.IsAbs(path) {
						t.Errorf("%s: an absolute path; links are relative to the document", where)
						continue
					}
					dest = filepath.Join(filepath.Dir(file), path)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s: %s does not exist", where, dest)
						continue
					}
				}
				if frag == "" {
					continue
				}
				withAnchor++
				if !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s: an anchor into %s, which is not Markdown", where, dest)
					continue
				}
				a, err := anchorsOf(dest)
				if err != nil {
					t.Errorf("%s: %v", where, err)
					continue
				}
				if !a[frag] {
					t.Errorf("%s: %s has no heading with the anchor #%s", where, dest, frag)
				}
			}
		}
	}
	t.Logf("%d relative links checked, %d of them with an anchor", checked, withAnchor)
	if checked < 50 {
		t.Errorf("only %d relative links found: is the link parser broken?", checked)
	}
}

// docEnv are the environment variables the documents' Caddyfiles read with
// {$NAME} and no default, with the values the test gives them. A
// Caddyfile that reads another such variable fails the test: add it here.
var docEnv = map[string]string{}

// rateLimitOptions are the subdirectives of rate_limit: a fragment that
// starts with one is a part of a rate_limit block.
var rateLimitOptions = []string{
	"tree", "zone", "cost", "store", "route", "charge_on", "on_store_error", "mode",
	"headers", "status_code", "use_error_routes", "priority", "shed_at_floor", "log_key",
	"fingerprint_secret", "disable_metrics", "denial_log", "placeholders", "max_wait",
	"idempotency", "max_queued", "jitter", "sweep_interval", "forwarded", "distributed", "storage", "entitlements",
}

// globalOptionNames start a fragment of the global options block.
var globalOptionNames = []string{"cascade", "servers", "order", "admin"}

// directiveLines are a Caddyfile's lines that are neither blank nor
// comments, trimmed.
func directiveLines(cf string) []string {
	var out []string
	for _, l := range strings.Split(cf, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// looksComplete says whether a Caddyfile stands on its own: its first
// directive line opens the global options block, defines a snippet or
// names a site address.
func looksComplete(first string) bool {
	if first == "{" {
		return true
	}
	tok := strings.Fields(first)[0]
	if strings.HasPrefix(tok, "(") && strings.HasSuffix(tok, ")") {
		return true // a snippet, imported by a site below
	}
	return tok == "localhost" || strings.ContainsAny(tok, ".:/*") || strings.HasPrefix(tok, "{$")
}

// fillElisions turns the "…" of an excerpt into something that adapts: a
// line of its own is dropped, `tree <name> { … }` gets one tier. It
// returns the Caddyfile and whether anything was elided.
func fillElisions(cf string) (string, bool) {
	elided := false
	var out []string
	tree := regexp.MustCompile(`^(\s*tree\s+\S+\s*)\{\s*(…|\.\.\.)\s*\}\s*(#.*)?$`)
	for _, l := range strings.Split(cf, "\n") {
		code, _, _ := strings.Cut(l, "#")
		switch strings.TrimSpace(code) {
		case "…", "...":
			elided = true
			continue
		}
		if m := tree.FindStringSubmatch(l); m != nil {
			elided = true
			l = m[1] + "{\n\t\ttier docs {header.X-Docs} {\n\t\t\tlimit 10/s\n\t\t}\n\t}"
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n"), elided
}

// fillerTree is a tree for a fragment of rate_limit that has none, with a
// limit in every dimension the fragment costs.
func fillerTree(fragment string) string {
	var b strings.Builder
	b.WriteString("tree docs_filler {\n\ttier docs {header.X-Docs} {\n\t\tlimit 10/s\n")
	for _, l := range directiveLines(fragment) {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "cost" {
			fmt.Fprintf(&b, "\t\tlimit 100000 %s/s\n", f[1])
		}
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// fillerCosts are cost lines for the dimensions a fragment of rate_limit
// limits without saying what a request costs in them (an excerpt about
// something else).
func fillerCosts(fragment string) string {
	var b strings.Builder
	costed := map[string]bool{}
	var dims []string
	for _, l := range directiveLines(fragment) {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[0] == "cost":
			costed[f[1]] = true
		case len(f) >= 3 && f[0] == "limit" && strings.Contains(f[2], "/"):
			if dim, _, _ := strings.Cut(f[2], "/"); dim != "requests" && !slices.Contains(dims, dim) {
				dims = append(dims, dim)
			}
		}
	}
	for _, dim := range dims {
		if !costed[dim] {
			fmt.Fprintf(&b, "cost %s 1\n", dim)
		}
	}
	return b.String()
}

func hasTree(fragment string) bool {
	for _, l := range directiveLines(fragment) {
		f := strings.Fields(l)[0]
		if f == "tree" || f == "zone" {
			return true
		}
	}
	return false
}

// TestDocsCaddyfiles: every Caddyfile of the README and docs/ adapts. A
// complete one (global options, a snippet or a site first) adapts as
// shown, an excerpt's "…" filled in; a fragment (a rate_limit block, some
// of its options, a route) adapts inside a site, with a tree of its own if
// it shows none. A syntax summary (<placeholders>) that does not look
// complete is the only block not adapted; the count of each kind is logged.
func TestDocsCaddyfiles(t *testing.T) {
	for name, value := range docEnv {
		t.Setenv(name, value)
	}
	var complete, fragments, summaries, jsons int
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		_, blocks := parseMarkdown(string(b))
		for _, blk := range blocks {
			where := fmt.Sprintf("%s:%d", file, blk.line)
			switch blk.lang {
			case "json":
				jsons++
				checkDocJSON(t, where, blk.body)
				continue
			case "caddyfile", "caddy":
			default:
				continue
			}
			lines := directiveLines(blk.body)
			if len(lines) == 0 {
				t.Errorf("%s: an empty Caddyfile", where)
				continue
			}
			for _, m := range envVarRE.FindAllStringSubmatch(blk.body, -1) {
				if _, ok := docEnv[m[1]]; !ok && m[2] == "" {
					t.Errorf("%s: reads {$%s} without a default: give the variable a default, or a value in docEnv", where, m[1])
				}
			}
			cf, elided := fillElisions(blk.body)
			first := lines[0]
			kind := "complete"
			fields := strings.Fields(first)
			switch tok := fields[0]; {
			case looksComplete(first):
				complete++
			case syntaxParam.MatchString(blk.body):
				summaries++
				continue
			case tok == "rate_limit":
				fragments++
				kind = "a rate_limit block"
				fill := fillerCosts(cf)
				if !hasTree(cf) {
					fill += fillerTree(cf)
				}
				cf = "http://:8080 {\n" + strings.Replace(cf, "{", "{\n"+fill, 1) + "\n}\n"
			case slices.Contains(rateLimitOptions, tok) && !(tok == "route" && (len(fields) < 4 || strings.HasPrefix(fields[1], "/"))):
				// (a route of rate_limit names a tier, values and a store;
				// Caddy's route directive a path matcher, or nothing)
				fragments++
				kind = "options of rate_limit"
				cf = fillerCosts(cf) + cf
				if !hasTree(cf) {
					cf = fillerTree(cf) + cf
				}
				cf = "http://:8080 {\nrate_limit {\n" + cf + "\n}\n}\n"
			case slices.Contains(globalOptionNames, tok):
				fragments++
				kind = "global options"
				cf = "{\n" + cf + "\n}\n"
			default:
				fragments++
				kind = "a directive of a site"
				cf = "http://:8080 {\n" + cf + "\n}\n"
			}
			if _, err := adapt(t, cf); err != nil {
				note := ""
				if elided {
					note = " (its … filled in)"
				}
				t.Errorf("%s: a Caddyfile (%s) does not adapt%s: %v\n%s", where, kind, note, err, cf)
			}
		}
	}
	t.Logf("Caddyfiles: %d complete and %d fragments adapted, %d syntax summaries; %d JSON blocks parsed",
		complete, fragments, summaries, jsons)
	if complete < 10 {
		t.Errorf("only %d complete Caddyfiles found: is the block parser broken?", complete)
	}
}

// checkDocJSON: a JSON block is a JSON value, or a member of an object
// ("apps": {…}).
func checkDocJSON(t *testing.T, where, body string) {
	t.Helper()
	var v any
	if json.Unmarshal([]byte(body), &v) == nil || json.Unmarshal([]byte("{"+body+"}"), &v) == nil {
		return
	}
	t.Errorf("%s: a JSON block that does not parse, as a value or as a member of an object:\n%s", where, body)
}

// TestREADMEFrontDoor: the README stays a front door, its reference in docs/.
func TestREADMEFrontDoor(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 400 {
		t.Errorf("README.md has %d lines: keep it to 400, and move reference text to docs/", n)
	}
}

// TestDocsReasons: every reason a decision can have is listed where the
// reference names them: the decisions metric's result label, and the
// {http.rate_limit.reason} placeholder (which a decision endpoint's
// refusals of a malformed or untrusted request do not publish).
func TestDocsReasons(t *testing.T) {
	reasons := []string{
		engine.ReasonOK, engine.ReasonLimited, engine.ReasonImpossible, engine.ReasonPenalty,
		engine.ReasonMissingKey, engine.ReasonStoreError, engine.ReasonReplayed, engine.ReasonInFlight,
		reasonMatcherError, reasonBadCost, reasonBadIdempotencyKey, reasonReducedCapacity,
	}
	for _, tc := range []struct {
		file, row string
		more      []string
	}{
		{"docs/responses.md", "| `{http.rate_limit.reason}` |", nil},
		{"docs/operating.md", "| `cascade_decisions_total` |", []string{reasonBadForwarded, problemUntrusted}},
	} {
		raw, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		var row string
		for line := range strings.Lines(string(raw)) {
			if strings.HasPrefix(line, tc.row) {
				row = line
			}
		}
		if row == "" {
			t.Fatalf("%s: no row %s", tc.file, tc.row)
		}
		words := regexp.MustCompile(`[a-z_]+`).FindAllString(row, -1)
		for _, r := range append(reasons, tc.more...) {
			if !slices.Contains(words, r) {
				t.Errorf("%s: the row %s does not name the reason %s", tc.file, tc.row, r)
			}
		}
	}
}
