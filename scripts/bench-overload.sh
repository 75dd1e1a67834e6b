#!/usr/bin/env bash
# The overload experiment: 240 x 500 ms sleep jobs from 8 connections onto 3 workers x 4
# slots (12 slots), once unbounded (the default limit of 10,000 active jobs is never reached) and
# once with --max-active-jobs 24. Prints one JSON line per configuration.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27070}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27071}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-bench.XXXXXX")
trap 'cleanup_started; rm -rf "$work"' EXIT

for limit in 10000 24; do
    rm -rf "$work/data"
    start_bg "$work/dev.log" dev --workers 3 --capacity 4 --data-dir "$work/data" \
        --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" --max-active-jobs "$limit"
    dev_pid=$LAST_PID
    wait_for 15 "the dev cluster" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
    echo "max_active_jobs=$limit"
    "$HERDER_BIN" bench --jobs 240 --concurrency 8 --task sleep --milliseconds 500 \
        --coordinator "$CLIENT_ADDR" --json
    kill "$dev_pid"
    wait "$dev_pid" 2>/dev/null || true
done
