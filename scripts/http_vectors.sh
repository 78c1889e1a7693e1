#!/usr/bin/env bash
# Runs the HTTP request vectors (crates/flick/tests/http_vectors.rs and its
# cases in crates/flick/tests/http_vectors/) through Flick's load balancer,
# nginx and HAProxy, and writes the results to docs/http_vectors.md. Needs
# nginx (nginx-light); without haproxy its column reads n/a.
set -euo pipefail
cd "$(dirname "$0")/.."
HTTP_VECTORS_TABLE=docs/http_vectors.md \
    cargo test --release -p flick --test http_vectors -- --nocapture "$@"
