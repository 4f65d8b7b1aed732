package admin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/hierarchy"
)

func TestParseLimit(t *testing.T) {
	good := []struct {
		in   string
		want hierarchy.Limit
		text string // as Limit.String writes it back (tz aside)
	}{
		{"50000/h", hierarchy.Limit{Count: 50000, Per: "h"}, "50000/h"},
		{"  7/s  ", hierarchy.Limit{Count: 7, Per: "s"}, "7/s"},
		{"1_000/min gcra", hierarchy.Limit{Count: 1000, Per: "min", Algorithm: "gcra"}, "1000/min"},
		{"100/30m", hierarchy.Limit{Count: 100, Per: "30m"}, "100/30m"},
		{"5000000 tokens/h", hierarchy.Limit{Count: 5000000, Per: "h", Dimension: "tokens"}, "5000000 tokens/h"},
		{"5000000 tokens/h burst 100", hierarchy.Limit{Count: 5000000, Per: "h", Dimension: "tokens", Burst: 100}, "5000000 tokens/h burst 100"},
		{"100 requests/h", hierarchy.Limit{Count: 100, Per: "h", Dimension: "requests"}, "100/h"},
		{"100/h sliding", hierarchy.Limit{Count: 100, Per: "h", Algorithm: "sliding"}, "100/h sliding"},
		{"100/h sliding approx", hierarchy.Limit{Count: 100, Per: "h", Algorithm: "sliding_approx"}, "100/h sliding approx"},
		{"100/h sliding_approx", hierarchy.Limit{Count: 100, Per: "h", Algorithm: "sliding_approx"}, "100/h sliding approx"},
		{"10/month", hierarchy.Limit{Count: 10, Per: "month"}, "10/month"},
		{"10/month tz Europe/Paris", hierarchy.Limit{Count: 10, Per: "month", Timezone: "Europe/Paris"}, "10/month"},
		{"10 tokens/day calendar tz America/New_York", hierarchy.Limit{Count: 10, Per: "day", Dimension: "tokens", Algorithm: "calendar", Timezone: "America/New_York"}, "10 tokens/day calendar"},
		{"10/h tz UTC calendar", hierarchy.Limit{Count: 10, Per: "h", Algorithm: "calendar", Timezone: "UTC"}, "10/h calendar"},
		{"100/h burst 1_000 gcra", hierarchy.Limit{Count: 100, Per: "h", Burst: 1000, Algorithm: "gcra"}, "100/h burst 1000"},
		{"10 concurrent", hierarchy.Limit{Count: 10, Algorithm: "concurrent"}, "10 concurrent"},
	}
	for _, tt := range good {
		l, err := ParseLimit(tt.in)
		if err != nil {
			t.Errorf("%q: %v", tt.in, err)
			continue
		}
		got := hierarchy.Limit{Count: l.Count, Per: l.Per, Dimension: l.Dimension, Burst: l.Burst, Algorithm: l.Algorithm, Timezone: l.Timezone}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%q: %+v, want %+v", tt.in, got, tt.want)
		}
		if l.String() != tt.text {
			t.Errorf("%q: written back as %q, want %q", tt.in, l.String(), tt.text)
		}
	}
	bad := []struct{ in, err string }{
		{"", "empty"},
		{"   ", "empty"},
		{"100", "no period"},
		{"100 tokens", "no period"},
		{"5 /h", "no dimension"},
		{"5/", "no period after the /"},
		{"-5/h", "positive whole number"},
		{"0/h", "positive whole number"},
		{"many/h", "positive whole number"},
		{"99999999999999999999/h", "positive whole number"},
		{"5/fortnight", `unknown period "fortnight"`},
		{"5 bad!dim/h", `dimension "bad!dim"`},
		{"5/h burst", "burst needs a number"},
		{"5/h burst x", `burst "x" must be a positive`},
		{"5/h burst 0", `burst "0" must be a positive`},
		{"5/h burst 2 burst 3", "burst is given twice"},
		{"5/h gcra sliding", "the algorithm is given twice"},
		{"5/h tz", "tz needs a time zone"},
		{"5/h tz Europe/Paris", "timezone applies only to calendar limits"},
		{"5/month tz Mars/Olympus", `timezone "Mars/Olympus"`},
		{"5/month sliding", "a month has no fixed length"},
		{"5/h sliding burst 10", "burst applies only to the gcra algorithm"},
		{"5/h loud", `unexpected "loud"`},
		{"5/h approx", `unexpected "approx"`},
	}
	for _, tt := range bad {
		l, err := ParseLimit(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%q: %v %v, want an error saying %q", tt.in, l, err, tt.err)
		} else if !strings.Contains(err.Error(), fmt.Sprintf("%q", tt.in)) {
			t.Errorf("%q: the error %q does not quote the limit", tt.in, err)
		}
	}
}

