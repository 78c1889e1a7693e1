#!/usr/bin/env bash
# The port-knocking firewall between two veth pairs, in network
# namespaces of its own (the firewall in one, the load generator's two
# ends in another): Flick (examples/packets/port_knocking.flick over
# AF_PACKET or AF_XDP ports, N workers) against nftables doing the same
# firewall as kernel rules on a bridge. bench/packet_veth sends the
# traffic into one pair and counts what the firewall passes out of the
# other.
#
#   bench/packets_veth.sh [--workers "1 2"] [--ports "afpacket afxdp"]
#                         [--frames N] [--reps R] [--out DIR]
#
# Needs root, iproute2 and nft (Debian package nftables); FLICK=PATH and
# BLAST=PATH run prebuilt flick and packet-veth binaries instead of
# building them. Writes
# OUT/packets_veth.md and OUT/packets_veth.jsonl (bench/results by
# default). Not a test; the namespace is deleted on exit.
#
# The nftables firewall: a bridge joining the two inner ends, and in the
# bridge family's forward hook sets of sources per knock stage (each knock
# on the right port moves the source on), a set of sources that knocked,
# and a set of their SSH flows, which pass; everything else is dropped. It
# differs from the Flick program in one way: a wrong knock does not send
# the source back to the start (nftables has no "remove from set" on a
# miss without more rules); the load here knocks right, so both pass and
# drop the same frames.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS="1 2"
PORTS="afpacket afxdp"
FRAMES=2000000
REPS=3
OUT=bench/results
while [ $# -gt 0 ]; do
    case "$1" in
        --workers) WORKERS=$2; shift 2 ;;
        --ports) PORTS=$2; shift 2 ;;
        --frames) FRAMES=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "packets_veth.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "packets_veth.sh: needs root (network namespaces)" >&2; exit 2; }
command -v nft >/dev/null || { echo "packets_veth.sh: needs nft (apt-get install nftables)" >&2; exit 2; }
# FLICK and BLAST name prebuilt binaries (a bare machine: bench/scale_bundle.sh).
if [ -z "${FLICK:-}" ] || [ -z "${BLAST:-}" ]; then
    cargo build --release --quiet -p flick -p packet-veth
fi
FLICK=${FLICK:-${CARGO_TARGET_DIR:-target}/release/flick}
BLAST=${BLAST:-${CARGO_TARGET_DIR:-target}/release/packet-veth}
NS=flkfw$$   # the firewall's namespace
EDGE=flkedge$$ # the load generator's
mkdir -p "$OUT"
RUNS="$OUT/packets_veth.jsonl"
: >"$RUNS"
flick_pid=""
cleanup() {
    [ -n "$flick_pid" ] && kill "$flick_pid" 2>/dev/null || true
    ip netns del "$NS" 2>/dev/null || true
    ip netns del "$EDGE" 2>/dev/null || true
}
trap cleanup EXIT

in_ns() { ip netns exec "$NS" "$@"; }

# s0 -> s1 (the firewall's inside), r0 (its outside) -> r1; s0 and r1
# in the load generator's namespace.
setup() {
    ip netns add "$NS"
    ip netns add "$EDGE"
    in_ns ip link add s0 type veth peer name s1
    in_ns ip link add r0 type veth peer name r1
    in_ns ip link set s0 netns "$EDGE"
    in_ns ip link set r1 netns "$EDGE"
    for d in s1 r0; do
        in_ns sysctl -q -w "net.ipv6.conf.$d.disable_ipv6=1"
        in_ns ip link set "$d" up
    done
    for d in s0 r1; do
        ip netns exec "$EDGE" sysctl -q -w "net.ipv6.conf.$d.disable_ipv6=1"
        ip -n "$EDGE" link set "$d" up
    done
}

teardown() {
    ip netns del "$NS"
    ip netns del "$EDGE"
}

blast() { ip netns exec "$EDGE" "$BLAST" --tx s0 --rx r1 --frames "$FRAMES"; }

