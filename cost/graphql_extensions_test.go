package cost

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// testBuild is a Build whose output says whether it was given the
// upstream's own cost, and what it was.
func testBuild(up []byte) []byte {
	if up == nil {
		return []byte(`{"x":1}`)
	}
	return []byte(`{"up":` + string(up) + `}`)
}

// insert runs the inserter over body cut into chunks at cuts, and returns
// what it handed out and whether it inserted.
func insert(body string, cuts ...int) (string, bool, string) {
	var out bytes.Buffer
	var reason string
	s := inserter{build: testBuild, skipped: func(r string) { reason = r }}
	prev := 0
	for _, c := range append(cuts, len(body)) {
		s.write([]byte(body[prev:c]), func(b []byte) { out.Write(b) })
		prev = c
	}
	s.finish(func(b []byte) { out.Write(b) })
	return out.String(), s.inserted, reason
}

func TestInserterPlaces(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"no extensions", `{"data":{"a":1}}`, `{"data":{"a":1},"extensions":{"cost":{"x":1}}}`},
		{"empty object", `{}`, `{"extensions":{"cost":{"x":1}}}`},
		{"whitespace kept", " {\"a\" : 1 }  \n", " {\"a\" : 1 ,\"extensions\":{\"cost\":{\"x\":1}}}  \n"},
		{"extensions without cost", `{"data":null,"extensions":{"tracing":{"v":[1,{"w":2}]}}}`,
			`{"data":null,"extensions":{"tracing":{"v":[1,{"w":2}]},"cost":{"x":1}}}`},
		{"empty extensions first", `{"extensions":{},"data":1}`, `{"extensions":{"cost":{"x":1}},"data":1}`},
		{"upstream cost replaced", `{"data":{},"extensions":{"cost":{"actualQueryCost":7,"t":{"a":"}"}}}}`,
			`{"data":{},"extensions":{"cost":{"up":{"actualQueryCost":7,"t":{"a":"}"}}}}}`},
		{"upstream cost a number", `{"extensions":{"cost": 12 ,"b":2}}`, `{"extensions":{"cost": {"up":12},"b":2}}`},
		{"upstream cost last, a string", `{"extensions":{"b":true,"cost":"7"}}`, `{"extensions":{"b":true,"cost":{"up":"7"}}}`},
		{"tricky strings", `{"data":{"s":"}\"{\\","t":"extensions"},"u":"\\\""}`,
			`{"data":{"s":"}\"{\\","t":"extensions"},"u":"\\\"","extensions":{"cost":{"x":1}}}`},
		{"extensions deeper are not ours", `{"data":{"extensions":{"cost":1}},"errors":[{"extensions":{}}]}`,
			`{"data":{"extensions":{"cost":1}},"errors":[{"extensions":{}}],"extensions":{"cost":{"x":1}}}`},
		{"long keys", `{"a_key_longer_than_sixteen_bytes":{"cost":1}}`,
			`{"a_key_longer_than_sixteen_bytes":{"cost":1},"extensions":{"cost":{"x":1}}}`},
		{"literals and numbers", `{"a":true,"b":-1.5e3,"c":null}`, `{"a":true,"b":-1.5e3,"c":null,"extensions":{"cost":{"x":1}}}`},
		{"after the object", `{"a":1}{"b":2}`, `{"a":1,"extensions":{"cost":{"x":1}}}{"b":2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, reason := insert(tc.in)
			if got != tc.want || !ok {
				t.Fatalf("got %s (inserted %v, %s)\nwant %s", got, ok, reason, tc.want)
			}
			if json.Valid([]byte(tc.in)) && !json.Valid([]byte(got)) {
				t.Fatalf("%s is not JSON", got)
			}
			// Cut anywhere, once or at every byte, the same bytes come out.
			for c := 0; c <= len(tc.in); c++ {
				if got, _, _ := insert(tc.in, c); got != tc.want {
					t.Fatalf("cut at %d: %s", c, got)
				}
			}
			every := make([]int, len(tc.in))
			for i := range every {
				every[i] = i
			}
			if got, _, _ := insert(tc.in, every...); got != tc.want {
				t.Fatalf("cut at every byte: %s", got)
			}
		})
	}
}

func TestInserterLeavesUntouched(t *testing.T) {
	for _, tc := range []struct{ name, in, reason string }{
		{"array (a batch)", `[{"data":1},{"data":2}]`, "not a JSON object"},
		{"not JSON", "<html>oops</html>", "not a JSON object"},
		{"a string", `"extensions"`, "not a JSON object"},
		{"extensions null", `{"data":1,"extensions":null}`, "not an object"},
		{"cut short", `{"data":{"a":1}`, "ended before"},
		{"trailing comma", `{"a":1,}`, "not valid JSON"},
		{"missing colon", `{"a" 1}`, "not valid JSON"},
		{"escaped key", `{"ext\u0065nsions":{}}`, "escapes"},
		{"huge upstream cost", `{"extensions":{"cost":"` + strings.Repeat("x", maxHeldCost) + `"}}`, "4 KiB"},
		{"huge upstream cost, cut short", `{"extensions":{"cost":"` + strings.Repeat("x", maxHeldCost+10), "4 KiB"},
		{"upstream cost cut short", `{"extensions":{"cost":{"a":1`, "ended before"},
		{"empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, cuts := range [][]int{nil, {len(tc.in) / 2}, {1, 2, 3, len(tc.in) - 1}} {
				if len(tc.in) < 4 && cuts != nil {
					continue
				}
				got, ok, reason := insert(tc.in, cuts...)
				if got != tc.in || ok {
					t.Fatalf("cuts %v: %q became %q", cuts, tc.in, got)
				}
				if !strings.Contains(reason, tc.reason) || tc.reason == "" && reason != "" {
					t.Fatalf("cuts %v: reason %q, want %q", cuts, reason, tc.reason)
				}
			}
		})
	}
}

