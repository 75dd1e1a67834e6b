#!/usr/bin/env bash
# What a coordinator pays for delayed jobs, measured on the real process (one coordinator,
# every transition durable in SQLite):
#   1. JOBS jobs scheduled an hour ahead, submitted from a JSON-lines file in batches of 1,000:
#      how long that took, the coordinator's resident memory (VmRSS and peak VmHWM) and the
#      size of its data directory;
#   2. a restart on that data directory: how long until it answers again, and its memory then;
#   3. with those JOBS still waiting, ON_TIME jobs due DUE_IN_S seconds from now, run by one
#      worker of CAPACITY slots: how late each one started after its time (first start minus
#      run_at, both by the leader's clock), p50, p99 and max.
#   JOBS=1000000 ON_TIME=1000 ./scripts/bench-delayed.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

JOBS="${JOBS:-1000000}"
ON_TIME="${ON_TIME:-1000}"
DUE_IN_S="${DUE_IN_S:-10}"
CAPACITY="${CAPACITY:-64}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27370}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27371}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-delayed.XXXXXX")
trap 'cleanup_started; rm -rf "$work"' EXIT

memory() {
    awk '/^VmRSS/ {rss=$2} /^VmHWM/ {hwm=$2} END {printf "rss_mib=%.0f peak_mib=%.0f", rss/1024, hwm/1024}' "/proc/$1/status"
}

start_coordinator() {
    start_bg "$work/coordinator-$1.log" coordinator --data-dir "$work/data" \
        --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" --http-port off \
        --max-active-jobs $((JOBS + ON_TIME + 1000)) --retain-terminal forever
    COORDINATOR_PID=$LAST_PID
}

start_coordinator first
wait_for 15 "the coordinator" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
python3 - "$JOBS" >"$work/later.jsonl" <<'PY'
import json, sys
for i in range(int(sys.argv[1])):
    print(json.dumps({"task": {"kind": "sha256", "text": f"later {i}"}, "delay_millis": 3600000}))
PY
started=$(date +%s.%N)
"$HERDER_BIN" submit --batch-file "$work/later.jsonl" --coordinator "$CLIENT_ADDR" >/dev/null
took=$(python3 -c "import time; print(f'{time.time() - $started:.1f}')")
echo "scheduled $JOBS jobs an hour ahead in ${took}s; $(memory "$COORDINATOR_PID") data_dir=$(du -sm "$work/data" | cut -f1)MiB"

kill -TERM "$COORDINATOR_PID"
wait "$COORDINATOR_PID" 2>/dev/null || true
started=$(date +%s.%N)
start_coordinator second
wait_for 600 "the restarted coordinator" "$HERDER_BIN" list --limit 1 --coordinator "$CLIENT_ADDR"
took=$(python3 -c "import time; print(f'{time.time() - $started:.1f}')")
echo "restarted with $JOBS scheduled jobs, answering after ${took}s; $(memory "$COORDINATOR_PID")"

start_bg "$work/worker.log" worker --id on-time --capacity "$CAPACITY" --coordinator "$WORKER_ADDR"
wait_for 15 "the worker" worker_registered on-time
python3 - "$HERDER_BIN" "$CLIENT_ADDR" "$ON_TIME" "$DUE_IN_S" <<'PY'
import json, subprocess, sys, time
herder, addr, count, due_in = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
run_at = int((time.time() + due_in) * 1000)
lines = "".join(json.dumps({"task": {"kind": "sha256", "text": f"on time {i}"}, "run_at_unix_ms": run_at}) + "\n"
                for i in range(count))
out = subprocess.run([herder, "submit", "--batch-file", "-", "--coordinator", addr, "--json"],
                     input=lines, capture_output=True, text=True, check=True)
ids = [json.loads(line)["job_id"] for line in out.stdout.splitlines() if line.strip()]
time.sleep(due_in + 2)
late = []
for job_id in ids:
    for _ in range(100):
        view = json.loads(subprocess.run([herder, "status", job_id, "--coordinator", addr, "--json"],
                                         capture_output=True, text=True, check=True).stdout)
        job = view.get("job", view)
        started = job.get("first_started_at_unix_ms")
        if started is not None:
            late.append(started - job["run_at_unix_ms"])
            break
        time.sleep(0.1)
late.sort()
def pct(p):
    return late[min(len(late) - 1, int(p * len(late)))] if late else None
early = sum(1 for ms in late if ms < 0)
print(json.dumps({"due_jobs": count, "started": len(late), "started_early": early,
                  "late_ms": {"p50": pct(0.50), "p99": pct(0.99), "max": late[-1] if late else None}}))
PY
echo "after the due jobs ran: $(memory "$COORDINATOR_PID")"