nft_rules() {
    cat <<'NFT'
table bridge knock {
    set stage1 { type ipv4_addr; flags dynamic; size 65536; }
    set stage2 { type ipv4_addr; flags dynamic; size 65536; }
    set stage3 { type ipv4_addr; flags dynamic; size 65536; }
    set knocked { type ipv4_addr; flags dynamic; size 65536; }
    set flows { type ipv4_addr . ipv4_addr . inet_service . inet_service; flags dynamic; size 65536; }
    chain forward {
        type filter hook forward priority 0; policy drop;
        ip saddr . ip daddr . tcp sport . tcp dport @flows accept
        ip saddr @knocked tcp dport 22 add @flows { ip saddr . ip daddr . tcp sport . tcp dport } accept
        ip saddr @stage3 tcp dport 8456 add @knocked { ip saddr } drop
        ip saddr @stage2 tcp dport 7345 add @stage3 { ip saddr } drop
        ip saddr @stage1 tcp dport 6234 add @stage2 { ip saddr } drop
        tcp dport 5123 add @stage1 { ip saddr } drop
    }
}
NFT
}

record() { # system workers rep json port
    python3 -c 'import json,sys; r=json.loads(sys.argv[4]); r.update(system=sys.argv[1], workers=int(sys.argv[2]), rep=int(sys.argv[3]), port=sys.argv[5]); print(json.dumps(r))' "$@" >>"$RUNS"
    tail -n1 "$RUNS"
}

# Ready once its ports are open: two packet sockets bound (AF_PACKET), or
# an XDP program on both inner ends (AF_XDP, attached last).
ready() { # kind pid
    if [ "$1" = afxdp ]; then
        in_ns ip -details link show s1 | grep -q prog/xdp &&
            in_ns ip -details link show r0 | grep -q prog/xdp
    else
        [ "$(($(wc -l <"/proc/$2/net/packet" 2>/dev/null || echo 1) - 1))" -ge 2 ]
    fi
}

for rep in $(seq "$REPS"); do
    for kind in $PORTS; do
        for w in $WORKERS; do
            setup
            # Not through in_ns: $! must be flick itself (ip netns exec execs it).
            ip netns exec "$NS" "$FLICK" run examples/packets/port_knocking.flick --workers "$w" \
                --port "inside=$kind:s1" --port "outside=$kind:r0" 2>/dev/null &
            flick_pid=$!
            for _ in $(seq 100); do
                ready "$kind" "$flick_pid" && break
                sleep 0.05
            done
            record flick "$w" "$rep" "$(blast)" "$kind"
            kill -INT "$flick_pid"; wait "$flick_pid" || true; flick_pid=""
            teardown
        done
    done
    setup
    in_ns ip link add br0 type bridge
    in_ns ip link set s1 master br0
    in_ns ip link set r0 master br0
    in_ns sysctl -q -w net.ipv6.conf.br0.disable_ipv6=1
    in_ns ip link set br0 up
    nft_rules | in_ns nft -f -
    record nftables 0 "$rep" "$(blast)" kernel
    teardown
done

python3 - "$RUNS" "$OUT/packets_veth.md" "$FRAMES" <<'PY'
import json, statistics, sys, platform, os
runs = [json.loads(l) for l in open(sys.argv[1])]
keys = sorted({(r["system"], r.get("port", "afpacket"), r["workers"]) for r in runs},
              key=lambda k: (k[0] != "flick", k[1], k[2]))
lines = ["# Port-knocking firewall over veth pairs (bench/packets_veth.sh)", "",
         f"{os.cpu_count()} cores, Linux {platform.release()}; {sys.argv[3]} frames of 64 bytes per run "
         "(7 in 8 pass), median of the runs; frames/s is frames passed out of the firewall per second, "
         "from the first frame sent to the last received.", "",
         "| system | ports | workers | frames/s passed | passed of those that should | runs |", "|---|---|---|---|---|---|"]
best = {}
for k in keys:
    rs = [r for r in runs if (r["system"], r.get("port", "afpacket"), r["workers"]) == k]
    rate = statistics.median(r["received_per_s"] for r in rs)
    share = statistics.median(r["received"] / r["passing"] for r in rs)
    best[k] = rate
    name = "Flick" if k[0] == "flick" else "nftables (bridge, kernel)"
    lines.append(f"| {name} | {k[1]} | {k[2] or '-'} | {rate:,.0f} | {share:.1%} | {len(rs)} |")
nft = [v for (s, _, _), v in best.items() if s == "nftables"]
if nft:
    lines.append("")
    for (s, p, w), v in best.items():
        if s == "flick":
            lines.append(f"Flick over {p} with {w} worker(s): {v / nft[0]:.2f}x nftables.")
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