// TestInserterEscapedLongKey: a key with an escape past the bytes a key
// of ours could have is left untouched wherever the body is cut, as in one
// piece (once cut, the first piece used to settle that the key was not
// ours, and the escape in the next went unseen).
func TestInserterEscapedLongKey(t *testing.T) {
	in := `{"a_key_longer_than_16\u0020bytes":1}`
	for c := 1; c < len(in); c++ {
		if got, ok, reason := insert(in, c); got != in || ok || !strings.Contains(reason, "escapes") {
			t.Errorf("cut at %d (%q | %q): %q, inserted %v, reason %q", c, in[:c], in[c:], got, ok, reason)
		}
	}
}

// FuzzInserter: whatever the body and wherever it is cut, the inserter
// hands out the body exactly, or the body with the object inserted: valid
// JSON when the body was, whose extensions.cost is Build's.
func FuzzInserter(f *testing.F) {
	for _, s := range []string{`{"data":{"a":[1,2,{"b":"c\"}"}]}}`, `{"extensions":{"cost":{"actualQueryCost":3}}}`,
		`{"extensions":{"x":1}}`, `[1]`, `{"a":"\\"}`, `{}`, ` { } `, `{"extensions":null}`} {
		f.Add([]byte(s), uint16(3))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint16) {
		c := int(cut) % (len(body) + 1)
		whole, ok, _ := insert(string(body))
		cutOut, ok2, _ := insert(string(body), c)
		if whole != cutOut || ok != ok2 {
			t.Fatalf("cut at %d changed the output: %q vs %q", c, whole, cutOut)
		}
		if !ok {
			if whole != string(body) {
				t.Fatalf("untouched body changed: %q → %q", body, whole)
			}
			return
		}
		if len(whole) <= len(body) && !bytes.Contains(body, []byte(`"cost"`)) {
			t.Fatalf("inserted, yet no longer: %q → %q", body, whole)
		}
		if !json.Valid(body) {
			return
		}
		var doc struct {
			Extensions struct {
				Cost json.RawMessage `json:"cost"`
			} `json:"extensions"`
		}
		if err := json.Unmarshal([]byte(whole), &doc); err != nil {
			t.Fatalf("%q → %q: %v", body, whole, err)
		}
		if c := string(doc.Extensions.Cost); c != `{"x":1}` && !strings.HasPrefix(c, `{"up":`) {
			t.Fatalf("%q → %q: extensions.cost %s", body, whole, c)
		}
	})
}

// upstream writes body (in two writes, with a flush between) with the
// given header lines, through an ExtensionsWriter.
func serveThrough(t *testing.T, opts ExtensionsOptions, status int, body []byte, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	e := NewExtensionsWriter(rec, opts)
	for _, h := range header {
		k, v, _ := strings.Cut(h, ": ")
		e.Header().Set(k, v)
	}
	e.WriteHeader(status)
	half := len(body) / 2
	if _, err := e.Write(body[:half]); err != nil {
		t.Fatal(err)
	}
	e.Flush()
	if _, err := e.Write(body[half:]); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return rec
}

