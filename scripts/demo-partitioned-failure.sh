#!/usr/bin/env bash
# A data-parallel job against real processes (nothing simulated): prime-sum over 1..=10^10 is
# split into three partitions on three workers; the worker computing partition 0 is SIGKILLed
# mid-run; the coordinator retries that partition on a surviving worker and the job completes
# with the exact answer (455,052,511 primes summing to 2,220,822,432,581,729,238).
# Ports can be changed: DEMO_WORKER_PORT, DEMO_CLIENT_PORT.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

WORKER_ADDR="127.0.0.1:${DEMO_WORKER_PORT:-17080}"
CLIENT_ADDR="127.0.0.1:${DEMO_CLIENT_PORT:-17081}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-demo.XXXXXX")
trap 'cleanup_started; echo "(logs kept in $work)"' EXIT

start_bg "$work/coordinator.log" coordinator --data-dir "$work/data" \
    --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" \
    --heartbeat-interval-millis 200 --heartbeat-timeout-millis 1000 --retry-base-millis 100
wait_for 15 "the coordinator to listen" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"

declare -A PID
for id in worker-1 worker-2 worker-3; do
    start_bg "$work/$id.log" worker --id "$id" --capacity 1 --coordinator "$WORKER_ADDR"
    PID[$id]=$LAST_PID
    wait_for 15 "$id to register" worker_registered "$id"
done

JOB=$("$HERDER_BIN" submit prime-sum --start 1 --end 10000000000 --partitions 3 --coordinator "$CLIENT_ADDR")
echo "==> Submitted job $JOB: prime-sum 1..=10^10 in 3 partitions"

# partition_field INDEX FIELD : one field of one partition in `status --json`.
partition_field() {
    "$HERDER_BIN" status "$JOB" --json --coordinator "$CLIENT_ADDR" |
        python3 -c "import json,sys; p=json.load(sys.stdin)['partitions']['pieces'][$1]; v=p.get('$2'); print('' if v is None else v)"
}
all_running() {
    for i in 0 1 2; do [ "$(partition_field "$i" state)" = RUNNING ] || return 1; done
}
wait_for 30 "all three partitions to run" all_running
victim=$(partition_field 0 worker)
"$HERDER_BIN" status "$JOB" --coordinator "$CLIENT_ADDR"
echo "==> Killing $victim (running partition 0) with SIGKILL (pid ${PID[$victim]})"
kill -KILL "${PID[$victim]}"
wait "${PID[$victim]}" 2>/dev/null || true

"$HERDER_BIN" wait "$JOB" --coordinator "$CLIENT_ADDR"
echo
echo "==> The coordinator log tells the same story:"
grep -E "Job split|Job assigned|Worker connection lost|Retry scheduled|Job requeued|Job completed" "$work/coordinator.log" |
    sed -E 's/^[^ ]+ +[A-Z]+ +//'

result=$("$HERDER_BIN" status "$JOB" --json --coordinator "$CLIENT_ADDR" |
    python3 -c "import json,sys; j=json.load(sys.stdin); print(j['state'], j['result']['count'], j['result']['sum'], j['partitions']['pieces'][0]['attempt'])")
if [ "$result" = "COMPLETED 455052511 2220822432581729238 2" ]; then
    echo "==> OK: exact answer after $victim was killed; partition 0 ran twice"
else
    echo "!! expected 'COMPLETED 455052511 2220822432581729238 2', got '$result'" >&2
    exit 1
fi
