#!/usr/bin/env bash
# Installs what the tests need and runs all of them. `.ci/run` calls this,
# on a clean clone with CI=true and no input.
set -euo pipefail
cd "$(dirname "$0")/.."

# --- what the tests need -------------------------------------------------
if command -v rustup >/dev/null; then
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi
# Real peers: memcached servers, libmemcached's tools, nginx; Graphviz for `flick graph --svg`.
missing=()
command -v memcached >/dev/null || missing+=(memcached)
command -v memccapable >/dev/null || missing+=(libmemcached-tools)
command -v dot >/dev/null || missing+=(graphviz)
# nginx web servers behind the HTTP load balancer's tests; HAProxy beside
# it in the HTTP request vectors.
command -v nginx >/dev/null || missing+=(nginx-light)
command -v haproxy >/dev/null || missing+=(haproxy)
# Hadoop's IFile classes for the aggregator's interop test (interop/hadoop).
command -v javac >/dev/null || missing+=(default-jdk-headless)
command -v mvn >/dev/null || missing+=(maven)
# Network namespaces and veth pairs for the packet ports' live tests.
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "== installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Client libraries in other languages, run through the Memcached proxies.
interop/clients/install.sh
# The Prometheus project's parsers, which read `flick run --metrics` back
# (crates/flick/tests/run_cli.rs). A Debian Python refuses user installs
# unless told (PEP 668).
python3 -c 'import prometheus_client' 2>/dev/null \
    || python3 -m pip install --user --quiet prometheus_client \
    || python3 -m pip install --user --quiet --break-system-packages prometheus_client
# Toxiproxy, the fault injector of the fault-invariant suite (with Go).
scripts/install_toxiproxy.sh >/dev/null

# --- the tests -------------------------------------------------------------
echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "== cargo test"
cargo test --workspace --quiet

# The runtime's task state word, wake-ups and channels under every
# interleaving loom explores (up to 3 preemptions; crates/runtime/src/sync.rs
# swaps in its types). `--cfg loom` rebuilds every crate, so in a target
# directory of its own. About 40 s from a clean one on two cores; the
# timeout catches a change that blows up the models' state space.
echo "== loom: the scheduler's and channels' protocols"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    timeout 300 cargo test -p flick-runtime --release --quiet \
    --test loom_scheduler --test loom_channel

echo "== the examples check and are canonically formatted"
cargo build --release --quiet
for program in examples/*.flick examples/packets/*.flick; do
    target/release/flick check "$program"
done
target/release/flick fmt --check examples/ lib/
if target/release/flick check examples/errors/*.flick 2>/dev/null; then
    echo "examples/errors/ should be rejected" >&2
    exit 1
fi

echo "== deploy/: Dockerfile, systemd unit, sample configuration"
scripts/check_deploy.sh target/release/flick

echo "all tests passed"
