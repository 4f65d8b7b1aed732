package admin

import (
	"strings"
	"testing"
)

func TestParseLimit(t *testing.T) {
	tests := []struct {
		in, want, err string
	}{
		{in: "50000/h", want: "50000/h"},
		{in: "5000000 tokens/h", want: "5000000 tokens/h"},
		{in: "100 tokens/h burst 10", want: "100 tokens/h burst 10"},
		{in: "100/h sliding approx", want: "100/h sliding approx"},
		{in: "10/month tz Europe/Paris", want: "10/month"},
		{in: "1_000/min sliding", want: "1000/min sliding"},
		{in: "", err: "empty"},
		{in: "100", err: "no period"},
		{in: "-5/h", err: "positive"},
		{in: "5/fortnight", err: "fortnight"},
		{in: "5/h burst", err: "needs a value"},
		{in: "5/h loud", err: "unexpected"},
	}
	for _, tt := range tests {
		l, err := ParseLimit(tt.in)
		switch {
		case tt.err != "":
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: %v, want an error saying %q", tt.in, err, tt.err)
			}
		case err != nil:
			t.Errorf("%q: %v", tt.in, err)
		case l.String() != tt.want:
			t.Errorf("%q: %s, want %s", tt.in, l.String(), tt.want)
		}
	}
}

func TestPathQuery(t *testing.T) {
	q, err := pathQuery("acme", []string{"org=acme", "user=a:b/é", "tree=x"})
	if err != nil {
		t.Fatal(err)
	}
	if q.Get("tree") != "acme" || q.Get("tier.user") != "a:b/é" || q.Get("tier.tree") != "x" {
		t.Fatalf("%v", q)
	}
	if _, err := pathQuery("acme", []string{"alice"}); err == nil {
		t.Fatal("a value without its tier was accepted")
	}
}
