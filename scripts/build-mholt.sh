#!/usr/bin/env bash
# Builds a Caddy with mholt/caddy-ratelimit at exactly v0.1.0, on the Caddy
# version Cascade builds on (v2.11.9), in a throwaway module under DIR, and
# writes the binary to DIR/caddy-mholt. Used by mholt-parity.sh and
# load.sh for side-by-side runs.
#
#   scripts/build-mholt.sh DIR
#
# Exit status 2, with the build's output, if a step fails or the versions
# resolved are not those.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:?usage: scripts/build-mholt.sh DIR}
MHOLT_VERSION=v0.1.0
CADDY_VERSION=v2.11.9

fail() {
	echo "build-mholt: $1 failed:" >&2
	cat "$WORK/build.log" >&2 2>/dev/null || true
	exit 2
}

mkdir -p "$WORK/mholt"
cat >"$WORK/mholt/main.go" <<'GO'
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-ratelimit"
)

func main() { caddycmd.Main() }
GO
(
	cd "$WORK/mholt"
	export GOWORK=off GOFLAGS=-mod=mod
	[ -f go.mod ] || go mod init parity.invalid/mholtcaddy
	go get "github.com/mholt/caddy-ratelimit@$MHOLT_VERSION" &&
		go get "github.com/caddyserver/caddy/v2@$CADDY_VERSION" &&
		go mod tidy
) >"$WORK/build.log" 2>&1 || fail "preparing the mholt module"
got_rl=$(cd "$WORK/mholt" && GOWORK=off go list -m -f '{{.Version}}' github.com/mholt/caddy-ratelimit 2>"$WORK/build.log") ||
	fail "reading the mholt module's versions"
got_caddy=$(cd "$WORK/mholt" && GOWORK=off go list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2 2>"$WORK/build.log") ||
	fail "reading the mholt module's versions"
if [ "$got_rl" != "$MHOLT_VERSION" ] || [ "$got_caddy" != "$CADDY_VERSION" ]; then
	echo "build-mholt: the mholt module resolved caddy-ratelimit $got_rl and caddy $got_caddy; want $MHOLT_VERSION and $CADDY_VERSION" >&2
	exit 2
fi
(cd "$WORK/mholt" && GOWORK=off go build -o "$WORK/caddy-mholt" .) >"$WORK/build.log" 2>&1 || fail "building mholt's Caddy"
got_caddy=$(go list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2 2>"$WORK/build.log") || fail "reading Cascade's Caddy version"
if [ "$got_caddy" != "$CADDY_VERSION" ]; then
	echo "build-mholt: Cascade builds on caddy $got_caddy; want $CADDY_VERSION, as mholt's side" >&2
	exit 2
fi