func TestPathQuery(t *testing.T) {
	q, err := pathQuery("acme", []string{"org=acme", "user=a:b/é c", "tree=x", "k=a=b", "e="})
	if err != nil {
		t.Fatal(err)
	}
	want := url.Values{"tree": {"acme"}, "tier.org": {"acme"}, "tier.user": {"a:b/é c"}, "tier.tree": {"x"}, "tier.k": {"a=b"}, "tier.e": {""}}
	if !reflect.DeepEqual(q, want) {
		t.Fatalf("%v, want %v", q, want)
	}
	for _, args := range [][]string{{"alice"}, {"=alice"}, {"org=a", "org=b"}} {
		if _, err := pathQuery("acme", args); err == nil {
			t.Errorf("%q was accepted", args)
		}
	}
}

// exchange is one request the CLI sent.
type exchange struct {
	Method, Path string // Path escaped, as sent
	Segments     []string
	Query        url.Values
	Body         string
	Origin       string
	ContentType  string
}

// recorder is an admin API that records what it is sent and answers
// status and body.
type recorder struct {
	mu     sync.Mutex
	got    []exchange
	status int
	body   string
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var segs []string
	for _, p := range strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/") {
		s, err := url.PathUnescape(p)
		if err != nil {
			s = "!" + err.Error()
		}
		segs = append(segs, s)
	}
	rec.mu.Lock()
	rec.got = append(rec.got, exchange{
		Method: r.Method, Path: r.URL.EscapedPath(), Segments: segs, Query: r.URL.Query(), Body: string(body),
		Origin: r.Header.Get("Origin"), ContentType: r.Header.Get("Content-Type"),
	})
	status, answer := rec.status, rec.body
	rec.mu.Unlock()
	if status == 0 {
		status = 200
	}
	if answer == "" {
		answer = "{}"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, answer)
}

func (rec *recorder) exchanges() []exchange {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]exchange(nil), rec.got...)
}

func newRecorder(t *testing.T) (*recorder, string) {
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	return rec, strings.TrimPrefix(srv.URL, "http://")
}

