package entitle

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeFile replaces path's content, as an editor or a deploy would: a
// new file renamed over the old one.
func writeFile(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// planOf looks value up in f, failing t on an error.
func planOf(t *testing.T, f *File, value string) (string, bool) {
	t.Helper()
	e, found, err := f.Lookup(context.Background(), value)
	if err != nil {
		t.Fatal(err)
	}
	return e.Plan, found
}

func TestFileFormats(t *testing.T) {
	tests := []struct {
		name, content string
	}{
		{"plans.json", `{"acme": {"plan": "enterprise", "limits": [{"count": 100, "per": "h", "dimension": "tokens"}], "seats": 40}, "42": {"plan": "pro"}}`},
		{"plans.yaml", "acme:\n  plan: enterprise\n  limits:\n    - {count: 100, per: h, dimension: tokens}\n  seats: 40\n42:\n  plan: pro\n"},
		{"plans.yml", "acme: {plan: enterprise, limits: [{count: 100, per: h, dimension: tokens}], seats: 40}\n42: {plan: pro}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), tt.name)
			writeFile(t, path, tt.content)
			f, err := NewFile(path, FileOptions{Poll: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			e, found, err := f.Lookup(context.Background(), "acme")
			if err != nil || !found {
				t.Fatalf("acme: found %v, error %v", found, err)
			}
			if e.Plan != "enterprise" || len(e.Limits) != 1 || e.Limits[0].Count != 100 || e.Limits[0].Dimension != "tokens" ||
				e.Fields["seats"] != "40" || e.Fields["plan"] != "enterprise" {
				t.Errorf("acme: %+v (limits %+v)", e, e.Limits)
			}
			if plan, found := planOf(t, f, "42"); !found || plan != "pro" {
				t.Errorf("42: plan %q, found %v", plan, found)
			}
			if _, found := planOf(t, f, "nobody"); found {
				t.Error("nobody: found")
			}
		})
	}
}

func TestNewFileErrors(t *testing.T) {
	tests := []struct {
		name, file, content string
		want                []string // parts of the error
	}{
		{"missing", "plans.json", "", []string{"no such file"}},
		{"not JSON", "plans.json", `{"acme": `, []string{"want a JSON object", "unexpected end"}},
		{"an array", "plans.json", `[]`, []string{"want a JSON object"}},
		{"null", "plans.json", `null`, []string{"not null"}},
		{"every bad entry", "plans.json", `{"b": {"plan": 1}, "a": [], "ok": {}}`, []string{`value "a": want an object`, `value "b": plan: want a string`}},
		{"bad YAML", "plans.yaml", "acme: [", []string{"want a YAML mapping"}},
		{"empty YAML", "plans.yaml", "", []string{"the file is empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), tt.file)
			if tt.name != "missing" {
				writeFile(t, path, tt.content)
			}
			f, err := NewFile(path, FileOptions{})
			if err == nil {
				f.Close()
				t.Fatal("no error")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

func TestFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plans.json")
	writeFile(t, path, `{"acme": {"plan": "pro"}}`)
	var reported []error
	f, err := NewFile(path, FileOptions{Poll: -1, OnError: func(err error) { reported = append(reported, err) }})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	steps := []struct {
		name, content string
		wantErr       bool
		acme, initech string // plans expected after the reload ("": not found)
	}{
		{"an upgrade and a new value", `{"acme": {"plan": "enterprise"}, "initech": {"plan": "free"}}`, false, "enterprise", "free"},
		{"a broken rewrite keeps the last good", `{"acme": {"plan": "enterprise"`, true, "enterprise", "free"},
		{"a bad entry keeps the last good", `{"acme": {"plan": 7}}`, true, "enterprise", "free"},
		{"fixed", `{"acme": {"plan": "pro"}}`, false, "pro", ""},
	}
	for _, s := range steps {
		writeFile(t, path, s.content)
		before := len(reported)
		err := f.Reload()
		if (err != nil) != s.wantErr {
			t.Fatalf("%s: Reload error %v", s.name, err)
		}
		if s.wantErr && (len(reported) != before+1 || reported[before] != err) {
			t.Fatalf("%s: OnError told %v, want the error %v", s.name, reported[before:], err)
		}
		for value, want := range map[string]string{"acme": s.acme, "initech": s.initech} {
			if plan, found := planOf(t, f, value); plan != want || found != (want != "") {
				t.Errorf("%s: %s has plan %q (found %v), want %q", s.name, value, plan, found, want)
			}
		}
	}
}

func TestFilePoll(t *testing.T) {
	path := filepath.Join(t.TempDir(), "plans.yaml")
	writeFile(t, path, "acme: {plan: pro}\n")
	errs := make(chan error, 10)
	f, err := NewFile(path, FileOptions{Poll: 5 * time.Millisecond, OnError: func(err error) { errs <- err }})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	writeFile(t, path, "acme: {plan: enterprise}\n")
	eventually(t, "the upgrade seen", func() bool { plan, _ := planOf(t, f, "acme"); return plan == "enterprise" })

	writeFile(t, path, "acme: {plan: [\n")
	select {
	case err := <-errs:
		if !strings.Contains(err.Error(), "plans.yaml") {
			t.Errorf("OnError told %q, which does not name the file", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("OnError not told of a broken rewrite")
	}
	if plan, _ := planOf(t, f, "acme"); plan != "enterprise" {
		t.Errorf("after a broken rewrite, acme has plan %q, want the last good enterprise", plan)
	}
	time.Sleep(30 * time.Millisecond) // several polls of the unchanged broken file
	if n := len(errs); n != 0 {
		t.Errorf("an unchanged broken file was reported %d more times, want once", n)
	}

	os.Remove(path)
	select {
	case <-errs:
	case <-time.After(5 * time.Second):
		t.Fatal("OnError not told of a removed file")
	}
	writeFile(t, path, "acme: {plan: free}\n")
	eventually(t, "the file's return seen", func() bool { plan, _ := planOf(t, f, "acme"); return plan == "free" })

	done := make(chan struct{})
	go func() { f.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not stop the poller")
	}
}

func BenchmarkFileLookup(b *testing.B) {
	path := filepath.Join(b.TempDir(), "plans.json")
	writeFile(b, path, `{"acme": {"plan": "enterprise", "limits": [{"count": 100, "per": "h"}]}}`)
	f, err := NewFile(path, FileOptions{Poll: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, found, _ := f.Lookup(ctx, "acme"); !found {
			b.Fatal("not found")
		}
	}
}