func gunzip(t *testing.T, b []byte) string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// graphqlBody is a GraphQL response of about n bytes.
func graphqlBody(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"data":{"users":[`)
	for i := 0; b.Len() < n-40; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":` + strconv.Itoa(i) + `,"name":"user \"` + strconv.Itoa(i) + `\""}`)
	}
	b.WriteString(`]}}`)
	return b.Bytes()
}

func TestExtensionsWriter(t *testing.T) {
	small := graphqlBody(2 << 10)
	large := graphqlBody(MaxBufferedBody + 10<<10)
	withCost := func(b []byte) string { return string(b[:len(b)-1]) + `,"extensions":{"cost":{"x":1}}}` }
	opts := ExtensionsOptions{Build: testBuild}
	for _, tc := range []struct {
		name      string
		body      []byte
		gzip      bool
		length    bool   // the upstream sends a Content-Length
		wantCL    string // "" none
		wantDelay bool   // the first half is held until the body is complete
	}{
		{"small with length", small, false, true, strconv.Itoa(len(withCost(small))), true},
		{"small chunked", small, false, false, "", false},
		{"large with length", large, false, true, "", false},
		{"gzip small with length", small, true, true, "?", true},
		{"gzip large chunked", large, true, false, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := tc.body
			hdr := []string{"Content-Type: application/json; charset=utf-8", `Etag: "v1"`}
			if tc.gzip {
				body = gzipped(string(body))
				hdr = append(hdr, "Content-Encoding: gzip")
			}
			if tc.length {
				hdr = append(hdr, "Content-Length: "+strconv.Itoa(len(body)))
			}
			rec := httptest.NewRecorder()
			e := NewExtensionsWriter(rec, opts)
			for _, h := range hdr {
				k, v, _ := strings.Cut(h, ": ")
				e.Header().Set(k, v)
			}
			e.WriteHeader(200)
			e.Write(body[:len(body)/2])
			e.Flush()
			if held := rec.Body.Len() == 0; held != tc.wantDelay {
				t.Fatalf("first half held: %v, want %v", held, tc.wantDelay)
			}
			e.Write(body[len(body)/2:])
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			got := rec.Body.Bytes()
			text := string(got)
			if tc.gzip {
				text = gunzip(t, got)
			}
			if text != withCost(tc.body) {
				t.Fatalf("body %.200s…", text)
			}
			cl := rec.Header().Get("Content-Length")
			switch {
			case tc.wantCL == "?" && cl != strconv.Itoa(len(got)), tc.wantCL != "?" && cl != tc.wantCL:
				t.Fatalf("Content-Length %q for %d bytes, want %q", cl, len(got), tc.wantCL)
			}
			if et := rec.Header().Get("Etag"); et != `W/"v1"` {
				t.Fatalf("ETag %s", et)
			}
			if !e.Inserted() {
				t.Fatal("Inserted false")
			}
		})
	}
}