// runCLI runs `caddy rate-limit args...` and returns its output.
func runCLI(args ...string) (string, error) {
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// fixClock sets the CLI's clock for the test.
func fixClock(t *testing.T, at time.Time) {
	old := now
	now = func() time.Time { return at }
	t.Cleanup(func() { now = old })
}

func TestCLIRequests(t *testing.T) {
	at := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	fixClock(t, at)
	long := strings.Repeat("a/b:ç ", 2000) // 14 KB: '/', ':', unicode, spaces
	tests := []struct {
		args   []string
		want   exchange // Path, Segments, Query and Body (as JSON) are compared when set
		check  func(t *testing.T, body string)
		answer string // the server's answer, "{}" when empty
	}{
		{args: []string{"trees"}, want: exchange{Method: "GET", Path: "/rate_limit/trees", Query: url.Values{}}},
		{
			args: []string{"inspect", "acme", "org=acme", "user=a:b/é c", "cost=5"},
			want: exchange{Method: "POST", Path: "/rate_limit/buckets", Query: url.Values{}, Body: url.Values{
				"tree": {"acme"}, "tier.org": {"acme"}, "tier.user": {"a:b/é c"}, "tier.cost": {"5"},
			}.Encode()},
		},
		{
			args: []string{"inspect", "acme", "org=acme", "--cost", "500", "--cost-in", "tokens=10", "--cost-in", "points=2,bytes=0"},
			want: exchange{Method: "POST", Path: "/rate_limit/buckets", Query: url.Values{}, Body: url.Values{
				"tree": {"acme"}, "tier.org": {"acme"}, "cost": {"500"}, "cost.tokens": {"10"}, "cost.points": {"2"}, "cost.bytes": {"0"},
			}.Encode()},
		},
		{
			args: []string{"reset", "acme", "org=acme", "user=bob"},
			want: exchange{Method: "POST", Path: "/rate_limit/reset", Query: url.Values{}, Body: url.Values{"tree": {"acme"}, "tier.org": {"acme"}, "tier.user": {"bob"}}.Encode()},
		},
		{
			args: []string{"reset", "acme", "org=acme", "--below"},
			want: exchange{Method: "POST", Path: "/rate_limit/reset", Query: url.Values{}, Body: url.Values{"tree": {"acme"}, "tier.org": {"acme"}, "below": {"1"}}.Encode()},
		},
		// An override's value goes in the body, out of the URI that Caddy's
		// admin endpoint logs.
		{
			args: []string{"override", "set", "acme", "org", "acme-corp", "--limit", "50000/h", "--limit", "5000000 tokens/h burst 100", "--for", "2h", "--note", "deal #4411, J. Doe"},
			want: exchange{Method: "PUT", Path: "/rate_limit/overrides/acme/org", Query: url.Values{},
				Body: `{"value":"acme-corp","limits":[{"count":50000,"per":"h"},{"count":5000000,"per":"h","dimension":"tokens","burst":100}],"expires":"2026-11-24T14:00:00Z","note":"deal #4411, J. Doe"}`},
		},
		{
			args: []string{"override", "set", "acme", "org", "acme-corp", "--limit", "10/month tz Europe/Paris", "--for", "30d"},
			want: exchange{Method: "PUT", Path: "/rate_limit/overrides/acme/org", Query: url.Values{},
				Body: `{"value":"acme-corp","limits":[{"count":10,"per":"month","timezone":"Europe/Paris"}],"expires":"2026-12-24T12:00:00Z"}`},
		},
		{
			args: []string{"override", "set", "acme", "user", "a/b:c é%2F", "--unlimited", "--expires", "2026-12-01T16:00:00+01:00"},
			want: exchange{Method: "PUT", Path: "/rate_limit/overrides/acme/user",
				Segments: []string{"rate_limit", "overrides", "acme", "user"}, Query: url.Values{},
				Body: `{"value":"a/b:c é%2F","unlimited":true,"expires":"2026-12-01T16:00:00+01:00"}`},
		},
		{
			args: []string{"override", "delete", "acme", "user", long},
			want: exchange{Method: "DELETE", Segments: []string{"rate_limit", "overrides", "acme", "user"}, Query: url.Values{},
				Body: `{"value":"` + long + `"}`},
		},
		{args: []string{"override", "list"}, want: exchange{Method: "GET", Path: "/rate_limit/overrides", Query: url.Values{}}},
		{
			args: []string{"override", "set", "acme", "org", "x", "--unlimited", "--expires", "2h"},
			want: exchange{Method: "PUT", Path: "/rate_limit/overrides/acme/org", Query: url.Values{},
				Body: `{"value":"x","unlimited":true,"expires":"2026-11-24T14:00:00Z"}`},
		},
		// An entitlement's value goes in the body too: it may be an API key.
		{
			args: []string{"entitlements", "set", "customers", "acme", "--plan", "pro", "--limit", "100/h", "--expires", "24h", "--note", "upgrade, #12"},
			want: exchange{Method: "PUT", Path: "/rate_limit/entitlements/customers", Query: url.Values{},
				Body: `{"value":"acme","plan":"pro","limits":[{"count":100,"per":"h"}],"expires":"2026-11-25T12:00:00Z","note":"upgrade, #12"}`},
		},
		{
			args: []string{"entitlements", "set", "keys", "a/b:c é%2F", "--limit", "5000 tokens/day", "--limit", "10/s", "--for", "30d"},
			want: exchange{Method: "PUT", Path: "/rate_limit/entitlements/keys", Query: url.Values{},
				Body: `{"value":"a/b:c é%2F","limits":[{"count":5000,"per":"day","dimension":"tokens"},{"count":10,"per":"s"}],"expires":"2026-12-24T12:00:00Z"}`},
		},
		{
			args: []string{"entitlements", "set", "my block", "acme", "--plan", "pro", "--expires", "2026-12-01T16:00:00+01:00"},
			want: exchange{Method: "PUT", Path: "/rate_limit/entitlements/my%20block", Segments: []string{"rate_limit", "entitlements", "my block"},
				Query: url.Values{}, Body: `{"value":"acme","plan":"pro","expires":"2026-12-01T16:00:00+01:00"}`},
		},
		{
			args: []string{"entitlements", "delete", "customers", long},
			want: exchange{Method: "DELETE", Path: "/rate_limit/entitlements/customers", Query: url.Values{}, Body: `{"value":"` + long + `"}`},
		},
		{args: []string{"entitlements"}, answer: "[]", want: exchange{Method: "GET", Path: "/rate_limit/entitlements", Query: url.Values{}}},
		{args: []string{"entitlements", "list"}, answer: "[]", want: exchange{Method: "GET", Path: "/rate_limit/entitlements", Query: url.Values{}}},
		{
			args: []string{"mode", "acme", "warn", "--note", "rollout"},
			want: exchange{Method: "PUT", Path: "/rate_limit/mode/acme", Query: url.Values{}, Body: `{"mode":"warn","note":"rollout"}`},
		},
		{args: []string{"mode", "acme", "shadow"}, want: exchange{Method: "PUT", Path: "/rate_limit/mode/acme", Query: url.Values{}, Body: `{"mode":"shadow"}`}},
		{args: []string{"mode", "acme", "--reset"}, want: exchange{Method: "DELETE", Path: "/rate_limit/mode/acme", Query: url.Values{}}},
		{args: []string{"top"}, want: exchange{Method: "GET", Path: "/rate_limit/top", Query: url.Values{"n": {"20"}}}},
		{args: []string{"top", "-n", "5", "--json"}, want: exchange{Method: "GET", Path: "/rate_limit/top", Query: url.Values{"n": {"5"}}}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args[:min(3, len(tt.args))], " "), func(t *testing.T) {
			rec, addr := newRecorder(t)
			rec.body = tt.answer
			if tt.args[0] == "trees" {
				rec.body = "[]"
			}
			if _, err := runCLI(append(tt.args, "--address", addr)...); err != nil {
				t.Fatal(err)
			}
			got := rec.exchanges()
			if len(got) != 1 {
				t.Fatalf("%d requests, want 1: %+v", len(got), got)
			}
			g, w := got[0], tt.want
			if g.Method != w.Method {
				t.Errorf("method %s, want %s", g.Method, w.Method)
			}
			if w.Path != "" && g.Path != w.Path {
				t.Errorf("path %s, want %s", g.Path, w.Path)
			}
			if w.Segments != nil && !reflect.DeepEqual(g.Segments, w.Segments) {
				t.Errorf("path segments %q, want %q", g.Segments, w.Segments)
			}
			if !reflect.DeepEqual(g.Query, w.Query) {
				t.Errorf("query %v, want %v", g.Query, w.Query)
			}
			if w.Body == "" {
				if g.Body != "" {
					t.Errorf("body %s, want none", g.Body)
				}
			} else {
				if g.Body != w.Body {
					t.Errorf("body\n%s\nwant\n%s", g.Body, w.Body)
				}
				// The tiers' values go as a form, out of the URI that
				// Caddy's admin endpoint logs; everything else as JSON.
				if wantType := map[bool]string{true: "application/json", false: "application/x-www-form-urlencoded"}[strings.HasPrefix(w.Body, "{")]; g.ContentType != wantType {
					t.Errorf("Content-Type %q", g.ContentType)
				}
			}
			// Caddy's admin client sends the Origin the admin endpoint
			// checks.
			if g.Origin != "http://"+addr {
				t.Errorf("Origin %q, want http://%s", g.Origin, addr)
			}
		})
	}
}

