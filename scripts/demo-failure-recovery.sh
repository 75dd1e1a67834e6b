#!/usr/bin/env bash
# The failure-recovery demonstration, against real processes (nothing simulated):
#   a long job starts on worker-1; worker-1 is SIGKILLed; the coordinator sees the connection
#   drop, revokes the attempt and schedules a retry; worker-2 runs it to COMPLETED on attempt 2.
# Ports and the job length can be changed: DEMO_WORKER_PORT, DEMO_CLIENT_PORT, DEMO_SLEEP_MS.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

WORKER_ADDR="127.0.0.1:${DEMO_WORKER_PORT:-17070}"
CLIENT_ADDR="127.0.0.1:${DEMO_CLIENT_PORT:-17071}"
SLEEP_MS="${DEMO_SLEEP_MS:-10000}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-demo.XXXXXX")
trap 'cleanup_started; echo "(logs kept in $work)"' EXIT

start_bg "$work/coordinator.log" coordinator --data-dir "$work/data" \
    --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" --retry-base-millis 1000
wait_for 15 "the coordinator to listen" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"

start_bg "$work/worker-1.log" worker --id worker-1 --capacity 1 --coordinator "$WORKER_ADDR"
WORKER1_PID=$LAST_PID
wait_for 15 "worker-1 to register" worker_registered worker-1

JOB=$("$HERDER_BIN" submit sleep --milliseconds "$SLEEP_MS" --coordinator "$CLIENT_ADDR")
echo "==> Submitted job $JOB (sleep ${SLEEP_MS} ms)"
wait_for 15 "the job to start" job_is "$JOB" state RUNNING
echo "==> Job is RUNNING on: $(job_field "$JOB" worker)"

start_bg "$work/worker-2.log" worker --id worker-2 --capacity 1 --coordinator "$WORKER_ADDR"
wait_for 15 "worker-2 to register" worker_registered worker-2

echo "==> Killing worker-1 with SIGKILL (pid $WORKER1_PID)"
kill -KILL "$WORKER1_PID"
wait "$WORKER1_PID" 2>/dev/null || true
echo "==> Waiting for the coordinator to detect the failure and reassign..."
wait_for 20 "the retry to start" job_is "$JOB" attempt 2
"$HERDER_BIN" status "$JOB" --coordinator "$CLIENT_ADDR"
echo "..."
"$HERDER_BIN" wait "$JOB" --coordinator "$CLIENT_ADDR"

echo
echo "==> The coordinator log tells the same story:"
grep -E "Job assigned|Worker connection lost|Retry scheduled|Job requeued|Job completed" "$work/coordinator.log" |
    sed -E 's/^[^ ]+ +[A-Z]+ +//'

state=$(job_field "$JOB" state)
attempt=$(job_field "$JOB" attempt)
worker=$(job_field "$JOB" worker)
if [ "$state" = COMPLETED ] && [ "$attempt" = 2 ] && [ "$worker" = worker-2 ]; then
    echo "==> OK: COMPLETED on attempt 2 on worker-2 after worker-1 was killed"
else
    echo "!! expected COMPLETED on attempt 2 on worker-2, got $state on attempt $attempt on $worker" >&2
    exit 1
fi
