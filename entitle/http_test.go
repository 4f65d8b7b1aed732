package entitle

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/caddy-cascade/cascade/hierarchy"
)

func TestHTTP(t *testing.T) {
	var gotPath, gotAuth string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotAuth = r.URL.EscapedPath(), r.Header.Get("Authorization")
		switch strings.TrimPrefix(r.URL.Path, "/orgs/") {
		case "acme", "a/b c":
			w.Write([]byte(`{"plan":"pro","limits":[{"count":5,"per":"min"}],"seats":3}`))
		case "nobody":
			http.NotFound(w, r)
		case "broken":
			w.WriteHeader(http.StatusBadGateway)
		case "html":
			w.Write([]byte(`<html>`))
		case "array":
			w.Write([]byte(`[]`))
		case "huge":
			w.Write([]byte(`{"plan":"` + strings.Repeat("x", maxBody) + `"}`))
		}
	}))
	defer srv.Close()
	src, err := NewHTTP(srv.URL+"/orgs/{value}", HTTPOptions{Header: http.Header{"Authorization": {"Bearer s3cret"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	pro := Entitlement{Plan: "pro", Limits: []*hierarchy.Limit{{Count: 5, Per: "min"}}, Fields: map[string]string{"plan": "pro", "seats": "3"}}

	tests := []struct {
		value    string
		want     Entitlement
		found    bool
		wantErr  string
		wantPath string // as sent; "" is /orgs/value
	}{
		{value: "acme", want: pro, found: true},
		{value: "a/b c", want: pro, found: true, wantPath: "/orgs/a%2Fb%20c"},
		{value: "nobody"},
		{value: "broken", wantErr: "status 502 Bad Gateway"},
		{value: "html", wantErr: "invalid character"},
		{value: "array", wantErr: "want an object"},
		{value: "huge", wantErr: "over 1048576 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, found, err := src.Lookup(context.Background(), tt.value)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if found != tt.found || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v (found %v), want %+v (found %v)", got, found, tt.want, tt.found)
			}
			if want := tt.wantPath; want != "" && gotPath != want {
				t.Errorf("path %q, want %q", gotPath, want)
			}
			if gotAuth != "Bearer s3cret" {
				t.Errorf("Authorization %q, want the configured header", gotAuth)
			}
		})
	}
}

func TestNewHTTPTemplate(t *testing.T) {
	tests := []struct {
		template, wantErr string
	}{
		{"https://billing.internal/orgs/{value}?fields=plan", ""},
		{"http://127.0.0.1:8080/{value}", ""},
		{"https://billing.internal/orgs/", "say where the value goes"},
		{"ftp://billing.internal/{value}", "want an http:// or https:// URL"},
		{"/orgs/{value}", "want an http:// or https:// URL"},
		{"https:///orgs/{value}", "no host"},
		{"https://bad host/{value}", "invalid character"},
	}
	for _, tt := range tests {
		t.Run(tt.template, func(t *testing.T) {
			_, err := NewHTTP(tt.template, HTTPOptions{})
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("error %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func BenchmarkHTTPLookup(b *testing.B) {
	bill := newBilling(b, map[string]string{"acme": "enterprise"})
	src := bill.source(b)
	defer src.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, found, err := src.Lookup(ctx, "acme"); err != nil || !found {
			b.Fatal(found, err)
		}
	}
}
