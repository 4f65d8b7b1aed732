#!/usr/bin/env bash
# Load test on loopback: plain Caddy `respond`, Cascade on the memory store
# (4 tiers, 1,000 users), Cascade on Redis (4 tiers, Redis on this machine)
# deciding every request there (strict), and the same with capacity leases
# (`lease`: most requests decided in memory on capacity leased from Redis),
# with wrk (1 thread, 32 connections). Prints requests/s, p50 and p99 of
# each run, Caddy's CPU per request (and its collector's), the throughput
# ratios against plain Caddy, Redis's script calls per request and Redis's
# CPU per request.
#
# This machine's speed drifts by ±30% within a minute, so runs far apart in
# time cannot be compared: the four Caddys run side by side, started once
# (an idle one costs the others nothing), and each round runs wrk against
# each in turn for DURATION (after WARMUP, 1 s, of the same load), the
# order turning every other round and reversed in the rounds between:
# what ran just before moves a run by a few percent, so each Caddy runs
# just after any other as often as just before it. Each ratio is taken
# within a round, and the median over the rounds is reported.
#
#   scripts/load.sh                      # 8 rounds of 5 s runs
#   ROUNDS=12 DURATION=3s scripts/load.sh
#   LEASE=$'lease {\n\tttl 2s\n}' scripts/load.sh   # the lease run's options
#   MHOLT=1 scripts/load.sh              # the memory store against mholt
#   PLANS=1 scripts/load.sh              # the memory store with plans, and without
#
# With MHOLT=1 the five Caddys are: plain; mholt/caddy-ratelimit v0.1.0
# (built by scripts/build-mholt.sh) with one zone keyed by the user header
# (1,000 keys); Cascade with the same zone and `headers none` (mholt
# writes no rate-limit header on an admitted response); Cascade with
# `headers none` and `placeholders refused` (mholt's output: nor does it
# publish a placeholder for an admitted request); and Cascade with the
# same zone and its default headers; 12 rounds of 3 s runs by default.
# Cascade's ratios are also taken against mholt's in the same round; and
# each round ends with mholt and each Cascade without headers loaded at
# once, two by two, each by its own wrk, for DURATION: the two then share
# every moment of the machine's drift, and the one that costs less a
# request serves more (the ratio of those is reported too, with each one's
# CPU per request over the same seconds).
#
# With PLANS=1 the three Caddys are: plain; Cascade on the memory store;
# and Cascade with the same tree given a free and a pro plan on each tier,
# the plan from an entitlements file of the 1,000 users (half of them
# pro); the ratios are against plain Caddy, and with plans against without.
#
# It installs wrk and redis-server from Debian if absent, builds ./cmd/caddy,
# starts its own redis-server on a free port, and stops everything at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${MHOLT:-}" ] && [ -n "${PLANS:-}" ]; then
	echo "load.sh: MHOLT and PLANS are two different runs: set one" >&2
	exit 2
fi
if [ -n "${MHOLT:-}" ]; then # short runs, many rounds (see below)
	DURATION=${DURATION:-3s}
	ROUNDS=${ROUNDS:-12}
fi
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-8}
CONNS=${CONNS:-32}
LEASE=${LEASE:-lease}
WARMUP=${WARMUP:-1s}

for pkg in wrk redis-server; do
	if ! command -v "$pkg" >/dev/null 2>&1; then
		sudo=""
		[ "$(id -u)" = 0 ] || sudo="sudo"
		$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$pkg" >/dev/null
	fi
done

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "== building ./cmd/caddy"
go build -o "$work/caddy" ./cmd/caddy

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no >"$work/redis.log" 2>&1 &
redis_pid=$!
pids+=($redis_pid)
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

# 1000 users in 50 teams of 10 organisations, 3 agents each.
cat >"$work/headers.lua" <<'LUA'
local n = 0
request = function()
	n = n + 1
	local u = n % 1000
	return wrk.format("GET", "/", {
		["X-Org"] = "org" .. (u % 10), ["X-Team"] = "team" .. (u % 50),
		["X-User"] = "user" .. u, ["X-Agent"] = "agent" .. (u % 3)})
end
LUA

# The tiers of the tree acme, each NAME:HEADER (the headers headers.lua sets).
tiers="org:X-Org team:X-Team user:X-User agent:X-Agent"