func TestExtensionsWriterLeavesUntouched(t *testing.T) {
	body := []byte(`{"data":{"a":1}}`)
	for _, tc := range []struct {
		name    string
		opts    ExtensionsOptions
		status  int
		body    []byte
		header  []string
		skipped string
	}{
		{"error status", ExtensionsOptions{}, 500, body, []string{"Content-Type: application/json"}, ""},
		{"400", ExtensionsOptions{}, 400, body, []string{"Content-Type: application/graphql-response+json"}, ""},
		{"html", ExtensionsOptions{}, 200, []byte("<p>{}</p>"), []string{"Content-Type: text/html"}, ""},
		{"no content type", ExtensionsOptions{}, 200, body, nil, ""},
		{"HEAD, not JSON", ExtensionsOptions{NoBody: true}, 200, nil, []string{"Content-Type: text/html", "Content-Length: 16"}, ""},
		{"brotli", ExtensionsOptions{}, 200, []byte("\x1b\x00\x00"), []string{"Content-Type: application/json", "Content-Encoding: br"}, "content encoding br"},
		{"array", ExtensionsOptions{}, 200, []byte(`[{"data":1}]`), []string{"Content-Type: application/json"}, "not a JSON object"},
		{"array with length", ExtensionsOptions{}, 200, []byte(`[{"data":1}]`), []string{"Content-Type: application/json", "Content-Length: 12"}, "not a JSON object"},
		{"partial content", ExtensionsOptions{}, 200, body, []string{"Content-Type: application/json", "Content-Range: bytes 0-15/20"}, ""},
		{"not gzip after all", ExtensionsOptions{}, 200, body, []string{"Content-Type: application/json", "Content-Encoding: gzip"}, ""},
		{"short of its length", ExtensionsOptions{}, 200, body, []string{"Content-Type: application/json", "Content-Length: 40"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var skipped string
			tc.opts.Build = testBuild
			tc.opts.Skipped = func(r string) { skipped = r }
			rec := serveThrough(t, tc.opts, tc.status, tc.body, tc.header...)
			if !bytes.Equal(rec.Body.Bytes(), tc.body) {
				t.Fatalf("body %q, want %q", rec.Body.Bytes(), tc.body)
			}
			if rec.Code != tc.status {
				t.Fatalf("status %d", rec.Code)
			}
			for _, h := range tc.header {
				if k, v, _ := strings.Cut(h, ": "); k == "Content-Length" && rec.Header().Get(k) != v {
					t.Fatalf("Content-Length %q, want %q", rec.Header().Get(k), v)
				}
			}
			if !strings.Contains(skipped, tc.skipped) || tc.skipped == "" && skipped != "" {
				t.Fatalf("skipped %q, want %q", skipped, tc.skipped)
			}
		})
	}
}

func TestExtensionsWriterAnyStatus(t *testing.T) {
	problem := []byte(`{"type":"x","status":429}`)
	rec := serveThrough(t, ExtensionsOptions{Build: testBuild, AnyStatus: true}, 429, problem,
		"Content-Type: application/problem+json", "Content-Length: "+strconv.Itoa(len(problem)))
	want := `{"type":"x","status":429,"extensions":{"cost":{"x":1}}}`
	if rec.Body.String() != want || rec.Code != 429 || rec.Header().Get("Content-Length") != strconv.Itoa(len(want)) {
		t.Fatalf("%d %s (Content-Length %s)", rec.Code, rec.Body, rec.Header().Get("Content-Length"))
	}
}

