#!/usr/bin/env bash
# Deploy latency and footprint of `flick serve`: how long a deploy takes
# with 0, 100 and 1000 services already running, and the resident memory
# an idle deployed service costs.
#
# Usage:
#   bench/deploy.sh                    # levels 0 100 1000, 50 timed deploys each
#   LEVELS="0 100" bench/deploy.sh     # stop at 100
#   SAMPLES=20 WORKERS=2 bench/deploy.sh
#
# One `flick serve` (WORKERS workers, a state directory of its own) gets
# examples/static_web.flick deployed again and again through `flick ctl`,
# each copy a service of its own listening on its own loopback port (from
# BASE_PORT up). At each level L, SAMPLES deploys are timed with L services
# already deployed; the services deployed in between to reach the next
# level are not timed. Latency is what the API reports (`deploy_us`: from
# the request read to the service accepting: load, check, instantiate)
# and what the client saw (the whole `flick ctl deploy`, a process start
# and a Unix-socket round trip included). Memory is the server's VmRSS
# with no service, and again at each level once the services sit idle for
# SETTLE seconds; reported per service: (VmRSS at L - VmRSS at 0) / L.
#
# Uses target/release/flick (FLICK=... to change; built if missing). Not a
# test; the server is stopped and its state directory removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
LEVELS=${LEVELS:-"0 100 1000"}
SAMPLES=${SAMPLES:-50}
WORKERS=${WORKERS:-2}
BASE_PORT=${BASE_PORT:-21000}
SETTLE=${SETTLE:-3}
FLICK=${FLICK:-target/release/flick}
DEPLOY_ARGS=${DEPLOY_ARGS:-}
[ -x "$FLICK" ] || cargo build --release -p flick
ulimit -n 65536 2>/dev/null || true

STATE=$(mktemp -d /tmp/flick-deploy-bench.XXXXXX)
SOCK="$STATE/flick.sock"
"$FLICK" serve --state-dir "$STATE" --workers "$WORKERS" --log-level warn >"$STATE/serve.out" 2>"$STATE/serve.err" &
SERVE=$!
cleanup() {
    kill "$SERVE" 2>/dev/null || true
    wait "$SERVE" 2>/dev/null || true
    rm -rf "$STATE"
}
trap cleanup EXIT
for _ in $(seq 100); do
    [ -S "$SOCK" ] && break
    sleep 0.1
done
[ -S "$SOCK" ] || { echo "flick serve did not start" >&2; cat "$STATE/serve.err" >&2; exit 1; }

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$SERVE/status"; }
# p50 and p99 of the numbers on standard input.
percentiles() {
    sort -n | awk '{v[NR] = $1} END {
        if (NR == 0) { print "- -"; exit }
        p50 = v[int((NR - 1) * 0.50) + 1]; p99 = v[int((NR - 1) * 0.99) + 1]
        print p50, p99 }'
}

deployed=0
# Deploys service number $deployed; prints the API's deploy_us and the
# client's wall time in microseconds.
deploy_one() {
    local port=$((BASE_PORT + deployed)) t0 t1 out
    t0=$(date +%s%N)
    out=$("$FLICK" ctl --api "$SOCK" --json deploy "web$deployed" examples/static_web.flick \
        --listen "client=127.0.0.1:$port" $DEPLOY_ARGS)
    t1=$(date +%s%N)
    deployed=$((deployed + 1))
    echo "$(echo "$out" | awk -F': ' '/"deploy_us"/ {gsub(/,/, "", $2); print $2}') $(((t1 - t0) / 1000))"
}

sleep "$SETTLE"
RSS0=$(rss_kb)
echo "flick serve, $WORKERS workers, examples/static_web.flick per service; VmRSS with no service: $RSS0 KB"
printf '%-10s %8s %14s %14s %14s %14s %16s\n' "deployed" "timed" "api p50 us" "api p99 us" "ctl p50 us" "ctl p99 us" "KB per service"
for level in $LEVELS; do
    while [ "$deployed" -lt "$level" ]; do
        deploy_one >/dev/null
    done
    per="-"
    if [ "$level" -gt 0 ]; then
        sleep "$SETTLE"
        per=$(awk -v a="$(rss_kb)" -v b="$RSS0" -v n="$level" 'BEGIN {printf "%.1f", (a - b) / n}')
    fi
    samples=$(for _ in $(seq "$SAMPLES"); do deploy_one; done)
    # The timed services go again, so the next level starts where it says.
    for i in $(seq "$level" $((level + SAMPLES - 1))); do
        "$FLICK" ctl --api "$SOCK" undeploy "web$i" >/dev/null
    done
    deployed=$level
    read -r api50 api99 <<<"$(echo "$samples" | awk '{print $1}' | percentiles)"
    read -r ctl50 ctl99 <<<"$(echo "$samples" | awk '{print $2}' | percentiles)"
    printf '%-10s %8s %14s %14s %14s %14s %16s\n' "$level" "$SAMPLES" "$api50" "$api99" "$ctl50" "$ctl99" "$per"
done
