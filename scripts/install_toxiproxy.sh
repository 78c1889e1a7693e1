#!/usr/bin/env bash
# Installs Shopify's toxiproxy server (the fault injector behind
# crates/flick/tests/fault_invariants.rs) as `toxiproxy-server`, built from
# source with `go install` at a pinned version. Idempotent: does nothing
# when that version is already installed. Installs into $TOXIPROXY_DIR if
# set, else ~/.local/bin, and prints the binary's path as its last line.
#
#   scripts/install_toxiproxy.sh            # ~/.local/bin/toxiproxy-server
#   TOXIPROXY_DIR=target/tools scripts/install_toxiproxy.sh
#
# The tests find it through $TOXIPROXY_SERVER, else `toxiproxy-server` on
# PATH, else ~/.local/bin, else target/tools.
set -euo pipefail

VERSION="v2.9.0"
MODULE="github.com/Shopify/toxiproxy/v2/cmd/server"
DIR="${TOXIPROXY_DIR:-$HOME/.local/bin}"
BIN="$DIR/toxiproxy-server"

# Go where the official tarball or Debian's golang-go puts it, if not on PATH.
if ! command -v go >/dev/null; then
    for g in /usr/local/go/bin/go /usr/lib/go/bin/go; do
        if [ -x "$g" ]; then
            PATH="$(dirname "$g"):$PATH"
            break
        fi
    done
fi

if [ -x "$BIN" ]; then
    # A binary built by `go install` names its module's version; without
    # Go at hand, an installed binary is taken as it is.
    if ! command -v go >/dev/null ||
        go version -m "$BIN" 2>/dev/null |
        grep -Eq "toxiproxy/v2[[:space:]]+${VERSION}[[:space:]]"; then
        echo "== toxiproxy-server ${VERSION} already installed" >&2
        echo "$BIN"
        exit 0
    fi
fi

if ! command -v go >/dev/null; then
    echo "install_toxiproxy.sh: needs Go (https://go.dev/dl/ or apt-get install golang-go)" >&2
    exit 1
fi

echo "== installing toxiproxy-server ${VERSION} into ${DIR}" >&2
mkdir -p "$DIR"
# Build into a scratch GOBIN: the package's binary is called `server`, and
# nothing else of that name should be overwritten.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
GOBIN="$scratch" go install "${MODULE}@${VERSION}"
install -m 0755 "$scratch/server" "$BIN"
echo "$BIN"