// A gzip body corrupt part-way reaches the client without the gzip
// trailer: its decoder fails rather than reading a shorter body as whole.
func TestExtensionsWriterCorruptGzip(t *testing.T) {
	body := graphqlBody(200 << 10)
	z := gzipped(string(body))
	bad := bytes.Clone(z)
	for i := len(bad) / 2; i < len(bad)/2+64; i++ {
		bad[i] ^= 0x55
	}
	rec := serveThrough(t, ExtensionsOptions{Build: testBuild}, 200, bad, "Content-Type: application/json", "Content-Encoding: gzip")
	zr, err := gzip.NewReader(bytes.NewReader(rec.Body.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(zr); err == nil {
		t.Fatalf("a corrupt body decoded whole (%d of %d bytes)", len(got), len(body))
	}
}

func TestUpstreamCost(t *testing.T) {
	for in, want := range map[string]Usage{
		`{"requestedQueryCost":9,"actualQueryCost":4,"throttleStatus":{"maximumAvailable":1000}}`: {Total: 4, Found: true},
		`{"requestedQueryCost":9}`: {Total: 9, Found: true},
		`12`:                       {Total: 12, Found: true},
		`"x"`:                      {},
		``:                         {},
		`{"actualQueryCost":`:      {},
	} {
		if got := UpstreamCost([]byte(in)); got != want {
			t.Errorf("%s: %+v, want %+v", in, got, want)
		}
	}
}

// BenchmarkExtensionsWriter is the cost of adding the object to a 2 KiB
// body (held whole, sent with its length) and a 1 MiB one (streamed in
// 32 KiB writes), plain and gzip, against passing the body untouched.
func BenchmarkExtensionsWriter(b *testing.B) {
	for _, size := range []int{2 << 10, 1 << 20} {
		body := graphqlBody(size)
		for _, mode := range []string{"untouched", "plain", "gzip"} {
			in := body
			if mode == "gzip" {
				in = gzipped(string(body))
			}
			b.Run(strconv.Itoa(size>>10)+"KiB/"+mode, func(b *testing.B) {
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				pool := new(GzipPool) // as a handler's cost keeps one
				w := &discardWriter{h: http.Header{}}
				for b.Loop() {
					clear(w.h)
					w.h.Set("Content-Type", "application/json")
					w.h.Set("Content-Length", strconv.Itoa(len(in)))
					if mode == "gzip" {
						w.h.Set("Content-Encoding", "gzip")
					}
					var rw http.ResponseWriter = w
					var e *ExtensionsWriter
					if mode != "untouched" {
						e = NewExtensionsWriter(w, ExtensionsOptions{Build: testBuild, Gzip: pool})
						rw = e
					}
					rw.WriteHeader(200)
					for p := in; len(p) > 0; {
						n := min(len(p), 32<<10)
						rw.Write(p[:n])
						p = p[n:]
					}
					if e != nil {
						e.Close()
					}
				}
			})
		}
	}
}

// TestExtensionsWriterSharedPool: responses rewritten at once, plain and
// gzip, small and streamed, share one handler's pool of gzip coders.
func TestExtensionsWriterSharedPool(t *testing.T) {
	pool := new(GzipPool)
	small, large := graphqlBody(2<<10), graphqlBody(200<<10)
	want := func(b []byte) string { return string(b[:len(b)-1]) + `,"extensions":{"cost":{"x":1}}}` }
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := small
			if i%2 == 1 {
				body = large
			}
			z := gzipped(string(body))
			rec := httptest.NewRecorder()
			e := NewExtensionsWriter(rec, ExtensionsOptions{Build: testBuild, Gzip: pool})
			e.Header().Set("Content-Type", "application/json")
			e.Header().Set("Content-Encoding", "gzip")
			if i%4 < 2 {
				e.Header().Set("Content-Length", strconv.Itoa(len(z)))
			}
			e.WriteHeader(200)
			for p := z; len(p) > 0; {
				n := min(len(p), 1000)
				e.Write(p[:n])
				p = p[n:]
			}
			e.Close()
			zr, err := gzip.NewReader(rec.Body)
			if err != nil {
				errs <- err.Error()
				return
			}
			if got, err := io.ReadAll(zr); err != nil || string(got) != want(body) {
				errs <- fmt.Sprintf("response %d: %v, %d bytes", i, err, len(got))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// TestExtensionsWriterSecondWriteHeader: a superfluous WriteHeader while
// a small body is held sends nothing: the header leaves once, with the
// rewritten body's length (else the old length would cut the body short).
func TestExtensionsWriterSecondWriteHeader(t *testing.T) {
	body := []byte(`{"data":{"a":1}}`)
	rec := httptest.NewRecorder()
	e := NewExtensionsWriter(rec, ExtensionsOptions{Build: testBuild})
	e.Header().Set("Content-Type", "application/json")
	e.Header().Set("Content-Length", strconv.Itoa(len(body)))
	e.WriteHeader(200)
	e.WriteHeader(200)
	e.Write(body)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	want := `{"data":{"a":1},"extensions":{"cost":{"x":1}}}`
	if cl := rec.Result().Header.Get("Content-Length"); rec.Body.String() != want || cl != strconv.Itoa(len(want)) {
		t.Fatalf("Content-Length %s for %s", cl, rec.Body)
	}
}

// TestExtensionsWriterGzipMembers: a gzip body of several members is one
// body; bytes after the last member that are no member (a newline, some
// padding) end it as decoders that stop there read it. Either way the
// body sent on decodes whole, with its trailer, even by a strict decoder.
func TestExtensionsWriterGzipMembers(t *testing.T) {
	body := graphqlBody(100 << 10)
	z := gzipped(string(body))
	want := string(body[:len(body)-1]) + `,"extensions":{"cost":{"x":1}}}`
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"trailing newline", append(bytes.Clone(z), '\n')},
		{"trailing zeros", append(bytes.Clone(z), make([]byte, 40)...)},
		{"trailing text", append(bytes.Clone(z), "not gzip at all"...)},
		{"two members", append(gzipped(string(body[:1000])), gzipped(string(body[1000:]))...)},
		{"two members, then a newline", append(append(gzipped(string(body[:1000])), gzipped(string(body[1000:]))...), '\n')},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, length := range []bool{false, true} {
				if length && len(tc.in) > MaxBufferedBody {
					continue
				}
				hdr := []string{"Content-Type: application/json", "Content-Encoding: gzip"}
				if length {
					hdr = append(hdr, "Content-Length: "+strconv.Itoa(len(tc.in)))
				}
				rec := serveThrough(t, ExtensionsOptions{Build: testBuild}, 200, tc.in, hdr...)
				if got := gunzip(t, rec.Body.Bytes()); got != want {
					t.Fatalf("decoded %d bytes, want %d", len(got), len(want))
				}
			}
		})
	}
}