# acme_tree HEAD BODY: the tree acme, HEAD's lines first, each tier's block
# BODY.
acme_tree() {
	local t tree="
		tree acme {$1"
	for t in $tiers; do
		tree+="
			tier ${t%%:*} {header.${t#*:}} {$2
			}"
	done
	printf '%s\n\t\t}' "$tree"
}

limits=$(acme_tree "" "
				limit 1000000000/h")

# start NAME BLOCK [BINARY]: starts a Caddy serving BLOCK ("" for none) in
# front of `respond`, and warms it up; its port and pid go to NAME.port and
# NAME.pid.
start() {
	local name=$1 block=$2 bin=${3:-$work/caddy} port
	port=$(free_port)
	cat >"$work/$name.Caddyfile" <<CF
{
	admin off
	auto_https off
	persist_config off
}
http://127.0.0.1:$port {
	$block
	respond "ok"
}
CF
	# gctrace: each collection's line on stderr, for its CPU (see gc_of)
	GODEBUG="${GODEBUG:+$GODEBUG,}gctrace=1" "$bin" run --config "$work/$name.Caddyfile" --adapter caddyfile >"$work/$name.log" 2>&1 &
	local pid=$!
	pids+=($pid)
	echo "$port" >"$work/$name.port"
	echo "$pid" >"$work/$name.pid"
	for _ in $(seq 100); do curl -fso /dev/null "http://127.0.0.1:$port/" -H 'X-Org: o' -H 'X-Team: t' -H 'X-User: u' -H 'X-Agent: a' && break; sleep 0.1; done
	wrk -t1 -c"$CONNS" -d2s -s "$work/headers.lua" "http://127.0.0.1:$port/" >/dev/null # warm up
}

# ticks PID: the CPU time (user and system, in clock ticks) process PID
# has used.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# collections SERVER: how many collections the Caddy started as SERVER
# has logged.
collections() { grep -c '^gc ' "$work/$1.log" || true; }

# record SERVER RUN GC0 CPU0: what run RUN (wrk's output in RUN.wrk) cost
# the Caddy started as SERVER, which had logged GC0 collections and used
# CPU0 ticks before it: its CPU (RUN.ticks), its collections (RUN.gc), and
# the requests served (RUN.requests) and their rate (RUN.rps). A Caddy
# that exited during the run ends the script, with its log.
record() {
	local server=$1 name=$2 gc0=$3 cpu0=$4 cpu1
	cpu1=$(ticks "$(cat "$work/$server.pid")" 2>/dev/null) || {
		echo "== $name: Caddy exited during the run; its log:" >&2
		cat "$work/$server.log" >&2
		exit 2
	}
	echo "$((cpu1 - cpu0))" >"$work/$name.ticks"
	grep '^gc ' "$work/$server.log" | tail -n +"$((gc0 + 1))" >"$work/$name.gc" || true
	awk '/ requests in / {print $1}' "$work/$name.wrk" >"$work/$name.requests"
	awk '/^Requests\/sec/ {print $2}' "$work/$name.wrk" >"$work/$name.rps"
}

# measure SERVER RUN: one wrk run of DURATION against the Caddy started as
# SERVER, recorded as RUN (its throughput, latency, CPU and collections),
# after WARMUP of the same load unrecorded: a Caddy idle while the others
# ran has let its leases end and forgotten its paths, and is measured in
# its steady state, as the others are.
measure() {
	local server=$1 name=$2 port pid
	port=$(cat "$work/$server.port")
	pid=$(cat "$work/$server.pid")
	wrk -t1 -c"$CONNS" -d"$WARMUP" -s "$work/headers.lua" "http://127.0.0.1:$port/" >/dev/null
	redis-cli -p "$redis_port" config resetstat >/dev/null
	local gc0 cpu0 rcpu0 rcpu1
	gc0=$(collections "$server")
	cpu0=$(ticks "$pid")
	rcpu0=$(ticks "$redis_pid")
	wrk -t1 -c"$CONNS" -d"$DURATION" --latency -s "$work/headers.lua" "http://127.0.0.1:$port/" >"$work/$name.wrk"
	record "$server" "$name" "$gc0" "$cpu0"
	rcpu1=$(ticks "$redis_pid")
	redis-cli -p "$redis_port" info commandstats >"$work/$name.redis"
	echo "$((rcpu1 - rcpu0))" >"$work/$name.redis-ticks"
	local p50 p99 non2xx
	p50=$(awk '$1=="50%" {print $2}' "$work/$name.wrk")
	p99=$(awk '$1=="99%" {print $2}' "$work/$name.wrk")
	non2xx=$(awk '/Non-2xx/ {print $NF}' "$work/$name.wrk")
	printf '%-18s %10s req/s   p50 %8s   p99 %8s   non-2xx %s   %s\n' "$name" "$(cat "$work/$name.rps")" "$p50" "$p99" "${non2xx:-0}" "$(gc_of "$name")"
}

# measure_pair A B RUN: A and B measured at once, each under its own wrk
# of the same load (after WARMUP, at once too), recorded as A-with-B-RUN
# and B-at-once-RUN (A may be paired with several). Run one after the
# other, two servers meet different moments of a machine whose speed
# drifts; run at once, they share every moment, and what separates them is
# what each costs: the one cheaper a request serves more of them in its
# share of the cores (and its own CPU per request is measured over the
# same seconds).
measure_pair() {
	local a=$1 b=$2 run=$3 s
	local -A gc0 cpu0 name=(["$a"]="$a-with-$b-$run" ["$b"]="$b-at-once-$run")
	for s in "$a" "$b"; do
		wrk -t1 -c"$CONNS" -d"$WARMUP" -s "$work/headers.lua" "http://127.0.0.1:$(cat "$work/$s.port")/" >/dev/null &
	done
	wait_wrk
	for s in "$a" "$b"; do
		gc0[$s]=$(collections "$s")
		cpu0[$s]=$(ticks "$(cat "$work/$s.pid")")
	done
	local order=("$a" "$b")
	[ $((run % 2)) = 1 ] || order=("$b" "$a") # which starts first takes turns
	for s in "${order[@]}"; do
		wrk -t1 -c"$CONNS" -d"$DURATION" -s "$work/headers.lua" "http://127.0.0.1:$(cat "$work/$s.port")/" >"$work/${name[$s]}.wrk" &
	done
	wait_wrk
	for s in "$a" "$b"; do
		record "$s" "${name[$s]}" "${gc0[$s]}" "${cpu0[$s]}"
		printf '%-30s %10s req/s   %s\n' "${name[$s]}" "$(cat "$work/${name[$s]}.rps")" "$(gc_of "${name[$s]}")"
	done
}

# wait_wrk: waits for the wrk runs started in the background (not for the
# Caddys and Redis, which are this shell's children too).
wait_wrk() {
	local p
	for p in $(jobs -p); do
		case " ${pids[*]} " in
		*" $p "*) ;;
		*) wait "$p" || {
			echo "== wrk failed (exit status $?): is the Caddy it loads still answering?" >&2
			exit 2
		} ;;
		esac
	done
}

