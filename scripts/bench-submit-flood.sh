#!/usr/bin/env bash
# Coordinator memory under a flood of large submissions at the admission limit: `herder dev`
# with one worker of one slot and --max-active-jobs 10, so admission is full nearly all the
# time, and a bench pushing JOBS submissions of a TEXT_KIB KiB sha256 text over 4 connections
# with PIPELINE in flight each. Most submissions are refused; the point is what the process
# holds meanwhile. Prints the bench's JSON line, then the process's peak resident memory
# (VmHWM) and the size of its data directory.
#   JOBS=4000 TEXT_KIB=100 PIPELINE=32 ./scripts/bench-submit-flood.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

JOBS="${JOBS:-4000}"
TEXT_KIB="${TEXT_KIB:-100}"
PIPELINE="${PIPELINE:-32}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27170}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27171}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-flood.XXXXXX")
trap 'cleanup_started; rm -rf "$work"' EXIT

start_bg "$work/dev.log" dev --workers 1 --capacity 1 --data-dir "$work/data" \
    --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" --max-active-jobs 10
coordinator_pid=$LAST_PID
wait_for 15 "the coordinator" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
text=$(head -c $((TEXT_KIB * 1024)) /dev/zero | tr '\0' 'x')
"$HERDER_BIN" bench --jobs "$JOBS" --concurrency 4 --pipeline "$PIPELINE" --task sha256 \
    --text "$text" --coordinator "$CLIENT_ADDR" --json || true
grep -E "VmHWM|VmRSS" "/proc/$coordinator_pid/status"
du -sh "$work/data"
