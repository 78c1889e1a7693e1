#!/usr/bin/env bash
# Makes a folder that bench/scale.sh can run from on a bare x86-64 machine
# (nothing installed, no network): the release flick binary and the peers
# with every shared library they load.
#
#   bench/scale_bundle.sh DIR [BUNDLER]
#   # then, on the other machine, in a copy of this repository:
#   BUNDLE=DIR bench/scale.sh ...
#   SKIP_BUILD=1 CARGO_TARGET_DIR=DIR/t bench/isolation.sh
#
# BUNDLER is a script that copies programs with their libraries and writes
# DIR/run (default: ../shared/tools/bundle.sh beside the repository). Keep
# DIR out of git (it is tens of megabytes).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: bench/scale_bundle.sh DIR [BUNDLER]}
bundler=${2:-../shared/tools/bundle.sh}
[ -x "$bundler" ] || { echo "scale_bundle.sh: no bundler at $bundler" >&2; exit 2; }
cargo build --release --quiet -p flick -p isolation
target=${CARGO_TARGET_DIR:-target}
progs=("$target/release/flick" "$target/release/isolation" nginx haproxy wrk memcached nutcracker)
if command -v memcaslap >/dev/null; then progs+=(memcaslap); else progs+=(memaslap); fi
"$bundler" "$dir" "${progs[@]}"
# bench/isolation.sh runs $CARGO_TARGET_DIR/release/isolation: a wrapper
# there runs the bundled one.
mkdir -p "$dir/t/release"
printf '#!/usr/bin/env bash\nexec "$(cd "$(dirname "$0")/../.." && pwd)/run" isolation "$@"\n' >"$dir/t/release/isolation"
chmod +x "$dir/t/release/isolation"
