#!/usr/bin/env bash
# The handlers alone, side by side, in one process each: mholt/caddy-ratelimit
# v0.1.0 and Cascade deciding the same requests of the same zone (events
# 1000, window 1s, keyed by a header, 5,000 keys: at 1,000 keys mholt's
# faster handler would fill its keys' rings), with the requests, their
# replacers (as Caddy's server fills them) and response writers built
# outside the timer. What it measures is each handler's own CPU and
# allocations per request, without the network, the server or the
# collector's share of a loaded process (scripts/load.sh measures those).
# Cascade's handler runs three ways: with `headers none`; with `headers
# none` and `placeholders refused` (mholt's output for an admitted request:
# no header, no placeholder); and with its default headers.
#
#   scripts/handler-bench.sh            # 6 alternated runs of each
#   COUNT=10 scripts/handler-bench.sh
#
# The two plugins register the same directive, so each is benchmarked in a
# package of its own, in a throwaway module under a temporary directory
# (Cascade from this checkout, mholt's from the module proxy).
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-6}
repo=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOWORK=off GOFLAGS=-mod=mod

mkdir -p "$work/harness" "$work/mholt" "$work/cascade"
cat >"$work/harness/harness.go" <<'GO'
// Package harness serves b.N requests through a handler, building them
// outside the timer.
package harness

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Zone is the handlers' JSON: one zone, with more fields appended.
const Zone = `{"rate_limits":{"users":{"key":"{http.request.header.X-User}","window":1000000000,"max_events":1000}}%s}`

const keys, batch = 5000, 1024

type writer struct {
	hdr  http.Header
	code int
}

func (w *writer) Header() http.Header         { return w.hdr }
func (w *writer) Write(b []byte) (int, error) { return len(b), nil }
func (w *writer) WriteHeader(code int)        { w.code = code }

// Run serves b.N requests through h, each admitted, after one request of
// each key (untimed: both handlers then have every key's state).
func Run(b *testing.B, h caddyhttp.MiddlewareHandler) {
	next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })
	reqs := make([]*http.Request, batch)
	ws := make([]writer, batch)
	proto := httptest.NewRequest("GET", "/", nil)
	for n := range keys {
		r := proto.WithContext(context.Background())
		r.Header = http.Header{"X-User": {fmt.Sprintf("user%d", n)}}
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddyhttp.NewTestReplacer(r)))
		if err := h.ServeHTTP(&writer{hdr: http.Header{}}, r, next); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		k := n % batch
		if k == 0 {
			b.StopTimer()
			for j := range reqs {
				r := proto.WithContext(context.Background())
				r.Header = http.Header{"X-User": {fmt.Sprintf("user%d", (n+j)%keys)}}
				repl := caddyhttp.NewTestReplacer(r)
				reqs[j] = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
				ws[j] = writer{hdr: http.Header{"Server": {"Caddy"}}}
			}
			b.StartTimer()
		}
		if err := h.ServeHTTP(&ws[k], reqs[k], next); err != nil || ws[k].code == http.StatusTooManyRequests {
			b.Fatal("refused: ", err, ws[k].code)
		}
	}
}
GO
cat >"$work/mholt/mholt_test.go" <<'GO'
package mholt

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2"
	ratelimit "github.com/mholt/caddy-ratelimit"

	"handlerbench.invalid/harness"
)

func BenchmarkHandler(b *testing.B) {
	b.Run("mholt", func(b *testing.B) {
		h := new(ratelimit.Handler)
		if err := json.Unmarshal([]byte(fmt.Sprintf(harness.Zone, "")), h); err != nil {
			b.Fatal(err)
		}
		// mholt's handler needs the events app: a running (empty) config.
		if err := caddy.Load([]byte(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}}}`), false); err != nil {
			b.Fatal(err)
		}
		if err := h.Provision(caddy.ActiveContext()); err != nil {
			b.Fatal(err)
		}
		harness.Run(b, h)
	})
}
GO
cat >"$work/cascade/cascade_test.go" <<'GO'
package cascade

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/caddy-cascade/cascade"
	"github.com/caddyserver/caddy/v2"

	"handlerbench.invalid/harness"
)

func BenchmarkHandler(b *testing.B) {
	for _, tt := range []struct{ name, more string }{
		{"cascade-headers-none", `,"headers":{"ietf":false,"retry_after":false}`},
		{"cascade-mholt-output", `,"headers":{"ietf":false,"retry_after":false},"placeholders":"refused"`},
		{"cascade-headers-default", ""},
	} {
		b.Run(tt.name, func(b *testing.B) {
			h := new(cascade.Handler)
			if err := json.Unmarshal([]byte(fmt.Sprintf(harness.Zone, tt.more)), h); err != nil {
				b.Fatal(err)
			}
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			if err := h.Provision(ctx); err != nil {
				b.Fatal(err)
			}
			defer h.Cleanup()
			harness.Run(b, h)
		})
	}
}
GO
caddy_version=$(go list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2)
go_version=$(awk '$1 == "go" {print $2; exit}' go.mod)
cat >"$work/go.mod" <<MOD
module handlerbench.invalid

go $go_version

require (
	github.com/caddy-cascade/cascade v0.0.0
	github.com/mholt/caddy-ratelimit v0.1.0
	github.com/caddyserver/caddy/v2 $caddy_version
)

replace github.com/caddy-cascade/cascade => $repo
MOD
if ! (cd "$work" && go mod tidy && go test -c -o mholt.test ./mholt && go test -c -o cascade.test ./cascade) >"$work/build.log" 2>&1; then
	echo "handler-bench: building the benchmarks failed:" >&2
	cat "$work/build.log" >&2
	exit 2
fi

echo "== the handlers alone, $COUNT alternated runs each (ns/op, B/op, allocs/op)"
for _ in $(seq "$COUNT"); do
	for bin in mholt cascade; do
		if ! "$work/$bin.test" -test.run '^$' -test.bench . -test.benchtime 300000x >"$work/out.txt" 2>&1; then
			echo "handler-bench: the $bin benchmark failed:" >&2
			cat "$work/out.txt" >&2
			exit 2
		fi
		grep '^BenchmarkHandler' "$work/out.txt" >>"$work/runs.txt"
	done
done
if command -v benchstat >/dev/null 2>&1; then
	benchstat "$work/runs.txt"
else
	python3 - "$work/runs.txt" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    rows[f[0]].append((float(f[2]), float(f[4]), float(f[6])))
for name, rs in rows.items():
    print("%-34s %8.0f ns/op (median of %d)  %5.0f B/op  %3.0f allocs/op" % (
        name, statistics.median(r[0] for r in rs), len(rs), rs[0][1], rs[0][2]))
PY
fi