stop() { # NAME
	local pid
	pid=$(cat "$work/$1.pid")
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}

# gc_of NAME: what the measured run cost Caddy per request: its CPU, its
# collector's CPU (every phase of each collection, its idle workers'
# included: on a busy machine that time is taken from the load), and its
# collections per 1,000 requests.
gc_of() {
	python3 - "$work" "$1" <<'PY'
import os, re, sys
work, name = sys.argv[1], sys.argv[2]
requests = int(open("%s/%s.requests" % (work, name)).read() or 0)
ticks = int(open("%s/%s.ticks" % (work, name)).read())
cycles, ms = 0, 0.0
for line in open("%s/%s.gc" % (work, name)):
    m = re.search(r"([\d.]+)\+([\d.]+)/([\d.]+)/([\d.]+)\+([\d.]+) ms cpu", line)
    if m:
        cycles += 1
        ms += sum(map(float, m.groups()))
if requests:
    print("cpu/req %.1f µs, gc %.1f µs, %.2f gcs/1k req" % (ticks * 1e6 / os.sysconf("SC_CLK_TCK") / requests, ms * 1e3 / requests, cycles * 1e3 / requests))
PY
}

# cpu_medians KIND...: Caddy's CPU per request, and its collector's, of
# each KIND: the medians of gc_of over the rounds.
cpu_medians() {
	echo "== Caddy's CPU per request, and its collector's (medians over the rounds)"
	local kind r
	for kind in "$@"; do
		for r in $(seq "$ROUNDS"); do gc_of "$kind-$r"; done | python3 -c '
import re, statistics, sys
rows = [list(map(float, re.findall(r"[\d.]+", l))) for l in sys.stdin if l.strip()]
if rows: print("%-26s cpu/req %.1f µs, gc %.1f µs, %.2f gcs/1k req" % (sys.argv[1], *[statistics.median(r[i] for r in rows) for i in range(3)]))' "$kind"
	done
}

# ratios KIND:BASE...: the throughput of each KIND over its BASE's, taken
# within each round: the median, and each round's.
ratios() {
	python3 - "$work" "$ROUNDS" "$@" <<'PY'
import statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
rps = lambda name: float(open("%s/%s.rps" % (work, name)).read())
for pair in sys.argv[3:]:
    kind, base = pair.split(":")
    ratios = [rps("%s-%d" % (kind, r)) / rps("%s-%d" % (base, r)) for r in range(1, rounds + 1)]
    print("%-16s %.3f x %s (median of %s)" % (kind, statistics.median(ratios), "plain Caddy" if base == "plain" else base,
        " ".join("%.3f" % x for x in ratios)))
PY
}

