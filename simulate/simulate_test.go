package simulate

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// recorder is a Decider that keeps what it is given and denies what deny
// says.
type recorder struct {
	got  []Request
	deny func(*Request) (tier, value string, mode string, ok bool)
}

func (d *recorder) Decide(r *Request, out *Outcome) error {
	d.got = append(d.got, *r)
	t := out.Next()
	t.Handler, t.Tree, t.Mode, t.Tiers = "h", "api", "enforce", append(t.Tiers, "user")
	if d.deny != nil {
		if tier, value, mode, ok := d.deny(r); ok {
			t.Denied, t.Tier, t.Value, t.Mode = true, tier, value, mode
			out.Refused = mode == "enforce"
		}
	}
	return nil
}

func (d *recorder) Notes() []string { return nil }

// logReq is a request as the tests write it in every format.
type logReq struct {
	at     time.Time // arrival
	ip     string
	method string
	uri    string
	ua     string
	status int
	size   int64
	dur    time.Duration
}

func (q logReq) caddy() string {
	end := q.at.Add(q.dur)
	m := map[string]any{
		"level": "info", "ts": float64(end.UnixMicro()) / 1e6, "logger": "http.log.access", "msg": "handled request",
		"request": map[string]any{"remote_ip": q.ip, "remote_port": "5000", "client_ip": q.ip, "proto": "HTTP/1.1",
			"method": q.method, "host": "api.example.com", "uri": q.uri, "headers": map[string][]string{"User-Agent": {q.ua}}},
		"bytes_read": 0, "user_id": "", "duration": q.dur.Seconds(), "size": q.size, "status": q.status,
		"resp_headers": map[string][]string{},
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func (q logReq) combined() string {
	return fmt.Sprintf("%s - - [%s] \"%s %s HTTP/1.1\" %d %d \"-\" \"%s\"", q.ip, q.at.Format(clfTime), q.method, q.uri, q.status, q.size, strings.ReplaceAll(q.ua, `"`, `\"`))
}

func (q logReq) jsonl() string {
	b, _ := json.Marshal(map[string]any{"time": q.at.Format(time.RFC3339Nano), "method": q.method, "host": "api.example.com",
		"uri": q.uri, "remote_ip": q.ip, "headers": map[string]string{"User-Agent": q.ua}, "status": q.status, "size": q.size,
		"duration": q.dur.Seconds()})
	return string(b)
}

func writeLog(t *testing.T, name string, lines []string, gz bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	data := []byte(strings.Join(lines, "\n") + "\n")
	if gz {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(data)
		_ = zw.Close()
		data = buf.Bytes()
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSimulateFormats(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	reqs := []logReq{
		{at: base, ip: "192.0.2.1", method: "GET", uri: "/a?x=1", ua: "curl/8", status: 200, size: 10, dur: 0},
		{at: base.Add(time.Second), ip: "192.0.2.2", method: "POST", uri: "/b", ua: "go", status: 429, size: 0, dur: 0},
		{at: base.Add(3 * time.Second), ip: "2001:db8::1", method: "DELETE", uri: "/c/d", ua: "x \"y\"", status: 204, size: 0, dur: 0},
	}
	for _, tc := range []struct {
		name   string
		format Format
		line   func(logReq) string
	}{
		{"caddy", Caddy, logReq.caddy},
		{"combined", Combined, logReq.combined},
		{"jsonl", JSONL, logReq.jsonl},
	} {
		for _, gz := range []bool{false, true} {
			for _, given := range []Format{Auto, tc.format} {
				t.Run(fmt.Sprintf("%s/gzip=%v/given=%q", tc.name, gz, given), func(t *testing.T) {
					var lines []string
					for _, q := range reqs {
						lines = append(lines, tc.line(q))
					}
					path := writeLog(t, "access.log", lines, gz)
					d := &recorder{}
					res, err := Run(context.Background(), Options{Files: []string{path}, Format: given}, d, nil)
					if err != nil {
						t.Fatal(err)
					}
					if res.Lines != 3 || res.Malformed != 0 || len(d.got) != 3 {
						t.Fatalf("lines %d, malformed %d %v, decided %d: want 3, 0, 3", res.Lines, res.Malformed, res.MalformedLines, len(d.got))
					}
					for i, q := range reqs {
						g := d.got[i]
						if !g.Time.Equal(q.at) || g.Method != q.method || g.URI != q.uri || g.RemoteIP != q.ip ||
							g.Header.Get("User-Agent") != q.ua || g.Status != q.status || g.Size != q.size || g.Line != int64(i+1) {
							t.Errorf("request %d: got %+v, want %+v", i, g, q)
						}
					}
				})
			}
		}
	}
}

// TestSimulateCaddyArrival: a Caddy log's ts is when the response ended; the
// request arrived its duration earlier.
func TestSimulateCaddyArrival(t *testing.T) {
	at := time.Date(2026, 11, 20, 9, 0, 0, 250000000, time.UTC)
	q := logReq{at: at, ip: "192.0.2.1", method: "GET", uri: "/", status: 200, dur: 1500 * time.Millisecond}
	d := &recorder{}
	if _, err := Run(context.Background(), Options{Files: []string{writeLog(t, "a.log", []string{q.caddy()}, false)}}, d, nil); err != nil {
		t.Fatal(err)
	}
	if len(d.got) != 1 || !d.got[0].Time.Equal(at) || d.got[0].Duration != q.dur {
		t.Fatalf("got %+v, want arrival %s and duration %s", d.got, at, q.dur)
	}
}

func TestSimulateOutOfOrder(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	line := func(sec int) string {
		return logReq{at: base.Add(time.Duration(sec) * time.Second), ip: "192.0.2.1", method: "GET", uri: fmt.Sprintf("/%d", sec), status: 200}.jsonl()
	}
	// Each request is at most 3 lines out of place: a window of 4 sorts it.
	order := []int{2, 0, 1, 5, 3, 4, 6, 9, 7, 8}
	var lines []string
	for _, s := range order {
		lines = append(lines, line(s))
	}
	path := writeLog(t, "ooo.log", lines, false)
	d := &recorder{}
	if _, err := Run(context.Background(), Options{Files: []string{path}, Window: 4}, d, nil); err != nil {
		t.Fatalf("within the window: %v", err)
	}
	for i, g := range d.got {
		if want := base.Add(time.Duration(i) * time.Second); !g.Time.Equal(want) {
			t.Fatalf("request %d at %s, want %s (sorted)", i, g.Time, want)
		}
	}
	if len(d.got) != len(order) {
		t.Fatalf("decided %d, want %d", len(d.got), len(order))
	}
	// Line 9 (second 0) comes after 8 later ones: beyond a window of 4.
	lines = append(lines[:8], line(0), lines[8])
	path = writeLog(t, "ooo2.log", lines, false)
	_, err := Run(context.Background(), Options{Files: []string{path}, Window: 4}, &recorder{}, nil)
	var ooo *OutOfOrderError
	if !errors.As(err, &ooo) || ooo.Line != 9 || !strings.Contains(err.Error(), "ooo2.log:9") || !strings.Contains(err.Error(), "--window") {
		t.Fatalf("err %v: want an OutOfOrderError at line 9 that says how to fix it", err)
	}
}

func TestSimulateMalformed(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	good := func(i int) string {
		return logReq{at: base.Add(time.Duration(i) * time.Second), ip: "192.0.2.1", method: "GET", uri: "/", status: 200}.caddy()
	}
	lines := []string{
		good(0),
		`{"ts": "yesterday", "request": {"method": "GET", "uri": "/"}}`, // 2: bad time
		`not json at all`, // 3
		good(1),
		`{"level":"info","ts":1700000000.5,"logger":"tls","msg":"renewed"}`, // 5: not an access entry
		`{"ts":1700000000.5,"request":{"method":"","uri":""}}`,              // 6: no method
		"",                              // blank: not counted
		good(2),                         // 8
		`{"ts":1700000000.5`,            // 9: truncated
		strings.Repeat("x", maxLine+10), // 10: too long
		good(3),
	}
	// Random bytes never crash a reader: each line is counted either way.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		b := make([]byte, rng.IntN(80))
		for i := range b {
			b[i] = byte(rng.IntN(256))
			if b[i] == '\n' {
				b[i] = ' '
			}
		}
		lines = append(lines, `{"ts":`+string(b))
	}
	path := writeLog(t, "bad.log", lines, false)
	d := &recorder{}
	res, err := Run(context.Background(), Options{Files: []string{path}, Format: Caddy}, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.got) != 4 {
		t.Fatalf("decided %d requests, want the 4 good ones", len(d.got))
	}
	if res.Other != 1 {
		t.Errorf("other lines %d, want 1", res.Other)
	}
	if want := int64(5 + 200); res.Malformed != want {
		t.Errorf("malformed %d, want %d", res.Malformed, want)
	}
	var at []int64
	for _, m := range res.MalformedLines[:5] {
		at = append(at, m.Line)
	}
	if fmt.Sprint(at) != "[2 3 6 9 10]" {
		t.Errorf("malformed lines %v, want [2 3 6 9 10]", at)
	}
	if len(res.MalformedLines) != maxExamples {
		t.Errorf("%d malformed lines listed, want at most %d", len(res.MalformedLines), maxExamples)
	}
}

func TestSimulateMergeAndRange(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var a, b []string
	for i := range 20 {
		line := logReq{at: base.Add(time.Duration(i) * time.Second), ip: "192.0.2.1", method: "GET", uri: fmt.Sprintf("/%d", i), status: 200}
		if i%3 == 0 {
			a = append(a, line.combined())
		} else {
			b = append(b, line.jsonl())
		}
	}
	d := &recorder{}
	res, err := Run(context.Background(), Options{Files: []string{writeLog(t, "a.log", a, true), writeLog(t, "b.log", b, false)},
		From: base.Add(5 * time.Second), To: base.Add(15 * time.Second)}, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.got) != 10 || res.Outside != 10 {
		t.Fatalf("decided %d, outside %d: want 10 and 10", len(d.got), res.Outside)
	}
	for i, g := range d.got {
		if g.URI != fmt.Sprintf("/%d", i+5) || g.Seq != int64(i) {
			t.Fatalf("request %d is %s (seq %d), want /%d in time order", i, g.URI, g.Seq, i+5)
		}
	}
}

// TestSimulateReport checks the report's arithmetic against counts kept here.
func TestSimulateReport(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var lines []string
	users := []string{"ann", "bob", "cy"}
	for i := range 300 {
		lines = append(lines, logReq{at: base.Add(time.Duration(i) * time.Millisecond), ip: "192.0.2.1", method: "GET",
			uri: "/" + users[i%3], status: 200}.jsonl())
	}
	path := writeLog(t, "r.log", lines, false)
	// New denies bob from request 100 on and cy in warn; old denies ann.
	newer := &recorder{deny: func(r *Request) (string, string, string, bool) {
		switch {
		case r.URI == "/bob" && r.Seq >= 100:
			return "user", "bob", "enforce", true
		case r.URI == "/cy" && r.Seq >= 200:
			return "user", "cy", "warn", true
		}
		return "", "", "", false
	}}
	older := &recorder{deny: func(r *Request) (string, string, string, bool) {
		return "user", "ann", "enforce", r.URI == "/ann" && r.Seq >= 150
	}}
	res, err := Run(context.Background(), Options{Files: []string{path}}, newer, older)
	if err != nil {
		t.Fatal(err)
	}
	rep := res.Report
	// bob: seq 100..299 with seq%3==1: 67 of them (100, 103, … 298).
	bob, cy, ann := 0, 0, 0
	for i := range 300 {
		switch {
		case i%3 == 1 && i >= 100:
			bob++
		case i%3 == 2 && i >= 200:
			cy++
		case i%3 == 0 && i >= 150:
			ann++
		}
	}
	if rep.Requests != 300 || rep.Refused != int64(bob) || rep.WouldBlock != int64(cy) || rep.Admitted != int64(300-bob) {
		t.Errorf("requests %d refused %d would block %d admitted %d; want 300 %d %d %d", rep.Requests, rep.Refused, rep.WouldBlock, rep.Admitted, bob, cy, 300-bob)
	}
	if len(rep.Trees) != 1 || len(rep.Trees[0].Tiers) != 1 {
		t.Fatalf("trees %+v", rep.Trees)
	}
	if tier := rep.Trees[0].Tiers[0]; tier.Refused != int64(bob) || tier.Requests != 300 {
		t.Errorf("tier %+v: want refused %d of 300", tier, bob)
	}
	if len(rep.TopRefused) != 2 || rep.TopRefused[0].Value != "bob" || rep.TopRefused[0].Count != uint64(bob) ||
		!rep.TopRefused[0].First.Equal(base.Add(100*time.Millisecond)) || rep.TopRefused[1].Value != "cy" ||
		!rep.TopRefused[1].First.Equal(base.Add(200*time.Millisecond)) {
		t.Errorf("top refused %+v", rep.TopRefused)
	}
	if res.Diff.DeniedByNew != int64(bob+cy) || res.Diff.DeniedByOld != int64(ann) {
		t.Errorf("diff new %d old %d, want %d %d", res.Diff.DeniedByNew, res.Diff.DeniedByOld, bob+cy, ann)
	}
	var text, js bytes.Buffer
	if err := res.WriteText(&text, "new.caddyfile", "old.caddyfile"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"300 requests", "bob", "Difference", fmt.Sprintf("%d requests denied by new.caddyfile and not by old.caddyfile; %d the reverse", bob+cy, ann)} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
	if err := res.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Report.Refused != rep.Refused || back.Diff.DeniedByOld != int64(ann) {
		t.Errorf("JSON report does not read back: %v\n%s", err, js.String())
	}
}

// TestSimulateProgress: a long replay writes a progress line, and ends it.
func TestSimulateProgress(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var lines []string
	for i := range 3000 {
		lines = append(lines, logReq{at: base.Add(time.Duration(i) * time.Millisecond), ip: "192.0.2.1", method: "GET", uri: "/", status: 200}.jsonl())
	}
	path := writeLog(t, "p.log", lines, false)
	var buf bytes.Buffer
	if _, err := Run(context.Background(), Options{Files: []string{path}, Progress: &buf, Every: time.Nanosecond}, &recorder{}, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "\rsimulate: ") || !strings.Contains(buf.String(), "simulate: 3000 lines in ") || !strings.HasSuffix(buf.String(), "\n") {
		t.Errorf("progress %q", buf.String())
	}
	buf.Reset()
	if _, err := Run(context.Background(), Options{Files: []string{path}, Progress: &buf, Every: time.Hour}, &recorder{}, nil); err != nil || buf.Len() != 0 {
		t.Errorf("a replay shorter than its progress interval wrote %q (%v)", buf.String(), err)
	}
}

// FuzzSimulateParse: no line makes a parser panic, and a line read as a
// request has its time, method and URI.
func FuzzSimulateParse(f *testing.F) {
	at := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	q := logReq{at: at, ip: "192.0.2.1", method: "GET", uri: "/", ua: "x", status: 200}
	for _, seed := range []string{q.caddy(), q.combined(), q.jsonl(), `{"ts":1e300}`, `- - - [`, `{"headers":{"a":[1]}}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		for _, parse := range []func([]byte, *Request) error{parseCaddy, parseCombined, parseJSONL} {
			var r Request
			if err := parse(line, &r); err == nil && (r.Time.IsZero() || r.Method == "" || r.URI == "") {
				t.Fatalf("%q read as %+v", line, r)
			}
		}
	})
}

// TestSimulateParseEdges: lines that are odd rather than wrong are read
// the same way every time, and wrong ones are malformed.
func TestSimulateParseEdges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		parse  func([]byte, *Request) error
		line   string
		header string // want Header["X-User"] joined with |, when no error
		err    string // want an error containing it
	}{
		{name: "names differing in case are one field, in a stable order", parse: parseJSONL,
			line:   `{"time":"2026-11-20T09:00:00Z","method":"GET","uri":"/","headers":{"x-user":"b","X-User":"a","X-USER":["c","d"]}}`,
			header: "c|d|a|b"}, // X-USER, X-User, x-user
		{name: "negative duration string", parse: parseJSONL,
			line: `{"time":"2026-11-20T09:00:00Z","method":"GET","uri":"/","duration":"-5s"}`, err: "negative"},
		{name: "negative duration string in Caddy's log", parse: parseCaddy,
			line: `{"ts":1700000000.5,"request":{"method":"GET","uri":"/"},"duration":"-1h"}`, err: "negative"},
		{name: "a bad time is a bad field, not bad JSON", parse: parseJSONL,
			line: `{"time":"bad","method":"GET","uri":"/"}`, err: "a field is not what the format says"},
		{name: "cut short is not JSON", parse: parseJSONL,
			line: `{"time":"2026-11-20T09:00:00Z","method":"GE`, err: "not JSON"},
		{name: "a field of the wrong type in Caddy's log", parse: parseCaddy,
			line: `{"ts":1700000000.5,"request":{"method":"GET","uri":"/"},"status":"ok"}`, err: "a field is not what the format says"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 20 { // map order would show in a few tries
				var r Request
				err := tc.parse([]byte(tc.line), &r)
				if tc.err != "" {
					if err == nil || !strings.Contains(err.Error(), tc.err) {
						t.Fatalf("err %v, want %q", err, tc.err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got := strings.Join(r.Header["X-User"], "|"); got != tc.header {
					t.Fatalf("X-User %q, want %q", got, tc.header)
				}
			}
		})
	}
}

// TestSimulateDetect: a file's format is told by its first line's
// top-level fields, not by text anywhere in it.
func TestSimulateDetect(t *testing.T) {
	at := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		line string
		want Format
	}{
		{`{"time":"2026-11-20T09:00:00Z","method":"GET","uri":"/","headers":{"ts":"1"}}`, JSONL},
		{`{"time":"2026-11-20T09:00:00Z","method":"GET","uri":"/","headers":{"X-A":"\"request\":{"}}`, JSONL},
		{logReq{at: at, method: "GET", uri: "/", status: 200}.caddy(), Caddy},
		{`{"level":"info","ts":1700000000.5,"logger":"tls","msg":"renewed"}`, Caddy},
		{`{"level":"info","ts":17000`, Caddy}, // cut short by a rotation
		{logReq{at: at, method: "GET", uri: "/", status: 200}.jsonl(), JSONL},
		{logReq{at: at, ip: "192.0.2.1", method: "GET", uri: "/", status: 200}.combined(), Combined},
	} {
		if got := detect([]byte(tc.line)); got != tc.want {
			t.Errorf("%s: detected %q, want %q", tc.line, got, tc.want)
		}
	}
}

// TestSimulateLongLines: a line longer than maxLine is malformed (its
// reason short), even when it ends the file without a newline just after
// a full buffer; the lines around it are read.
func TestSimulateLongLines(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	good := logReq{at: base, ip: "192.0.2.1", method: "GET", uri: "/", status: 200}.jsonl()
	long := `{"time":` + strings.Repeat("1", 5*256<<10-len(`{"time":`)) // 5 of the reader's buffers exactly
	path := filepath.Join(t.TempDir(), "long.log")
	if err := os.WriteFile(path, []byte(good+"\n"+strings.Repeat("x", 3<<20)+"\n"+good+"\n"+long), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &recorder{}
	res, err := Run(context.Background(), Options{Files: []string{path}}, d, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.got) != 2 || res.Lines != 4 || res.Malformed != 2 || len(res.MalformedLines) != 2 || res.MalformedLines[1].Line != 4 {
		t.Fatalf("decided %d, lines %d, malformed %d %+v: want 2, 4, 2 (lines 2 and 4)", len(d.got), res.Lines, res.Malformed, res.MalformedLines)
	}
	// A number of a MiB is not quoted whole.
	path = writeLog(t, "num.log", []string{`{"time":` + strings.Repeat("1", 1<<19) + `,"method":"GET","uri":"/"}`}, false)
	res, err = Run(context.Background(), Options{Files: []string{path}, Format: JSONL}, &recorder{}, nil)
	if err != nil || res.Malformed != 1 || len(res.MalformedLines[0].Reason) > maxReason+10 {
		t.Fatalf("err %v, malformed %d, reason of %d bytes", err, res.Malformed, len(res.MalformedLines[0].Reason))
	}
}

// TestSimulateCombinedEscapes: a Combined log's quoted fields are read as
// Apache and nginx escape them.
func TestSimulateCombinedEscapes(t *testing.T) {
	for _, tc := range []struct{ ua, want string }{
		{`x \"y\"`, `x "y"`},          // Apache
		{`x \x22y\x22`, `x "y"`},      // nginx
		{`back\\slash`, `back\slash`}, // Apache
		{`nginx\x5Cslash`, `nginx\slash`},
		{`tab\there`, "tab\there"},
		{`odd\q \x2 \xZZ`, `odd\q \x2 \xZZ`}, // not escapes: as written
	} {
		line := `192.0.2.1 - - [20/Nov/2026:09:00:00 +0000] "GET /a?q=\x22 HTTP/1.1" 200 5 "-" "` + tc.ua + `"`
		var r Request
		if err := parseCombined([]byte(line), &r); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if got := r.Header.Get("User-Agent"); got != tc.want || r.URI != `/a?q="` {
			t.Errorf("%s: User-Agent %q, URI %q; want %q, %q", tc.ua, got, r.URI, tc.want, `/a?q="`)
		}
	}
}

// TestSimulateHostileFiles: a damaged gzip file ends the replay with an
// error that names the file and line; binary garbage is malformed lines.
func TestSimulateHostileFiles(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var lines []string
	for i := range 2000 {
		lines = append(lines, logReq{at: base.Add(time.Duration(i) * time.Millisecond), ip: "192.0.2.1", method: "GET", uri: fmt.Sprintf("/%d", i), status: 200}.jsonl())
	}
	gz, err := os.ReadFile(writeLog(t, "a.log.gz", lines, true))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		err  string
	}{
		{"truncated gzip", gz[:len(gz)/2], "truncated gzip.log:"},
		{"gzip with a bad checksum", append(slices.Clone(gz[:len(gz)-8]), 1, 2, 3, 4, 5, 6, 7, 8), "gzip with a bad checksum.log:"},
		{"gzip header only", gz[:5], "gzip header only.log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), tc.name+".log")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Run(context.Background(), Options{Files: []string{path}}, &recorder{}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err %v, want one naming %q", err, tc.err)
			}
		})
	}
	rng := rand.New(rand.NewPCG(5, 6))
	garbage := make([]byte, 1<<20)
	for i := range garbage {
		garbage[i] = byte(rng.IntN(256))
	}
	for _, format := range []Format{Auto, Caddy, Combined, JSONL} {
		path := filepath.Join(t.TempDir(), "garbage.log")
		if err := os.WriteFile(path, garbage, 0o600); err != nil {
			t.Fatal(err)
		}
		d := &recorder{}
		res, err := Run(context.Background(), Options{Files: []string{path}, Format: format}, d, nil)
		if err != nil || len(d.got) != 0 || res.Malformed == 0 || res.Malformed != res.Lines {
			t.Errorf("format %q: err %v, decided %d, %d of %d lines malformed", format, err, len(d.got), res.Malformed, res.Lines)
		}
	}
}

// TestSimulateWindowBytes: a file's window holds at most maxHeld bytes of
// lines, however many lines it may hold: long lines shorten it.
func TestSimulateWindowBytes(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var lines []string
	for i := range 40 {
		q := logReq{at: base.Add(time.Duration(i) * time.Second), ip: "192.0.2.1", method: "GET", uri: "/", ua: strings.Repeat("u", 1000), status: 200}
		lines = append(lines, q.jsonl())
	}
	lines = append(lines, logReq{at: base, ip: "192.0.2.1", method: "GET", uri: "/late", status: 200}.jsonl()) // 40 lines late
	path := writeLog(t, "w.log", lines, false)
	// 40 lines of 1 KB are within the window's lines, not within 16 KB.
	if _, err := Run(context.Background(), Options{Files: []string{path}}, &recorder{}, nil); err != nil {
		t.Fatalf("within the window: %v", err)
	}
	var ooo *OutOfOrderError
	if _, err := Run(context.Background(), Options{Files: []string{path}, maxHeld: 16 << 10}, &recorder{}, nil); !errors.As(err, &ooo) || ooo.Line != 41 {
		t.Fatalf("err %v: want the request of line 41 out of order", err)
	}
}

// TestSimulateMalformedShown: the text report escapes what a malformed
// line's reason quotes of it: a log cannot write to the terminal.
func TestSimulateMalformedShown(t *testing.T) {
	path := writeLog(t, "esc.log", []string{`{"time":"2026-11-20T09:00:00Z","method":"GET","uri":"/","headers":{"\u001b[2J":5}}`}, false)
	res, err := Run(context.Background(), Options{Files: []string{path}, Format: JSONL}, &recorder{}, nil)
	if err != nil || res.Malformed != 1 {
		t.Fatalf("err %v, malformed %d", err, res.Malformed)
	}
	var out bytes.Buffer
	if err := res.WriteText(&out, "a", ""); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsRune(out.String(), 0x1b) {
		t.Errorf("the report writes an escape character:\n%q", out.String())
	}
}

// TestSimulateLongValues: the report keeps values of a bounded length,
// however long the log's are, and tells long ones apart.
func TestSimulateLongValues(t *testing.T) {
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var lines []string
	for i := range 50 {
		lines = append(lines, logReq{at: base.Add(time.Duration(i) * time.Millisecond), ip: "192.0.2.1", method: "GET", uri: fmt.Sprintf("/%d", i), status: 200}.jsonl())
	}
	long := func(r *Request) string { return strings.Repeat("v", 100<<10) + r.URI[1:2] } // ten distinct values of 100 KiB
	d := &recorder{deny: func(r *Request) (string, string, string, bool) { return "user", long(r), "enforce", true }}
	old := &recorder{}
	res, err := Run(context.Background(), Options{Files: []string{writeLog(t, "long.log", lines, false)}}, d, old)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, v := range res.Report.TopRefused {
		if len(v.Value) > maxValue+64 {
			t.Fatalf("a value of %d bytes kept", len(v.Value))
		}
		seen[v.Value] = true
	}
	if len(seen) != 10 {
		t.Errorf("%d values listed, want the 10 told apart", len(seen))
	}
	for _, e := range res.Diff.NewExamples {
		if len(e.Value) > maxValue+64 {
			t.Fatalf("an example's value of %d bytes kept", len(e.Value))
		}
	}
}