// TestCLIOverrideBody: the body of `override set` decodes as the server
// decodes it, strictly, into an OverrideRequest whose limits validate.
func TestCLIOverrideBody(t *testing.T) {
	rec, addr := newRecorder(t)
	if _, err := runCLI("override", "set", "acme", "org", "x", "--limit", "1000/h sliding", "--limit", "10 tokens/day calendar tz Asia/Tokyo", "--address", addr); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(rec.exchanges()[0].Body))
	dec.DisallowUnknownFields()
	var req OverrideRequest
	if err := dec.Decode(&req); err != nil {
		t.Fatal(err)
	}
	if len(req.Limits) != 2 || req.Limits[0].Algorithm != "sliding" || req.Limits[1].Timezone != "Asia/Tokyo" || req.Expires != "" || req.Unlimited {
		t.Fatalf("%+v", req)
	}
	for _, l := range req.Limits {
		if err := l.Validate(); err != nil {
			t.Error(err)
		}
	}
}

// TestCLIBadArguments: arguments the CLI refuses before sending anything.
func TestCLIBadArguments(t *testing.T) {
	fixClock(t, time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	tests := []struct {
		args []string
		err  string
	}{
		{[]string{"inspect", "acme"}, "requires at least 2 arg(s)"},
		{[]string{"inspect", "acme", "alice"}, "write <tier>=<value>"},
		{[]string{"inspect", "acme", "user=a", "user=b"}, "tier user is given twice"},
		{[]string{"inspect", "acme", "user=a", "--cost", "-1"}, "--cost -1"},
		{[]string{"inspect", "acme", "user=a", "--cost-in", "tokens"}, `--cost-in "tokens"`},
		{[]string{"inspect", "acme", "user=a", "--cost-in", "tokens=x"}, `--cost-in "tokens=x"`},
		{[]string{"inspect", "acme", "user=a", "--cost-in", "=5"}, `--cost-in "=5"`},
		{[]string{"inspect", "acme", "user=a", "--cost-in", "tokens=1,tokens=2"}, "tokens is given twice"},
		{[]string{"reset", "acme", "org"}, "write <tier>=<value>"},
		{[]string{"override", "set", "acme", "org", "x"}, "--limit"},
		{[]string{"override", "set", "acme", "org", "x", "--limit", "5/h", "--unlimited"}, "exclude each other"},
		{[]string{"override", "set", "acme", "org", "x", "--limit", "5/fortnight"}, "unknown period"},
		{[]string{"override", "set", "acme", "org", "x", "--unlimited", "--for", "1h", "--expires", "2027-01-01T00:00:00Z"}, "--expires and --for"},
		{[]string{"override", "set", "acme", "org", "x", "--unlimited", "--expires", "tomorrow"}, "RFC 3339"},
		{[]string{"override", "set", "acme", "org", "x", "--unlimited", "--expires", "2026-01-01T00:00:00Z"}, "in the past"},
		{[]string{"override", "set", "acme", "org", "x", "--unlimited", "--for", "soon"}, `--for "soon"`},
		{[]string{"override", "set", "acme", "org", "x", "--unlimited", "--for", "-1h"}, `--for "-1h"`},
		{[]string{"override", "set", "acme", "org"}, "accepts 3 arg(s)"},
		{[]string{"override", "delete", "acme", "org"}, "accepts 3 arg(s)"},
		{[]string{"entitlements", "set", "customers", "acme"}, "give the value's plan, --plan pro"},
		{[]string{"entitlements", "set", "customers", "acme", "--limit", "5/fortnight"}, "unknown period"},
		{[]string{"entitlements", "set", "customers", "acme", "--plan", "pro", "--expires", "soon"}, `--expires "soon": write an RFC 3339 time such as 2026-11-25T12:00:00Z, or a duration such as 24h`},
		{[]string{"entitlements", "set", "customers", "acme", "--plan", "pro", "--expires", "-1h"}, `--expires "-1h"`},
		{[]string{"entitlements", "set", "customers", "acme", "--plan", "pro", "--expires", "2026-01-01T00:00:00Z"}, "in the past"},
		{[]string{"entitlements", "set", "customers", "acme", "--plan", "pro", "--expires", "1h", "--for", "1h"}, "--expires and --for"},
		{[]string{"entitlements", "set", "customers"}, "accepts 2 arg(s)"},
		{[]string{"entitlements", "delete", "customers"}, "accepts 2 arg(s)"},
		{[]string{"entitlements", "list", "extra"}, "unknown command"},
		{[]string{"mode", "acme"}, "give a mode"},
		{[]string{"mode", "acme", "loud"}, `mode "loud": use enforce, warn or shadow`},
		{[]string{"mode", "acme", "warn", "--reset"}, "give no mode"},
		{[]string{"mode", "acme", "--reset", "--note", "x"}, "--note"},
		{[]string{"top", "-n", "0"}, "-n 0"},
		{[]string{"trees", "extra"}, "unknown command"},
		{[]string{"trees", "--adapter", "caddyfile"}, "--adapter applies to --config"},
	}
	for _, tt := range tests {
		rec, addr := newRecorder(t)
		_, err := runCLI(append(tt.args, "--address", addr)...)
		if err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%q: %v, want an error saying %q", tt.args, err, tt.err)
		}
		if got := rec.exchanges(); len(got) != 0 {
			t.Errorf("%q: sent %+v", tt.args, got)
		}
	}
}