# rounds KIND...: ROUNDS rounds of one run against each of the Caddys
# started as KIND; then stops them. The rounds go in pairs: the first of a
# pair runs the kinds in an order turned by one from the previous pair's,
# the second in the same order reversed (a rotation alone would run each
# Caddy after the same other one in most rounds). Over 2n rounds of n
# kinds, each kind runs just after any other as often as just before it.
rounds() {
	local kinds=("$@") n=$# round k i kind turn pair
	for round in $(seq "$ROUNDS"); do
		turn=$(((round - 1) / 2))
		for k in $(seq 0 $((n - 1))); do
			i=$k
			[ $((round % 2)) = 1 ] || i=$((n - 1 - k)) # the pair's second: reversed
			kind=${kinds[$(((i + turn) % n))]}
			measure "$kind" "$kind-$round"
		done
		for pair in ${PAIRS:-}; do # MHOLT's: two of them at once, as well (a:b)
			measure_pair "${pair%%:*}" "${pair#*:}" "$round"
		done
	done
	for kind in "${kinds[@]}"; do stop "$kind"; done
}

echo "== wrk -t1 -c$CONNS -d$DURATION (loopback, $(nproc) cores), $ROUNDS rounds"
if [ -n "${MHOLT:-}" ]; then
	echo "== building mholt/caddy-ratelimit v0.1.0's Caddy"
	scripts/build-mholt.sh "$work" || exit 2
	# The same zone for both; a route, so that neither plugin's directive
	# order matters. 1,000 events per second per user, far above the ~40/s
	# each of the 1,000 users gets: every request is admitted. (mholt keeps
	# a ring of `events` timestamps per key, so a huge count would cost it
	# gigabytes.)
	zone() { # extra options
		printf 'route {\n\t\trate_limit {\n\t\t\tzone users {\n\t\t\t\tkey {http.request.header.X-User}\n\t\t\t\tevents 1000\n\t\t\t\twindow 1s\n\t\t\t}\n\t\t\t%s\n\t\t}\n\t\trespond "ok"\n\t}' "$1"
	}
	# The five Caddys run side by side, started once (an idle one costs the
	# others nothing), and the rounds alternate short runs against each:
	# this machine's speed drifts by ±30% within a minute, so runs far
	# apart in time cannot be compared, and each ratio is taken within a
	# round, a few seconds long. The order turns every other round and is
	# reversed in the rounds between (what ran just before moves a run by
	# a few percent): Cascade runs as often just after mholt as just before
	# it, and the ratios of the odd and even rounds are shown apart too.
	start plain ""
	start mholt "$(zone "")" "$work/caddy-mholt"
	start cascade-none "$(zone "headers none")"
	start cascade-quiet "$(zone $'headers none\n\t\t\tplaceholders refused')"
	start cascade-default "$(zone "")"
	PAIRS="mholt:cascade-none mholt:cascade-quiet" rounds plain mholt cascade-none cascade-quiet cascade-default
	echo "== throughput against plain Caddy and against mholt (each in the same round)"
	python3 - "$work" "$ROUNDS" <<'PY'
import statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
rps = lambda name: float(open("%s/%s.rps" % (work, name)).read())
plain = lambda r: rps("plain-%d" % r)
for kind in ("mholt", "cascade-none", "cascade-quiet", "cascade-default"):
    ratios = [rps("%s-%d" % (kind, r)) / plain(r) for r in range(1, rounds + 1)]
    print("%-16s %.3f x plain Caddy (median of %s)" % (kind, statistics.median(ratios), " ".join("%.3f" % x for x in ratios)))
for kind in ("cascade-none", "cascade-quiet", "cascade-default"):
    ratios = [rps("%s-%d" % (kind, r)) / rps("mholt-%d" % r) for r in range(1, rounds + 1)]
    print("%-16s %.3f x mholt (median of %s)" % (kind, statistics.median(ratios), " ".join("%.3f" % x for x in ratios)))
    if rounds >= 4:
        print("%-16s %.3f x mholt in the odd rounds (plain, mholt, Cascade, turned), %.3f in the even (reversed)" % (
            kind, statistics.median(ratios[0::2]), statistics.median(ratios[1::2])))
for kind in ("cascade-none", "cascade-quiet"):
    ratios = [rps("%s-at-once-%d" % (kind, r)) / rps("mholt-with-%s-%d" % (kind, r)) for r in range(1, rounds + 1)]
    print("%-16s %.3f x mholt, the two at once (median of %s; geometric mean %.3f)" % (kind, statistics.median(ratios),
        " ".join("%.3f" % x for x in ratios), statistics.geometric_mean(ratios)))
