#!/usr/bin/env bash
# The heartbeat path: worker-1 is paused with SIGSTOP (its socket stays open, it just goes
# silent). After the heartbeat timeout the coordinator declares it lost and worker-2 runs the job.
# Then worker-1 is resumed with SIGCONT: it reconnects and reports its old result, which is
# rejected as stale — the lease it carries was revoked long ago.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

WORKER_ADDR="127.0.0.1:${DEMO_WORKER_PORT:-17070}"
CLIENT_ADDR="127.0.0.1:${DEMO_CLIENT_PORT:-17071}"
SLEEP_MS="${DEMO_SLEEP_MS:-5000}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-demo.XXXXXX")
trap 'cleanup_started; echo "(logs kept in $work)"' EXIT

start_bg "$work/coordinator.log" coordinator --data-dir "$work/data" \
    --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" \
    --heartbeat-interval-millis 500 --heartbeat-timeout-millis 2000 --retry-base-millis 500
wait_for 15 "the coordinator to listen" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
start_bg "$work/worker-1.log" worker --id worker-1 --capacity 1 --coordinator "$WORKER_ADDR"
WORKER1_PID=$LAST_PID
wait_for 15 "worker-1 to register" worker_registered worker-1

JOB=$("$HERDER_BIN" submit sleep --milliseconds "$SLEEP_MS" --coordinator "$CLIENT_ADDR")
wait_for 15 "the job to start" job_is "$JOB" state RUNNING
echo "==> Job $JOB is RUNNING on: $(job_field "$JOB" worker)"
start_bg "$work/worker-2.log" worker --id worker-2 --capacity 1 --coordinator "$WORKER_ADDR"
wait_for 15 "worker-2 to register" worker_registered worker-2

echo "==> Pausing worker-1 with SIGSTOP (pid $WORKER1_PID); its connection stays open"
kill -STOP "$WORKER1_PID"
echo "==> Waiting for the heartbeat timeout (2 s) and the retry..."
wait_for 30 "the job to complete" job_is "$JOB" state COMPLETED
"$HERDER_BIN" status "$JOB" --coordinator "$CLIENT_ADDR"

echo "==> Resuming worker-1 with SIGCONT: it comes back with a result for a revoked lease"
kill -CONT "$WORKER1_PID"
wait_for 20 "the stale result to be rejected" grep -q "Stale result rejected" "$work/coordinator.log"

echo
echo "==> Coordinator log:"
grep -E "Job assigned|Worker connection lost|Retry scheduled|Job requeued|Job completed|Stale result rejected|Worker registered" "$work/coordinator.log" |
    sed -E 's/^[^ ]+ +[A-Z]+ +//'

[ "$(job_field "$JOB" attempt)" = 2 ] && [ "$(job_field "$JOB" worker)" = worker-2 ] || {
    echo "!! expected the job to complete on attempt 2 on worker-2" >&2
    exit 1
}
echo "==> OK: the hung worker was declared lost, the job completed elsewhere, the late result was rejected"
