#!/usr/bin/env bash
# Coordinator crash and restart: a job is RUNNING on worker-1 when the coordinator is SIGKILLed.
# A new coordinator starts on the same data directory; worker-1 reconnects by itself, reports
# the attempt it is still running, and the coordinator re-adopts it — the job completes on its
# first attempt, with nothing lost and nothing run twice. A job submitted before the crash and
# still queued survives too.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

WORKER_ADDR="127.0.0.1:${DEMO_WORKER_PORT:-17070}"
CLIENT_ADDR="127.0.0.1:${DEMO_CLIENT_PORT:-17071}"
SLEEP_MS="${DEMO_SLEEP_MS:-6000}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-demo.XXXXXX")
trap 'cleanup_started; echo "(logs kept in $work)"' EXIT
coordinator_flags=(--data-dir "$work/data" --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR"
    --heartbeat-interval-millis 500 --heartbeat-timeout-millis 3000)

start_bg "$work/coordinator-1.log" coordinator "${coordinator_flags[@]}"
COORDINATOR_PID=$LAST_PID
wait_for 15 "the coordinator to listen" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
start_bg "$work/worker-1.log" worker --id worker-1 --capacity 1 --coordinator "$WORKER_ADDR"
wait_for 15 "worker-1 to register" worker_registered worker-1

RUNNING=$("$HERDER_BIN" submit sleep --milliseconds "$SLEEP_MS" --coordinator "$CLIENT_ADDR")
QUEUED=$("$HERDER_BIN" submit sha256 --text "queued before the crash" --coordinator "$CLIENT_ADDR")
wait_for 15 "the first job to start" job_is "$RUNNING" state RUNNING
echo "==> Job $RUNNING is RUNNING on worker-1; job $QUEUED is QUEUED behind it"

echo "==> Killing the coordinator with SIGKILL (pid $COORDINATOR_PID)"
kill -KILL "$COORDINATOR_PID"
wait "$COORDINATOR_PID" 2>/dev/null || true
sleep 1
echo "==> Restarting it on the same data directory"
start_bg "$work/coordinator-2.log" coordinator "${coordinator_flags[@]}"
wait_for 15 "the new coordinator to listen" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"

"$HERDER_BIN" wait "$RUNNING" --coordinator "$CLIENT_ADDR"
"$HERDER_BIN" wait "$QUEUED" --coordinator "$CLIENT_ADDR"

echo
echo "==> The restarted coordinator's log:"
grep -E "Recovered state|Worker registered|re-adopted|Attempt not re-adopted|Job assigned|Job completed" "$work/coordinator-2.log" |
    sed -E 's/^[^ ]+ +[A-Z]+ +//'

[ "$(job_field "$RUNNING" state)" = COMPLETED ] && [ "$(job_field "$RUNNING" attempt)" = 1 ] &&
    [ "$(job_field "$QUEUED" state)" = COMPLETED ] || {
    echo "!! expected both jobs COMPLETED, the running one re-adopted on attempt 1" >&2
    exit 1
}
echo "==> OK: the running attempt was re-adopted after the restart and both jobs completed"
