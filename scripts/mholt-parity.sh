#!/usr/bin/env bash
# Side-by-side check of Cascade against mholt/caddy-ratelimit v0.1.0.
#
# Builds two Caddys on the same Caddy version (v2.11.9): one with mholt's
# plugin at exactly v0.1.0, in a throwaway module under a temporary
# directory, and Cascade's ./cmd/caddy from this repository. Starts both on
# free loopback ports with the same Caddyfile (mholt's README dynamic
# example, 2 events per 5s keyed by {remote_host}, plus zones of 3 per 2s
# and 100 per 10s keyed by an X-Client header), sends both the same traffic
# at the same instants (scripts/mholtparity), and prints how many requests
# each admitted per traffic pattern.
#
#   scripts/mholt-parity.sh
#
# Exit status: 0 if every count is the same, 1 if one differs, 2 if the
# run failed (a build, a server, an answer other than 200 or 429). The
# traffic takes 30 s, bounded at 80 s; the builds take ~10 s with a warm
# module cache (the first downloads mholt's module and its dependencies
# through the Go module proxy). Nothing listens beyond 127.0.0.1; the
# servers are stopped and the temporary directory removed on exit, Ctrl-C
# included. The patterns and the table are described in
# scripts/mholtparity/main.go.
set -euo pipefail
cd "$(dirname "$0")/.."

MHOLT_VERSION=v0.1.0
CADDY_VERSION=v2.11.9

WORK=$(mktemp -d "${TMPDIR:-/tmp}/mholt-parity.XXXXXX")
PIDS=()
cleanup() {
	local pid
	trap '' INT TERM # a second signal must not cut the cleanup short
	for pid in ${PIDS[@]+"${PIDS[@]}"}; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in ${PIDS[@]+"${PIDS[@]}"}; do
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# fail <what>: a build step failed; show its output and exit 2 (not 1,
# which means the counts differ).
fail() {
	echo "mholt-parity: $1 failed:" >&2
	cat "$WORK/build.log" >&2 2>/dev/null || true
	exit 2
}

echo "== building Caddy $CADDY_VERSION with mholt/caddy-ratelimit $MHOLT_VERSION (throwaway module in $WORK/mholt)"
scripts/build-mholt.sh "$WORK" || exit 2
echo "== building Cascade (./cmd/caddy)"
go build -o "$WORK/caddy-cascade" ./cmd/caddy >"$WORK/build.log" 2>&1 || fail "building Cascade's Caddy"
go build -o "$WORK/driver" ./scripts/mholtparity >"$WORK/build.log" 2>&1 || fail "building the traffic driver"

# One Caddyfile for both servers: the port and data directory come from
# the environment. Each zone sits in a route of its own, so the directive
# order (which the plugins register differently) plays no part.
cat >"$WORK/Caddyfile" <<'EOF'
{
	admin off
	auto_https off
	persist_config off
	storage file_system {$PARITY_DATA}
}

http://127.0.0.1:{$PARITY_PORT} {
	bind 127.0.0.1
	handle /ready {
		respond "ready" 200
	}
	handle /dynamic {
		route {
			rate_limit {
				zone dynamic_example {
					key    {remote_host}
					events 2
					window 5s
				}
			}
			respond 200
		}
	}
	handle /three {
		route {
			rate_limit {
				zone three_per_2s {
					key    {http.request.header.X-Client}
					events 3
					window 2s
				}
			}
			respond 200
		}
	}
	handle /hundred {
		route {
			rate_limit {
				zone hundred_per_10s {
					key    {http.request.header.X-Client}
					events 100
					window 10s
				}
			}
			respond 200
		}
	}
}
EOF

ports=$("$WORK/driver" -freeports 2)
PORT_MHOLT=$(sed -n 1p <<<"$ports")
PORT_CASCADE=$(sed -n 2p <<<"$ports")
start() { # name port
	mkdir -p "$WORK/data-$1" "$WORK/home-$1"
	HOME="$WORK/home-$1" XDG_DATA_HOME="$WORK/home-$1" XDG_CONFIG_HOME="$WORK/home-$1" \
		PARITY_PORT="$2" PARITY_DATA="$WORK/data-$1" \
		"$WORK/caddy-$1" run --adapter caddyfile --config "$WORK/Caddyfile" >"$WORK/$1.log" 2>&1 &
	PIDS+=($!)
}
start mholt "$PORT_MHOLT"
start cascade "$PORT_CASCADE"
echo "== mholt on 127.0.0.1:$PORT_MHOLT, Cascade on 127.0.0.1:$PORT_CASCADE; driving traffic"
echo

# In the background, so that a signal runs the traps at once.
"$WORK/driver" -mholt "http://127.0.0.1:$PORT_MHOLT" -cascade "http://127.0.0.1:$PORT_CASCADE" &
PIDS+=($!)
rc=0
wait "$!" || rc=$?
if [ "$rc" = 2 ]; then
	for name in mholt cascade; do
		echo "-- last lines of $name's log" >&2
		tail -n 20 "$WORK/$name.log" >&2 || true
	done
fi
exit "$rc"