// TestCLIServerErrors: the server's error message is the command's error.
func TestCLIServerErrors(t *testing.T) {
	rec, addr := newRecorder(t)
	rec.status, rec.body = 404, `{"error":"no tree \"nope\" in the running configuration: its trees are acme"}`+"\n"
	out, err := runCLI("inspect", "nope", "org=a", "--address", addr)
	if err == nil || err.Error() != `no tree "nope" in the running configuration: its trees are acme` {
		t.Fatalf("%v", err)
	}
	if out != "" {
		t.Fatalf("printed %q", out)
	}
	// --json too: an error is an error.
	if _, err := runCLI("trees", "--json", "--address", addr); err == nil || !strings.Contains(err.Error(), "its trees are acme") {
		t.Fatalf("--json: %v", err)
	}

	rec.status, rec.body = 503, `{"error":"setting the override: dial tcp: connection refused"}`
	if _, err := runCLI("override", "set", "acme", "org", "x", "--unlimited", "--address", addr); err == nil || err.Error() != "setting the override: dial tcp: connection refused" {
		t.Fatalf("%v", err)
	}

	// A Caddy without Cascade: its admin endpoint's own 404.
	rec.status, rec.body = 404, "404 page not found\n"
	if _, err := runCLI("trees", "--address", addr); err == nil || !strings.Contains(err.Error(), "no rate-limit API") {
		t.Fatalf("%v", err)
	}

	rec.status, rec.body = 200, "<html>"
	if _, err := runCLI("trees", "--address", addr); err == nil || !strings.Contains(err.Error(), "not the JSON expected") {
		t.Fatalf("%v", err)
	}

	// Nobody listening.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	if _, err := runCLI("trees", "--address", closed); err == nil || !strings.Contains(err.Error(), "is Caddy running, with its admin endpoint at "+closed) {
		t.Fatalf("%v", err)
	}
}

// TestCLIJSON: --json prints the server's JSON, indented.
func TestCLIJSON(t *testing.T) {
	rec, addr := newRecorder(t)
	rec.body = `{"total":3,"keys":[{"key":"{acme|x}org=x","count":3,"error":0,"tree":"acme","tier":"org","path":[{"tier":"org","value":"x"}]}]}`
	out, err := runCLI("top", "--json", "--address", addr)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	json.Indent(&buf, []byte(rec.body), "", "  ")
	if out != buf.String()+"\n" {
		t.Fatalf("%s", out)
	}
}

