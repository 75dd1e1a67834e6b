#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for a bounded time (FUZZ_SECONDS each, 20 by default),
# starting from fuzz/seeds/<target>: hand-made seed inputs and every input that once found a
# bug, so each run replays them first. A crash stops the script with the input that caused it
# (under fuzz/artifacts/<target>/): fix the bug, then add that file to fuzz/seeds/<target>.
#   ./scripts/fuzz.sh                      # every target
#   FUZZ_SECONDS=300 ./scripts/fuzz.sh coordinator
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECONDS_EACH="${FUZZ_SECONDS:-20}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame_decoder number_lists task_specs coordinator handshake)
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "!! the nightly toolchain is missing (rustup toolchain install nightly); fuzzing needs it" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
cargo +nightly fuzz build
scratch=$(mktemp -d "${TMPDIR:-/tmp}/herder-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target"
    echo "==> fuzz $target for ${SECONDS_EACH} s"
    status=0
    cargo +nightly fuzz run "$target" "$scratch/$target" "seeds/$target" -- \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -print_final_stats=1 \
        >"$scratch/$target.log" 2>&1 || status=$?
    grep -E "^(Done |stat::number_of_executed_units|SUMMARY|thread '.*' panicked)|Test unit written|^==[0-9]+== ERROR" \
        "$scratch/$target.log" || true
    if [ "$status" != 0 ]; then
        tail -n 40 "$scratch/$target.log" >&2
        echo "!! fuzz target $target failed (exit $status); the input is under fuzz/artifacts/$target/" >&2
        exit 1
    fi
done
