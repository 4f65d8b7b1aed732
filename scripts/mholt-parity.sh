#!/usr/bin/env bash
# Side by side with mholt/caddy-ratelimit: builds a Caddy with mholt's
# plugin v0.1.0 (in a throwaway module, on the same Caddy as Cascade) and
# Cascade's ./cmd/caddy, loads both with the same Caddyfile — mholt's
# README example and zones of 3 per 2 s, 2 per 5 s and 100 per 10 s — and
# sends the same requests to both at the same instants (bursts, a window's
# wait, steady rates just above and below the limits; see
# scripts/mholtparity). It prints the requests each admitted per pattern and
# exits 1 if any count differs. About a minute, loopback only; it stops the
# servers and removes its files at exit.
#
#   scripts/mholt-parity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
caddy_version=$(go list -m -f '{{.Version}}' github.com/caddyserver/caddy/v2)

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

echo "== building Caddy $caddy_version with mholt/caddy-ratelimit v0.1.0"
mkdir "$work/mholt"
cat >"$work/mholt/main.go" <<'GO'
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/mholt/caddy-ratelimit"
)

func main() { caddycmd.Main() }
GO
(
	cd "$work/mholt"
	go mod init mholtcaddy >/dev/null 2>&1
	go get "github.com/caddyserver/caddy/v2@$caddy_version" github.com/mholt/caddy-ratelimit@v0.1.0 >/dev/null 2>&1
	go mod tidy >/dev/null 2>&1
	go build -o "$work/caddy-mholt" .
)
echo "== building Cascade's Caddy"
go build -o "$work/caddy-cascade" ./cmd/caddy
go build -o "$work/driver" ./scripts/mholtparity

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# caddyfile PORT: the same sites for both plugins.
caddyfile() {
	cat <<CADDY
{
	admin off
	auto_https off
	skip_install_trust
	persist_config off
}

# mholt's README example, as written but for the address.
http://127.0.0.1:$1 {
	handle /readme {
		rate_limit {
			distributed
			zone static_example {
				match {
					method GET
				}
				key    static
				events 100
				window 1m
			}
			zone dynamic_example {
				key    {remote_host}
				events 2
				window 5s
			}
			log_key
		}
		respond "I'm behind the rate limiter!"
	}
	handle {
		rate_limit {
			zone z3 {
				match {
					path /z3
				}
				key    {http.request.header.X-Client}
				events 3
				window 2s
			}
			zone z2 {
				match {
					path /z2
				}
				key    {http.request.header.X-Client}
				events 2
				window 5s
			}
			zone z100 {
				match {
					path /z100
				}
				key    {http.request.header.X-Client}
				events 100
				window 10s
			}
		}
		respond "ok"
	}
}
CADDY
}

start() { # name port
	caddyfile "$2" >"$work/$1.Caddyfile"
	"$work/caddy-$1" run --adapter caddyfile --config "$work/$1.Caddyfile" >"$work/$1.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 100); do
		curl -s -o /dev/null "http://127.0.0.1:$2/nowhere" && return
		sleep 0.1
	done
	echo "$1 did not start:"; cat "$work/$1.log"; exit 1
}
mholt_port=$(free_port)
cascade_port=$(free_port)
start mholt "$mholt_port"
start cascade "$cascade_port"
# The probes above touched no zone's key (no path of a zone, no client).

echo "== the same requests to both, at the same instants"
"$work/driver" -mholt "http://127.0.0.1:$mholt_port" -cascade "http://127.0.0.1:$cascade_port"