// TestCLIAddress: the admin address from a unix socket, and from the
// configuration file of --config, as `caddy stop` finds it.
func TestCLIAddress(t *testing.T) {
	rec := &recorder{body: "[]"}
	dir, err := os.MkdirTemp("", "rl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "admin.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rec}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	out, err := runCLI("trees", "--address", "unix/"+sock)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "no trees") || len(rec.exchanges()) != 1 || rec.exchanges()[0].Path != "/rate_limit/trees" {
		t.Fatalf("%q %+v", out, rec.exchanges())
	}

	rec2, addr := newRecorder(t)
	rec2.body = "[]"
	cfg := filepath.Join(dir, "caddy.json")
	if err := os.WriteFile(cfg, []byte(`{"admin":{"listen":"`+addr+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := runCLI("trees", "--config", cfg); err != nil {
		t.Fatal(err)
	}
	if len(rec2.exchanges()) != 1 {
		t.Fatalf("--config: %+v", rec2.exchanges())
	}
	if _, err := runCLI("trees", "--config", filepath.Join(dir, "none.json")); err == nil || !strings.Contains(err.Error(), "finding the admin address") {
		t.Fatalf("a missing --config: %v", err)
	}
}

// TestCLIOutput: what each command prints of the server's answer.
func TestCLIOutput(t *testing.T) {
	fixClock(t, time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	tests := []struct {
		args   []string
		answer string
		want   string
	}{
		{
			[]string{"override", "set", "acme", "user", "alice", "--limit", "2/min"},
			`{"old":null,"new":{"tree":"acme","tier":"user","value":"alice","limits":[{"count":2,"per":"min"}],"expires":"2026-11-24T14:00:00Z","updated":"2026-11-24T12:00:00Z"}}`,
			"acme/user/alice: none → 2/min until 2026-11-24T14:00:00Z (in 2 h)\n",
		},
		{
			[]string{"override", "set", "acme", "user", "alice", "--unlimited"},
			`{"old":{"tree":"acme","tier":"user","value":"alice","limits":[{"count":2,"per":"min"},{"count":5,"per":"month","dimension":"tokens","timezone":"Europe/Paris"}]},"new":{"tree":"acme","tier":"user","value":"alice","unlimited":true}}`,
			"acme/user/alice: 2/min, 5 tokens/month tz Europe/Paris → unlimited\n",
		},
		{
			[]string{"override", "delete", "acme", "user", "a b"},
			`{"old":{"tree":"acme","tier":"user","value":"a b","unlimited":true},"new":null}`,
			"acme/user/\"a b\": unlimited → the configuration's\n",
		},
		{
			[]string{"override", "delete", "acme", "user", "alice"},
			`{"old":null,"new":null}`,
			"acme/user: the value given had no override: nothing changed\n",
		},
		{
			[]string{"mode", "acme", "warn"},
			`{"old":null,"new":{"tree":"acme","mode":"warn","updated":"2026-11-24T12:00:00Z"}}`,
			"mode of acme: configured → warn\n",
		},
		{
			[]string{"mode", "acme", "enforce"},
			`{"old":{"tree":"acme","mode":"warn"},"new":{"tree":"acme","mode":"enforce"}}`,
			"mode of acme: warn → enforce\n",
		},
		{
			[]string{"mode", "acme", "--reset"},
			`{"old":{"tree":"acme","mode":"shadow"},"new":null}`,
			"mode of acme: shadow → configured\n",
		},
		{
			[]string{"mode", "acme", "--reset"},
			`{"old":null,"new":null}`,
			"mode of acme: already the configured one, nothing changed\n",
		},
		{
			[]string{"entitlements", "set", "customers", "acme", "--plan", "pro", "--limit", "100/h", "--for", "1d"},
			`{"old":null,"new":{"name":"customers","value":"acme","plan":"pro","limits":[{"count":100,"per":"h"}],"expires":"2026-11-25T12:00:00Z","updated":"2026-11-24T12:00:00Z"}}`,
			"customers/acme: the source's → plan pro, 100/h until 2026-11-25T12:00:00Z (in 1 d)\n",
		},
		{
			[]string{"entitlements", "set", "keys", "sk-secret", "--plan", "pro"},
			`{"old":{"name":"keys","value":"fp:0123456789ab","plan":"free"},"new":{"name":"keys","value":"fp:0123456789ab","plan":"pro"}}`,
			"keys/fp:0123456789ab: plan free → plan pro\n",
		},
		{
			[]string{"entitlements", "delete", "customers", "a b"},
			`{"old":{"name":"customers","value":"a b","limits":[{"count":5,"per":"month","dimension":"tokens","timezone":"Europe/Paris"}]},"new":null}`,
			"customers/\"a b\": 5 tokens/month tz Europe/Paris → the source's\n",
		},
		{
			[]string{"entitlements", "delete", "customers", "acme"},
			`{"old":null,"new":null}`,
			"customers: the value given had no runtime entitlement: nothing changed\n",
		},
		{[]string{"entitlements"}, `[]`, "no runtime entitlements\n"},
		{
			[]string{"reset", "acme", "org=acme", "--below"},
			`{"tree":"acme","path":[{"tier":"org","value":"acme"}],"below":true,"buckets":2}`,
			"reset 2 bucket(s) of acme: org=acme and below\n",
		},
	}
	for _, tt := range tests {
		rec, addr := newRecorder(t)
		rec.body = tt.answer
		out, err := runCLI(append(tt.args, "--address", addr)...)
		if err != nil {
			t.Errorf("%q: %v", tt.args, err)
		} else if out != tt.want {
			t.Errorf("%q:\n%s\nwant\n%s", tt.args, out, tt.want)
		}
	}
}

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestRenderTrees(t *testing.T) {
	fixClock(t, time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	trees := decodeJSON[[]Tree](t, `[
{"name":"acme","store":"redis/127.0.0.1:6379","mode":"warn","configured_mode":"enforce",
 "mode_override":{"tree":"acme","mode":"warn","note":"rollout","updated":"2026-11-24T11:00:00Z"},
 "tiers":[
  {"name":"org","key":"{http.request.header.X-Org}","missing":"deny",
   "limits":[{"count":1000,"per":"h","text":"1000/h","policy":"org"}],
   "values":[
    {"value":"acme-corp","source":"override","limits":[{"count":50000,"per":"h","text":"50000/h"},{"count":5000000,"per":"h","dimension":"tokens","text":"5000000 tokens/h"}],
     "configured":{"value":"acme-corp","source":"config","limits":[{"count":5000,"per":"h","text":"5000/h"}]},
     "expires":"2026-12-01T16:00:00Z","note":"deal #4411"},
    {"value":"internal tools","source":"config","unlimited":true}]},
  {"name":"user","key":"{http.auth.user.id}","missing":"shared","adaptive":true,
   "limits":[{"count":100,"per":"min","text":"100/min"}]}]},
{"name":"free","store":"memory/default","mode":"shadow","configured_mode":"shadow",
 "tiers":[{"name":"ip","key":"{http.request.remote.host}","missing":"deny","values":[{"value":"10.0.0.1","source":"config","limits":[{"count":1,"per":"s","text":"1/s"}]}]}]}
]`)
	var out bytes.Buffer
	renderTrees(&out, trees)
	want := `tree acme: mode warn (set at runtime 2026-11-24T11:00:00Z: rollout; configured enforce), store redis/127.0.0.1:6379
  TIER  KEY                          MISSING  VALUE             LIMITS                     SOURCE                                                NOTE
  org   {http.request.header.X-Org}  deny     *                 1000/h                     tier
                                              acme-corp         50000/h, 5000000 tokens/h  override until 2026-12-01T16:00:00Z, replaces 5000/h  deal #4411
                                              "internal tools"  unlimited                  config
  user  {http.auth.user.id}          shared   *                 100/min                    tier, adaptive

tree free: mode shadow, store memory/default
  TIER  KEY                         MISSING  VALUE     LIMITS  SOURCE  NOTE
  ip    {http.request.remote.host}  deny     *         -       tier
                                             10.0.0.1  1/s     config
`
	if out.String() != want {
		t.Fatalf("\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	renderTrees(&out, nil)
	if !strings.Contains(out.String(), "no trees") {
		t.Fatal(out.String())
	}
}

func TestRenderBuckets(t *testing.T) {
	b := decodeJSON[Buckets](t, `{"tree":"acme","path":[{"tier":"org","value":"acme"},{"tier":"user","value":"alice"}],
"cost":{"tokens":500,"requests":1},"allowed":false,"retry_after":12,
"buckets":[
 {"tier":"org","value":"acme","limit":"5/min","source":"tier","policy":"org","dimension":"requests","capacity":5,"remaining":3,"full_in":24,"retry_after":0,"key":"k1"},
 {"tier":"org","value":"acme","limit":"100000 tokens/h","source":"override","policy":"org-tokens","dimension":"tokens","capacity":100000,"remaining":0,"full_in":3600,"retry_after":12,"scaled":true,"key":"k2"},
 {"tier":"user","value":"alice","limit":"100/h","source":"tier","policy":"user","dimension":"requests","capacity":100,"remaining":100,"full_in":0,"retry_after":0,"key":"k3"}]}`)
	var out bytes.Buffer
	renderBuckets(&out, &b)
	want := `tree acme: org=acme user=alice
TIER  VALUE  LIMIT            SOURCE    REMAINING/CAPACITY  FULL IN  RETRY AFTER
org   acme   5/min            tier      3/5                 24 s     now
org   acme   100000 tokens/h  override  0/100000 (scaled)   1 h      12 s
user  alice  100/h            tier      100/100             full     now
a request costing 1 request, 500 tokens would be refused now (Retry-After 12 s; with max_wait that long, it would wait instead)
`
	if out.String() != want {
		t.Fatalf("\n%s\nwant\n%s", out.String(), want)
	}

	b.Allowed, b.RetryAfter = true, 0
	out.Reset()
	renderBuckets(&out, &b)
	if !strings.HasSuffix(out.String(), "a request costing 1 request, 500 tokens would be admitted now\n") {
		t.Fatal(out.String())
	}
	b.Allowed, b.Impossible, b.Buckets[1].Impossible = false, true, true
	b.Cost = map[string]int64{"requests": 1, "tokens": 200000}
	out.Reset()
	renderBuckets(&out, &b)
	if !strings.Contains(out.String(), "1 h      never") || !strings.HasSuffix(out.String(), "a request costing 1 request, 200000 tokens can never be admitted: it is over a bucket's capacity\n") {
		t.Fatal(out.String())
	}
}

func TestRenderOverrides(t *testing.T) {
	fixClock(t, time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	o := decodeJSON[Overrides](t, `{"overrides":[
 {"tree":"acme","tier":"org","value":"acme-corp","limits":[{"count":50000,"per":"h"},{"count":5000000,"per":"h","dimension":"tokens","burst":100}],"expires":"2026-12-01T16:00:00Z","note":"deal #4411, J. Doe","updated":"2026-11-24T11:00:00Z"},
 {"tree":"acme","tier":"user","value":"bad\u0000bot\n","unlimited":true,"note":"line\nbreak","updated":"2026-11-24T11:00:00Z"}],
"modes":[{"tree":"acme","mode":"warn","note":"rollout","updated":"2026-11-24T11:30:00Z"}]}`)
	var out bytes.Buffer
	renderOverrides(&out, &o)
	want := `TREE  TIER  VALUE           LIMITS                               EXPIRES                            NOTE
acme  org   acme-corp       50000/h, 5000000 tokens/h burst 100  2026-12-01T16:00:00Z (in 7 d 4 h)  deal #4411, J. Doe
acme  user  "bad\x00bot\n"  unlimited                            never                              "line\nbreak"

TREE  MODE  SET                   NOTE
acme  warn  2026-11-24T11:30:00Z  rollout
`
	if out.String() != want {
		t.Fatalf("\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	renderOverrides(&out, &Overrides{})
	if out.String() != "no runtime overrides\n\nno runtime modes\n" {
		t.Fatalf("%q", out.String())
	}
}

func TestRenderEntitlements(t *testing.T) {
	fixClock(t, time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	es := decodeJSON[[]*control.Entitlement](t, `[
 {"name":"customers","value":"acme","plan":"pro","expires":"2026-12-01T16:00:00Z","note":"deal #4411, J. Doe","updated":"2026-11-24T11:00:00Z"},
 {"name":"customers","value":"big corp","plan":"enterprise","limits":[{"count":50000,"per":"h"},{"count":5000000,"per":"h","dimension":"tokens","burst":100}],"updated":"2026-11-24T11:00:00Z"},
 {"name":"keys","value":"fp:0123456789ab","limits":[{"count":10,"per":"s"}],"note":"line\nbreak","updated":"2026-11-24T11:00:00Z"}]`)
	var out bytes.Buffer
	renderEntitlements(&out, es)
	want := `NAME       VALUE            PLAN        LIMITS                               EXPIRES                            NOTE
customers  acme             pro         -                                    2026-12-01T16:00:00Z (in 7 d 4 h)  deal #4411, J. Doe
customers  "big corp"       enterprise  50000/h, 5000000 tokens/h burst 100  never
keys       fp:0123456789ab  -           10/s                                 never                              "line\nbreak"
`
	if out.String() != want {
		t.Fatalf("\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	renderEntitlements(&out, nil)
	if out.String() != "no runtime entitlements\n" {
		t.Fatalf("%q", out.String())
	}
}

func TestRenderTop(t *testing.T) {
	top := decodeJSON[Top](t, `{"total":1234,"keys":[
 {"key":"{acme|acme}org=acme/user=alice","count":120,"error":0,"tree":"acme","tier":"user","path":[{"tier":"org","value":"acme"},{"tier":"user","value":"alice"}]},
 {"key":"{free|x}ip=10.0.0.1","count":7,"error":2,"tree":"free","tier":"ip","path":[{"tier":"ip","value":"10.0.0.1"}]}]}`)
	var out bytes.Buffer
	renderTop(&out, &top)
	want := `DENIALS  ERROR  TREE  TIER  PATH
120      exact  acme  user  org=acme user=alice
7        ±2     free  ip    ip=10.0.0.1
1234 denials counted
`
	if out.String() != want {
		t.Fatalf("\n%s\nwant\n%s", out.String(), want)
	}
}

func TestShow(t *testing.T) {
	long := strings.Repeat("é", 100)
	tests := []struct{ in, want string }{
		{"alice", "alice"},
		{"a:b/c", "a:b/c"},
		{"日本", "日本"},
		{"", `""`},
		{"a b", `"a b"`},
		{`say "hi"`, `"say \"hi\""`},
		{"nul\x00", `"nul\x00"`},
		{"\xff", `"\xff"`},
		{long, strings.Repeat("é", 40) + "…(200 bytes)"},
	}
	for _, tt := range tests {
		if got := show(tt.in); got != tt.want {
			t.Errorf("show(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestSeconds(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{0, "0 s"}, {0.25, "0.25 s"}, {0.0004, "0 s"}, {0.9996, "1 s"}, {1.04, "1 s"}, {9.843, "9.8 s"},
		{11.843, "12 s"}, {59.4, "59 s"}, {59.6, "1 min"}, {60, "1 min"}, {150, "2 min 30 s"}, {3600, "1 h"}, {3661, "1 h 1 min"},
		{86400 * 2, "2 d"}, {86400*2 + 4*3600 + 59, "2 d 4 h"}, {86400 + 59, "1 d"},
	}
	for _, tt := range tests {
		if got := seconds(tt.in); got != tt.want {
			t.Errorf("seconds(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCostText(t *testing.T) {
	tests := []struct {
		in   map[string]int64
		want string
	}{
		{map[string]int64{"requests": 1}, "1 request"},
		{map[string]int64{"requests": 3}, "3 requests"},
		{map[string]int64{"tokens": 5, "bytes": 2, "requests": 1}, "1 request, 2 bytes, 5 tokens"},
		{map[string]int64{"tokens": 1, "requests": 1, "gpu": 1}, "1 request, 1 gpu, 1 token"},
		{nil, "nothing"},
	}
	for _, tt := range tests {
		if got := costText(tt.in); got != tt.want {
			t.Errorf("costText(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