// TestExtensionsWriterGzipBounded: a small gzip chunk that decodes to
// megabytes is sent on as it decodes: what the writer holds stays near
// maxGzipOut whatever one Write hands it.
func TestExtensionsWriterGzipBounded(t *testing.T) {
	// A block of 30,000 letters repeated: gzip at its best finds the
	// repeats, gzip at its fastest (the writer's) less often.
	block := letters(30000)
	var body bytes.Buffer
	body.WriteString(`{"data":"`)
	for range 300 {
		body.Write(block)
	}
	body.WriteString(`"}`)
	var zb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&zb, gzip.BestCompression)
	zw.Write(body.Bytes())
	zw.Close()
	w := &largestWrite{ResponseRecorder: httptest.NewRecorder()}
	e := NewExtensionsWriter(w, ExtensionsOptions{Build: testBuild})
	e.Header().Set("Content-Type", "application/json")
	e.Header().Set("Content-Encoding", "gzip")
	e.WriteHeader(200)
	e.Write(zb.Bytes()) // one Write: some 70 KiB, 9 MB decoded
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if w.largest > 2*maxGzipOut {
		t.Fatalf("%d bytes held and sent at once", w.largest)
	}
	want := body.String()[:body.Len()-1] + `,"extensions":{"cost":{"x":1}}}`
	if got := gunzip(t, w.Body.Bytes()); got != want {
		t.Fatalf("decoded %d bytes, want %d", len(got), len(want))
	}
}

// letters is n pseudo-random letters.
func letters(n int) []byte {
	b := make([]byte, n)
	x := uint32(1)
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = 'a' + byte(x>>24)%26
	}
	return b
}

type largestWrite struct {
	*httptest.ResponseRecorder
	largest int
}

func (w *largestWrite) Write(p []byte) (int, error) {
	w.largest = max(w.largest, len(p))
	return w.ResponseRecorder.Write(p)
}

// TestExtensionsWriterNotGzipTooLongToKeep: a body labelled gzip whose
// header fails after more than maxRawKept bytes can no longer pass as it
// came; what is sent must not decode as a whole (empty) body.
func TestExtensionsWriterNotGzipTooLongToKeep(t *testing.T) {
	// A header with the longest extra field, then a name never ended.
	bad := []byte{0x1f, 0x8b, 8, 4 | 8, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff}
	bad = append(bad, make([]byte, 0xffff)...)
	bad = append(bad, bytes.Repeat([]byte("n"), 1024)...)
	rec := serveThrough(t, ExtensionsOptions{Build: testBuild}, 200, bad, "Content-Type: application/json", "Content-Encoding: gzip")
	zr, err := gzip.NewReader(bytes.NewReader(rec.Body.Bytes()))
	if err == nil {
		_, err = io.ReadAll(zr)
	}
	if err == nil || err == io.EOF {
		t.Fatalf("%d bytes sent, read as a whole body (%v)", rec.Body.Len(), err)
	}
}

// TestInserterHoldsAtMost4KiB: an upstream cost value longer than
// maxHeldCost, in one huge chunk, is passed on, never copied whole.
func TestInserterHoldsAtMost4KiB(t *testing.T) {
	body := []byte(`{"extensions":{"cost":"` + strings.Repeat("x", 8<<20) + `"}}`)
	for _, cut := range []int{len(body), 30} { // the value ends in the chunk, or goes on
		s := inserter{build: testBuild}
		n := 0
		sink := func(b []byte) { n += len(b) }
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s.write(body[:cut], sink)
		s.write(body[cut:], sink)
		s.finish(sink)
		runtime.ReadMemStats(&after)
		if n != len(body) || s.inserted {
			t.Fatalf("cut %d: %d bytes of %d out, inserted %v", cut, n, len(body), s.inserted)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
			t.Fatalf("cut %d: %d bytes allocated for an 8 MiB value", cut, alloc)
		}
	}
}

