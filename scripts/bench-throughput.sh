#!/usr/bin/env bash
# Throughput and latency of tiny jobs on the embedded default: one coordinator and 3 workers x 4
# slots in one process (`herder dev`), a separate `herder bench` process submitting sha256 jobs.
# Each configuration runs on a fresh data directory, RUNS times; prints one JSON line per run.
#   JOBS="2000 20000" PIPELINES="1 8" RUNS=3 ./scripts/bench-throughput.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

JOBS="${JOBS:-2000 20000}"
PIPELINES="${PIPELINES:-1 8}"
RUNS="${RUNS:-3}"
CONCURRENCY="${CONCURRENCY:-4}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27070}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27071}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-bench.XXXXXX")
trap 'cleanup_started; rm -rf "$work"' EXIT

for jobs in $JOBS; do
    for pipeline in $PIPELINES; do
        for run in $(seq "$RUNS"); do
            rm -rf "$work/data"
            start_bg "$work/dev.log" dev --workers 3 --capacity 4 --data-dir "$work/data" \
                --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR"
            dev_pid=$LAST_PID
            wait_for 15 "the dev cluster" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
            "$HERDER_BIN" bench --jobs "$jobs" --concurrency "$CONCURRENCY" --pipeline "$pipeline" \
                --task sha256 --text herder --coordinator "$CLIENT_ADDR" --json
            kill "$dev_pid"
            wait "$dev_pid" 2>/dev/null || true
        done
    done
done
