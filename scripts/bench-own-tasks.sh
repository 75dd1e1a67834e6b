#!/usr/bin/env bash
# What users' own work costs against the built-in path, with separate processes throughout:
# one `herder coordinator`, 3 workers x 4 slots, and a `herder bench` process submitting.
#   builtin   `herder worker` running the built-in sha256 of a short text
#   handler   the same digest as a user's async handler (runtime/examples/sha256_worker.rs),
#             submitted as a user task `user-sha256`
#   exec      `herder worker --allow-exec /bin/true` running an exec task of /bin/true
# Each configuration runs on fresh data RUNS times, at PIPELINE submissions in flight per
# connection (throughput), and once more with one job at a time on one connection (latency:
# what each job costs end to end). Prints one JSON line per run, then a table of medians
# (with the errors of each configuration's runs, which should be none).
#   RUNS=3 JOBS=5000 ./scripts/bench-own-tasks.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

RUNS="${RUNS:-3}"
JOBS="${JOBS:-5000}"
LATENCY_JOBS="${LATENCY_JOBS:-500}"
PIPELINE="${PIPELINE:-8}"
CONCURRENCY="${CONCURRENCY:-4}"
CONFIGS="${CONFIGS:-builtin handler exec}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27470}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27471}"
EXAMPLE="$HERDER_ROOT/target/release/examples/sha256_worker"
(cd "$HERDER_ROOT" && cargo build --release -p herder-runtime --example sha256_worker --quiet)
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-own.XXXXXX")
trap 'cleanup_started; rm -rf "$work"' EXIT
results="$work/results.jsonl"

start_config() {
    rm -rf "$work/data"
    # The bench parks one WAIT per job; with a slow task most of JOBS wait at once.
    start_bg "$work/coordinator.log" coordinator --data-dir "$work/data" \
        --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" \
        --max-waits-per-connection 16384 --max-requests-per-connection 32768
    for w in 1 2 3; do
        case $1 in
        builtin) start_bg "$work/worker-$w.log" worker --id "worker-$w" --capacity 4 --coordinator "$WORKER_ADDR" ;;
        exec) start_bg "$work/worker-$w.log" worker --id "worker-$w" --capacity 4 --coordinator "$WORKER_ADDR" --allow-exec /bin/true ;;
        handler)
            "$EXAMPLE" "$WORKER_ADDR" "worker-$w" 4 >"$work/worker-$w.log" 2>&1 &
            STARTED_PIDS+=("$!")
            ;;
        esac
    done
    wait_for 30 "$1: every worker registered" workers_alive 3
}

task_of() {
    case $1 in
    builtin) echo '{"kind":"sha256","text":"herder"}' ;;
    handler) echo '{"kind":"user-sha256","payload":{"text":"herder"}}' ;;
    exec) echo '{"kind":"exec","argv":["/bin/true"]}' ;;
    esac
}

bench() { # CONFIG RUN MODE JOBS CONCURRENCY PIPELINE
    "$HERDER_BIN" bench --jobs "$4" --concurrency "$5" --pipeline "$6" \
        --task-json "$(task_of "$1")" --coordinator "$CLIENT_ADDR" --json |
        python3 -c "import json,sys; v=json.load(sys.stdin); print(json.dumps({'config': '$1', 'run': $2, 'mode': '$3', **v}))" |
        tee -a "$results"
}

for run in $(seq "$RUNS"); do
    for config in $CONFIGS; do
        STARTED_PIDS=()
        start_config "$config"
        bench "$config" "$run" throughput "$JOBS" "$CONCURRENCY" "$PIPELINE"
        bench "$config" "$run" latency "$LATENCY_JOBS" 1 1
        cleanup_started
    done
done

python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(config, mode, pick):
    values = [pick(r) for r in rows if r["config"] == config and r["mode"] == mode]
    return statistics.median(values), values
print(f"{'config':<8} {'throughput runs (jobs/s)':<28} {'median':>7}  {'one at a time: p50 ms (runs)':<30} {'median':>6}  errors")
for config in dict.fromkeys(r["config"] for r in rows):
    t, tv = med(config, "throughput", lambda r: r["throughput_jobs_per_second"])
    l, lv = med(config, "latency", lambda r: r["end_to_end_millis"]["p50"])
    errors = sum(r["errors"] for r in rows if r["config"] == config)
    print(f"{config:<8} {' '.join(f'{v:.0f}' for v in tv):<28} {t:>7.0f}  {' '.join(f'{v:.2f}' for v in lv):<30} {l:>6.2f}  {errors}")
PY
