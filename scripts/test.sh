#!/usr/bin/env bash
# Runs every test of Cascade: vet, the race-enabled test suite (memory store,
# a real redis-server and a real Redis Cluster started by the tests
# themselves), then each fuzz target briefly.
#
# On a fresh Debian machine it installs what the tests need first:
# redis-server and redis-cli (Debian package redis-server), nginx (Debian
# package nginx, for the auth_request example's test), curl (its retry loop
# against idempotency replay), Node.js and npm (Debian packages nodejs and
# npm), prometheus and promtool (Debian package prometheus, for the alert
# rules' and the Grafana dashboard's tests), Chromium (Debian package
# chromium, for the status page's test) and, with npm, the official OpenAI,
# Anthropic and Stripe SDKs that the LLM gateway's and replay's tests drive
# (internal/sdktest). The prometheus package may start its own service;
# the tests run their own prometheus on a free port.
#
#   scripts/test.sh                     # everything
#   FUZZTIME=200000x scripts/test.sh    # fuzz longer (default 20000 inputs per target)
#
# Fuzzing is bounded by a count of inputs, not a duration: Go 1.26's fuzz
# coordinator can report a spurious "context deadline exceeded" when a
# duration runs out while a worker is mid-input (golang/go#75804).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin"

need_install=
command -v redis-server >/dev/null 2>&1 || need_install=1
command -v redis-cli >/dev/null 2>&1 || need_install=1
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_install=1
command -v node >/dev/null 2>&1 || need_install=1
command -v npm >/dev/null 2>&1 || need_install=1
command -v curl >/dev/null 2>&1 || need_install=1
command -v prometheus >/dev/null 2>&1 || need_install=1
command -v promtool >/dev/null 2>&1 || need_install=1
command -v chromium >/dev/null 2>&1 || need_install=1
if [ -n "$need_install" ]; then
	echo "== installing redis-server, nginx, curl, nodejs, npm, prometheus and chromium (Debian packages)"
	sudo=""
	[ "$(id -u)" = 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	pkgs="redis-server nginx curl"
	command -v node >/dev/null 2>&1 || pkgs="$pkgs nodejs"
	command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
	{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || pkgs="$pkgs prometheus"
	command -v chromium >/dev/null 2>&1 || pkgs="$pkgs chromium"
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $pkgs >/dev/null
fi
redis-server --version
echo "== the OpenAI, Anthropic and Stripe SDKs (npm ci in internal/sdktest)"
(cd internal/sdktest && npm ci --no-audit --no-fund --loglevel=error)

echo "== go vet"
go vet ./...
(cd traefik && go vet ./...) # the Traefik plugin, a module of its own

echo "== go test -race"
# The compatibility test builds envoyproxy/ratelimit from the Go module
# proxy; here it must run, never skip.
export CASCADE_ENVOY_COMPAT=require
if ! go test -race -count=1 -timeout 15m ./...; then
	echo "== go test failed (above): the fuzz stage was skipped" >&2
	exit 1
fi

echo "== fuzz (${FUZZTIME:-20000x} per target)"
fuzzlog=$(mktemp "${TMPDIR:-/tmp}/cascade-fuzz.XXXXXX")
trap 'rm -f "$fuzzlog"' EXIT
grep -rl --include='*_test.go' '^func Fuzz' . | sort | while read -r file; do
	dir=$(dirname "$file")
	for target in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$file" | cut -d' ' -f2); do
		echo "-- $dir $target"
		go test -run "^$" -fuzz "^${target}\$" -fuzztime "${FUZZTIME:-20000x}" -fuzzminimizetime=200x "$dir" >"$fuzzlog" 2>&1 || {
			cat "$fuzzlog"
			echo "== fuzzing $dir $target failed (above)" >&2
			exit 1
		}
	done
done
echo "== all tests passed"
