#!/usr/bin/env bash
# Builds the release binary: target/release/herder.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p herder
echo "built: $(pwd)/target/release/herder"
