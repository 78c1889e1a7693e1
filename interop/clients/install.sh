#!/usr/bin/env bash
# Installs the client libraries that crates/flick/tests/memcached_differential.rs
# runs through the Memcached proxies: pymemcache (text protocol) and
# python-binary-memcached (module bmemcached, binary protocol); and pygls,
# the LSP client that crates/flick/tests/lsp.rs drives `flick lsp` with
# (interop/lsp/client.py); for the user, with pip. Does nothing when all
# import already.
set -euo pipefail
packages=(pymemcache==4.0.0 python-binary-memcached==0.33.0 pygls==2.1.1)
if python3 -c 'import pymemcache, bmemcached, pygls' 2>/dev/null; then
    exit 0
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "== installing python3-pip"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >/dev/null
fi
echo "== installing ${packages[*]}"
# A Debian Python refuses user installs unless told (PEP 668).
python3 -m pip install --user --quiet "${packages[@]}" \
    || python3 -m pip install --user --quiet --break-system-packages "${packages[@]}"
python3 -c 'import pymemcache, bmemcached, pygls'
