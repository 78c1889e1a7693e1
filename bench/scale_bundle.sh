#!/usr/bin/env bash
# Makes a folder that bench/scale.sh can run from on a bare x86-64 machine
# (nothing installed, no network): the release flick binary and the peers
# with every shared library they load.
#
#   bench/scale_bundle.sh DIR [BUNDLER]
#   # then, on the other machine, in a copy of this repository:
#   BUNDLE=DIR bench/scale.sh ...
#   SKIP_BUILD=1 CARGO_TARGET_DIR=DIR/t bench/isolation.sh
#   DIR/run packet-rate --workers "1 2 4"
#   PATH=DIR/path:$PATH FLICK=DIR/t/release/flick \
#       BLAST=DIR/t/release/packet-veth bench/packets_veth.sh
#
# BUNDLER is a script that copies programs with their libraries and writes
# DIR/run (default: ../shared/tools/bundle.sh beside the repository). Keep
# DIR out of git (it is tens of megabytes).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bench/scale_bundle.sh DIR [BUNDLER]}
bundler=${2:-../shared/tools/bundle.sh}
[ -x "$bundler" ] || { echo "scale_bundle.sh: no bundler at $bundler" >&2; exit 2; }
cargo build --release --quiet -p flick -p isolation -p packet-rate -p packet-veth
target=${CARGO_TARGET_DIR:-target}
ours=(flick isolation packet-rate packet-veth)
progs=(nginx haproxy wrk memcached nutcracker)
for p in "${ours[@]}"; do progs+=("$target/release/$p"); done
if command -v memcaslap >/dev/null; then progs+=(memcaslap); else progs+=(memaslap); fi
# For bench/packets_veth.sh, where they exist here: run from DIR/path.
tools=()
for t in ip nft sysctl; do command -v "$t" >/dev/null && tools+=("$t"); done
"$bundler" "$dir" "${progs[@]}" "${tools[@]}"
# Wrappers that run the bundled programs: DIR/t/release/NAME for ours
# (bench/isolation.sh runs $CARGO_TARGET_DIR/release/isolation;
# packets_veth.sh takes FLICK= and BLAST=), DIR/path/NAME for the tools.
mkdir -p "$dir/t/release" "$dir/path"
for p in "${ours[@]}"; do
    printf '#!/usr/bin/env bash\nexec "$(cd "$(dirname "$0")/../.." && pwd)/run" %s "$@"\n' "$p" >"$dir/t/release/$p"
    chmod +x "$dir/t/release/$p"
done
for t in "${tools[@]}"; do
    printf '#!/usr/bin/env bash\nexec "$(cd "$(dirname "$0")/.." && pwd)/run" %s "$@"\n' "$t" >"$dir/path/$t"
    chmod +x "$dir/path/$t"
done