// TestExtensionsWriterGzipPanicCloses: a write to the client that panics
// while a gzip chunk is decoding (a handler's panic, recovered by the
// server) leaves the decoder where Close still ends it.
func TestExtensionsWriterGzipPanicCloses(t *testing.T) {
	z := gzipped(`{"data":"` + string(letters(1<<20)) + `"}`) // encodes to more than maxGzipOut
	w := &panicOnce{ResponseRecorder: httptest.NewRecorder()}
	e := NewExtensionsWriter(w, ExtensionsOptions{Build: testBuild})
	e.Header().Set("Content-Type", "application/json")
	e.Header().Set("Content-Encoding", "gzip")
	e.WriteHeader(200)
	func() {
		defer func() { recover() }()
		e.Write(z)
	}()
	if !w.panicked {
		t.Fatal("no write panicked")
	}
	closed := make(chan struct{})
	go func() {
		e.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs")
	}
}

type panicOnce struct {
	*httptest.ResponseRecorder
	panicked bool
}

func (w *panicOnce) Write(p []byte) (int, error) {
	if !w.panicked {
		w.panicked = true
		panic("client write")
	}
	return w.ResponseRecorder.Write(p)
}

// FuzzExtensionsWriter: whatever the body, plain or gzip, with a length
// or without, written in pieces cut anywhere with flushes between, the
// client gets what the inserter makes of the whole body, and a
// Content-Length, when there is one, that is its length.
func FuzzExtensionsWriter(f *testing.F) {
	f.Add([]byte(`{"data":{"a":1}}`), uint64(12345), byte(0))
	f.Add([]byte(`{"extensions":{"cost":{"a":1}}}`), uint64(99), byte(7))
	f.Add([]byte(`[1,2]`), uint64(3), byte(3))
	pool := new(GzipPool)
	f.Fuzz(func(t *testing.T, body []byte, seed uint64, flags byte) {
		useGzip, length, flush := flags&1 != 0, flags&2 != 0, flags&4 != 0
		want, _, _ := insert(string(body))
		in := body
		if useGzip {
			in = gzipped(string(body))
		}
		rec := httptest.NewRecorder()
		e := NewExtensionsWriter(rec, ExtensionsOptions{Build: testBuild, Gzip: pool})
		e.Header().Set("Content-Type", "application/json")
		if useGzip {
			e.Header().Set("Content-Encoding", "gzip")
		}
		if length {
			e.Header().Set("Content-Length", strconv.Itoa(len(in)))
		}
		e.WriteHeader(200)
		x := seed
		for p := in; len(p) > 0; {
			x = x*6364136223846793005 + 1442695040888963407
			n := 1 + int(x>>33)%len(p)
			if x&1 == 0 {
				n = min(n, 3)
			}
			e.Write(p[:n])
			p = p[n:]
			if flush && x&2 == 0 {
				e.Flush()
			}
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		got := rec.Body.Bytes()
		if cl := rec.Result().Header.Get("Content-Length"); cl != "" && cl != strconv.Itoa(len(got)) {
			t.Fatalf("Content-Length %s for %d bytes", cl, len(got))
		}
		if useGzip {
			zr, err := gzip.NewReader(bytes.NewReader(got))
			if err != nil {
				t.Fatal(err)
			}
			if got, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
		}
		if string(got) != want {
			t.Fatalf("%q → %q, want %q", body, got, want)
		}
	})
}

// TestExtensionsWriterHEAD: a HEAD response whose GET would be rewritten
// says no Content-Length (the GET's would be longer than the upstream's)
// and the GET's weak ETag; one whose GET would not keeps its header.
func TestExtensionsWriterHEAD(t *testing.T) {
	for _, tc := range []struct {
		name, ctype, cl, etag string
	}{
		{"JSON", "application/json", "", `W/"v1"`},
		{"JSON, gzip", "application/json", "", `W/"v1"`},
		{"text", "text/plain", "16", `"v1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := []string{"Content-Type: " + tc.ctype, "Content-Length: 16", `Etag: "v1"`}
			if strings.Contains(tc.name, "gzip") {
				hdr = append(hdr, "Content-Encoding: gzip")
			}
			rec := serveThrough(t, ExtensionsOptions{Build: testBuild, NoBody: true}, 200, nil, hdr...)
			res := rec.Result()
			if cl, et := res.Header.Get("Content-Length"), res.Header.Get("Etag"); cl != tc.cl || et != tc.etag || rec.Body.Len() != 0 {
				t.Fatalf("Content-Length %q, ETag %s, %d bytes; want %q, %s", cl, et, rec.Body.Len(), tc.cl, tc.etag)
			}
		})
	}
}
