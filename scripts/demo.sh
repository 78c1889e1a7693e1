#!/usr/bin/env bash
# Builds flick and runs the main job: the FLICK paper's Memcached proxy,
# `flick run examples/memcached_proxy.flick`, in front of four memcached
# servers this script starts on loopback. It stays up until Ctrl-C (or for
# DEMO_SECONDS seconds), and says how to talk to it.
set -euo pipefail
cd "$(dirname "$0")/.."

PROXY_PORT=${PROXY_PORT:-11311}
BACKEND_PORTS=(21211 21212 21213 21214)

need=()
command -v memcached >/dev/null || need+=(memcached)
command -v memccat >/dev/null || need+=(libmemcached-tools)
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "== installing ${need[*]}"
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo build --release --quiet
flick=target/release/flick

echo "== the program, checked, with its static bounds and its task graph"
"$flick" check --bounds examples/memcached_proxy.flick
"$flick" graph examples/memcached_proxy.flick

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

user=()
[ "$(id -u)" -eq 0 ] && user=(-u root)
backends=()
for port in "${BACKEND_PORTS[@]}"; do
    memcached -l 127.0.0.1 -p "$port" -U 0 -m 64 "${user[@]}" &
    pids+=($!)
    backends+=("127.0.0.1:$port")
done
sleep 0.3

"$flick" run examples/memcached_proxy.flick \
    --listen "client=127.0.0.1:$PROXY_PORT" \
    --connect "backends=$(IFS=,; echo "${backends[*]}")" &
pids+=($!)
sleep 0.5

servers="--servers=127.0.0.1:$PROXY_PORT --binary"
echo
echo "== through the proxy: store README.md under its name, read it back"
memccp $servers README.md
memccat $servers README.md | sed -n 1,3p
echo
echo "The proxy listens on 127.0.0.1:$PROXY_PORT (Memcached binary protocol) in"
echo "front of ${backends[*]}. Try:"
echo "  memccp  $servers FILE        # store a file"
echo "  memccat $servers FILE        # read it back"
echo "  memccapable -h 127.0.0.1 -p $PROXY_PORT -b   # libmemcached's protocol tests"
echo "Ctrl-C (or kill $$) stops the proxy and the memcached servers it started."
if [ -n "${DEMO_SECONDS:-}" ]; then
    sleep "$DEMO_SECONDS"
else
    wait
fi
