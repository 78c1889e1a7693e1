#!/usr/bin/env bash
# One round of the per-core benchmarks on a borrowed 16-core machine, sized
# to fit a short loan (about 7 minutes of 16 cores): what the open
# performance goals are judged by, each point run once.
#
#   bench/scale_bundle.sh DIR                 # here: the binaries and peers
#   BUNDLE=DIR OUT=RESULTS bench/device_round.sh   # there, from a copy of the repository
#
# Runs, in this order (the most wanted first, so a round cut short still
# says something):
#   1. packet-rate machines: FlowBlaze's port knocking, load balancer and
#      connection tracker against the hand-written code (1M frames, 3 reps);
#   2. bench/scale.sh memcached_binary and static at 1, 2 and 4 workers;
#   3. bench/scale.sh http at 400 connections, measured after a 2 s warm-up
#      (--warmup) and from a cold start, at 1, 2 and 4 workers;
#   4. packet-rate: the flow tracker and the port-knocking firewall from
#      memory at 1, 2 and 4 workers.
# Each part writes under RESULTS (default bench/results/device_round) and
# its log beside it; a part that fails is noted and the next one runs.
#
# Environment: BUNDLE (a folder made by bench/scale_bundle.sh; without one,
# everything is built and taken from here), OUT, SECONDS_PER_RUN (4),
# WORKERS ("1 2 4"), and SCALE_ARGS, more flags for bench/scale.sh. To try
# the script on a small machine (its figures then say nothing per core):
#   WORKERS=1 SECONDS_PER_RUN=1 SCALE_ARGS="--allow-overlap --proxy-cores 0
#   --backend-cores 1 --load-cores 1" bench/device_round.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results/device_round}
secs=${SECONDS_PER_RUN:-4}
workers=${WORKERS:-1 2 4}
bundle=${BUNDLE:-}
mkdir -p "$out"
read -r -a extra <<<"${SCALE_ARGS:-}"

if [ -n "$bundle" ]; then
    packet_rate=("$bundle/run" packet-rate)
else
    cargo build --release --quiet -p flick -p packet-rate || exit 2
    packet_rate=("${CARGO_TARGET_DIR:-target}/release/packet-rate")
fi

failed=()
part() {
    local name=$1
    shift
    echo "== $name: $*" | tee -a "$out/round.log"
    local t0=$SECONDS
    if "$@" >"$out/$name.log" 2>&1; then
        echo "   done in $((SECONDS - t0)) s" | tee -a "$out/round.log"
    else
        echo "   FAILED after $((SECONDS - t0)) s (see $name.log)" | tee -a "$out/round.log"
        failed+=("$name")
    fi
}

nproc | sed 's/^/cores: /' >"$out/round.log"
part machines "${packet_rate[@]}" machines --frames 1000000 --reps 3 \
    --cases "port_knocking server_load_balancer tcp_conntrack"
part scale_memcached_binary_static bench/scale.sh "${extra[@]}" \
    --benches "memcached_binary static" --workers "$workers" --seconds "$secs" \
    --reps 1 --out "$out/scale_memcached_binary_static"
part scale_http_warm bench/scale.sh "${extra[@]}" --benches http \
    --workers "$workers" --conns 400 --seconds "$secs" --warmup 2 --reps 1 \
    --out "$out/scale_http_warm"
part scale_http_cold bench/scale.sh "${extra[@]}" --benches http \
    --workers "$workers" --conns 400 --seconds "$secs" --reps 1 \
    --out "$out/scale_http_cold"
part packet_rate "${packet_rate[@]}" --workers "$workers" --frames 1000000 --reps 1

if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}" | tee -a "$out/round.log"
    exit 1
fi
echo "all parts done: $out" | tee -a "$out/round.log"
