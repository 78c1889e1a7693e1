#!/usr/bin/env bash
# Isolation between services on one platform (issue 22): a light HTTP
# service beside a busy neighbour whose every request folds over nested
# lists, with no groups (as before weights), weights 1:1 and 4:1 in favour
# of the light one. Reports the light service's p50/p99/p99.9 alone and
# beside the busy one, and the busy one's throughput.
#
# Usage:
#   bench/isolation.sh                     # about 2 minutes once built
#   ISOLATION_ARGS="--requests 20000 --repeat 5" bench/isolation.sh
#   SKIP_BUILD=1 bench/isolation.sh        # use the binary already built
#
# Drives the platform directly (bench/isolation, a workspace member): one
# process with the platform's workers pinned to the first cores and the
# clients on the last, at niceness NICE (-15 by default, when run as root)
# so that other jobs on the machine disturb every mode less. Only 127.0.0.1
# ports BASE_PORT..BASE_PORT+29 are
# listened on (default 23300); every run is bounded by its request counts.
# Writes bench/results/isolation.md. Not a test: never run from
# scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_PORT=${BASE_PORT:-23300}
RESULTS=${RESULTS:-bench/results}
TARGET=${CARGO_TARGET_DIR:-target}
ISOLATION_ARGS=${ISOLATION_ARGS:-}
NICE=${NICE:--15}

[ -n "${SKIP_BUILD:-}" ] || cargo build --release -p isolation
mkdir -p "$RESULTS"
# shellcheck disable=SC2086
timeout 900 nice -n "$NICE" "$TARGET/release/isolation" --port "$BASE_PORT" $ISOLATION_ARGS \
    --out "$RESULTS/isolation.table"
{
    echo "# Isolation between services (bench/isolation.sh)"
    echo
    echo "$(uname -sr), $(nproc) cores, niceness $NICE, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end, $(date -u +%Y-%m-%d)."
    echo
    cat "$RESULTS/isolation.table"
} >"$RESULTS/isolation.md"
rm -f "$RESULTS/isolation.table"
echo "wrote $RESULTS/isolation.md"