PY
	# Where the difference goes: the whole process's CPU per request, and
	# its collector's share (mholt's rings, 24 MB at 1,000 keys, raise the
	# heap goal, and so collect several times less often).
	cpu_medians plain mholt cascade-none cascade-quiet cascade-default \
		mholt-with-cascade-none cascade-none-at-once mholt-with-cascade-quiet cascade-quiet-at-once
	exit 0
fi
if [ -n "${PLANS:-}" ]; then
	# The same tree with a free and a pro plan on each tier (both far above
	# the load: every request is admitted), the plan from an entitlements
	# file of the 1,000 users, half of them pro; the file is read once, and
	# each user's entitlement is looked up by its first request (during the
	# warm-up) and read from memory after that. Its cost is what plans add
	# to a request through a real Caddy.
	python3 - "$work/entitlements.json" <<'PY'
import json, sys
json.dump({"user%d" % u: {"plan": ("free", "pro")[u % 2]} for u in range(1000)}, open(sys.argv[1], "w"))
PY
	plans='
		entitlements customers {
			source file "'"$work"'/entitlements.json"
			key user
		}'$(acme_tree "
			plan {http.rate_limit.entitlement.customers.plan} default free" "
				plan free {
					limit 1000000000/h
				}
				plan pro {
					limit 2000000000/h
				}")
	start plain ""
	start cascade-memory "rate_limit {$limits
	}"
	start cascade-plans "rate_limit {$plans
	}"
	# A pro user's policy is the pro plan's, or the runs measure nothing.
	pro=$(curl -fsi "http://127.0.0.1:$(cat "$work/cascade-plans.port")/" -H 'X-Org: org1' -H 'X-Team: team1' -H 'X-User: user1' -H 'X-Agent: agent1') || {
		echo "== cascade-plans: no answer to user1's request; its log:" >&2
		cat "$work/cascade-plans.log" >&2
		exit 2
	}
	grep -qi '^ratelimit-policy:.*q=2000000000' <<<"$pro" || {
		echo "== cascade-plans: user1 is not on its pro plan; its log:" >&2
		cat "$work/cascade-plans.log" >&2
		exit 2
	}
	rounds plain cascade-memory cascade-plans
	echo "== throughput against plain Caddy, and with plans against without (each in the same round)"
	ratios cascade-memory:plain cascade-plans:plain cascade-plans:cascade-memory
	cpu_medians plain cascade-memory cascade-plans
	exit 0
fi
start plain ""
start cascade-memory "rate_limit {$limits
	}"
start cascade-redis "rate_limit {$limits
		store redis {
			address 127.0.0.1:$redis_port
			key_prefix strict:
		}
	}"
start cascade-lease "rate_limit {$limits
		store redis {
			address 127.0.0.1:$redis_port
			key_prefix lease:
			$LEASE
		}
	}"
rounds plain cascade-memory cascade-redis cascade-lease

echo "== throughput against plain Caddy (each in the same round)"
ratios cascade-memory:plain cascade-redis:plain cascade-lease:plain
# Redis's own accounting of the measured runs: its script calls (several
# decisions each under load: the store batches what queues up), the server
# time they took, and the Redis process's CPU (the commands, and the
# network and event loop around them), per request.
echo "== Redis during the cascade-redis (strict) and cascade-lease runs (medians over the rounds)"
python3 - "$work" "$ROUNDS" <<'PY'
import os, re, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
tick = 1e6 / os.sysconf("SC_CLK_TCK")
for kind in ("redis", "lease"):
    rows = []
    for r in range(1, rounds + 1):
        name = "%s/cascade-%s-%d" % (work, kind, r)
        stats = open(name + ".redis").read()
        requests = int(open(name + ".requests").read() or 0)
        ticks = int(open(name + ".redis-ticks").read())
        calls = usec = 0
        for cmd in ("evalsha", "eval"):
            m = re.search(r"cmdstat_%s:calls=(\d+),usec=(\d+)" % cmd, stats)
            if m:
                calls += int(m.group(1)); usec += int(m.group(2))
        if requests:
            rows.append((calls / requests, usec / requests, ticks * tick / requests))
    if rows:
        med = [statistics.median(r[i] for r in rows) for i in range(3)]
        print("%-6s %.3f script calls per request, %.2f µs of script time per request, %.1f µs of Redis CPU per request" % (kind, *med))
PY
cpu_medians plain cascade-memory cascade-redis cascade-lease
