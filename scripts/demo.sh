#!/usr/bin/env bash
# Builds flick and runs the main job: checks the paper's example programs,
# prints their static bounds and their canonical formatting.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --quiet
flick=target/release/flick

for program in examples/*.flick; do
    echo "== $program"
    "$flick" check --bounds "$program"
    echo "-- canonical formatting:"
    "$flick" fmt "$program"
    echo
done

echo "== a program with mistakes, and what flick says about it:"
"$flick" check examples/errors/recursion_and_directions.flick || echo "(flick check exited with status $?)"
