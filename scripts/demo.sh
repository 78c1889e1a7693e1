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

echo "== message grammars: the stock ones load, and parse real messages"
"$flick" grammar check grammars/*.grammar
printf 'GET /index.html HTTP/1.1\r\nHost: example.com\r\n\r\nPOST /form HTTP/1.1\r\nHost: example.com\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n' \
    | "$flick" grammar parse http request
printf '\x80\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00Hello' \
    | "$flick" grammar parse memcached_binary cmd
echo

echo "== a program with mistakes, and what flick says about it:"
"$flick" check examples/errors/recursion_and_directions.flick || echo "(flick check exited with status $?)"
