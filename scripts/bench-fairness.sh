#!/usr/bin/env bash
# What a light tenant waits while a heavy tenant keeps a backlog queued: `herder dev` with
# WORKERS workers of CAPACITY slots, a heavy tenant's HEAVY jobs submitted at once, then a light
# tenant's LIGHT jobs at RATE per second (each job a SLEEP_MS ms sleep). Each light job's wait is
# its submit-to-start time from its job view (first start minus creation, both stamped by the
# leader). Three runs, each on a fresh data directory:
#   alone  the light tenant with nothing else queued (its unloaded wait);
#   fair   the heavy backlog under fairness key "heavy", the light jobs under "light";
#   fifo   the same jobs with no fairness keys: one first-in-first-out queue.
# A light job not started within WAIT_S seconds of the last submission is reported as waiting.
#   HEAVY=100000 LIGHT=100 RATE=10 ./scripts/bench-fairness.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

HEAVY="${HEAVY:-100000}"
LIGHT="${LIGHT:-100}"
RATE="${RATE:-10}"
SLEEP_MS="${SLEEP_MS:-20}"
WORKERS="${WORKERS:-2}"
CAPACITY="${CAPACITY:-2}"
WAIT_S="${WAIT_S:-60}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27270}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27271}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-fairness.XXXXXX")
trap 'cleanup_started; rm -rf "$work"' EXIT

run() {
    local mode=$1 heavy_key="" light_key=""
    case "$mode" in
        fair) heavy_key=heavy; light_key=light ;;
    esac
    rm -rf "$work/data"
    start_bg "$work/dev-$mode.log" dev --workers "$WORKERS" --capacity "$CAPACITY" \
        --data-dir "$work/data" --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" \
        --max-active-jobs $((HEAVY + LIGHT + 1000)) --retain-terminal forever
    local dev_pid=$LAST_PID
    wait_for 15 "the workers" workers_alive "$WORKERS"
    if [ "$mode" != alone ]; then
        python3 - "$HEAVY" "$SLEEP_MS" "$heavy_key" >"$work/heavy.jsonl" <<'PY'
import json, sys
count, ms, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
line = {"task": {"kind": "sleep", "milliseconds": ms}}
if key:
    line["fairness_key"] = key
text = json.dumps(line)
sys.stdout.write((text + "\n") * count)
PY
        "$HERDER_BIN" submit --batch-file "$work/heavy.jsonl" --coordinator "$CLIENT_ADDR" >/dev/null
    fi
    python3 - "$HERDER_BIN" "$CLIENT_ADDR" "$LIGHT" "$RATE" "$SLEEP_MS" "$light_key" "$WAIT_S" "$mode" <<'PY'
import json, subprocess, sys, time
herder, addr, count, rate, ms, key, wait_s, mode = sys.argv[1:9]
count, rate, ms, wait_s = int(count), float(rate), int(ms), float(wait_s)

def call(*args):
    out = subprocess.run([herder, *args, "--coordinator", addr, "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)

ids = []
start = time.monotonic()
for n in range(count):
    due = start + n / rate
    time.sleep(max(0.0, due - time.monotonic()))
    extra = ["--fairness-key", key] if key else []
    ids.append(call("submit", "sleep", "--milliseconds", str(ms), *extra)["job_id"])
deadline = time.monotonic() + wait_s
waits, waiting = [], 0
for job_id in ids:
    while True:
        view = call("status", job_id)
        job = view.get("job", view)
        started = job.get("first_started_at_unix_ms")
        if started is not None:
            waits.append(started - job["created_at_unix_ms"])
            break
        if time.monotonic() > deadline:
            waiting += 1
            break
        time.sleep(0.2)
waits.sort()
def pct(p):
    return waits[min(len(waits) - 1, int(p * len(waits)))] if waits else None
print(json.dumps({"mode": mode, "light_jobs": count, "started": len(waits), "still_waiting": waiting,
                  "wait_ms": {"p50": pct(0.50), "p99": pct(0.99), "max": waits[-1] if waits else None}}))
PY
    kill -TERM "$dev_pid" 2>/dev/null || true
    wait "$dev_pid" 2>/dev/null || true
}

for mode in alone fair fifo; do
    run "$mode"
done
