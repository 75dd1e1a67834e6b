#!/usr/bin/env bash
# Retention soak: a coordinator and two workers (separate processes) under a steady load of
# tiny sha256 jobs for MINUTES minutes, with the retention policy RETAIN. Every SAMPLE_SECONDS
# it records the coordinator's resident memory, the jobs submitted so far, the terminal jobs
# the coordinator still holds and the size of its data directory, and prints them as a table,
# then the first and last samples after the warm-up for comparison. With a bounded policy the
# memory stays flat however long it runs; with RETAIN=forever it grows with every job.
#   MINUTES=30 RATE=300 RETAIN=2m,10000 ./scripts/soak-retention.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

MINUTES="${MINUTES:-30}"
RATE="${RATE:-300}"
RETAIN="${RETAIN:-2m,10000}"
SAMPLE_SECONDS="${SAMPLE_SECONDS:-30}"
WORKER_ADDR="127.0.0.1:${SOAK_WORKER_PORT:-27270}"
CLIENT_ADDR="127.0.0.1:${SOAK_CLIENT_PORT:-27271}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-soak.XXXXXX")
trap 'cleanup_started; rm -rf "$work"' EXIT

start_bg "$work/coordinator.log" coordinator --data-dir "$work/data" \
    --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" --retain-terminal "$RETAIN" \
    --max-active-jobs 100000
coordinator_pid=$LAST_PID
wait_for 15 "the coordinator" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
for w in 1 2; do
    start_bg "$work/worker-$w.log" worker --id "soak-$w" --coordinator "$WORKER_ADDR" --capacity 4
done
wait_for 15 "worker soak-1" worker_registered soak-1
wait_for 15 "worker soak-2" worker_registered soak-2

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$coordinator_pid/status"; }
# Terminal jobs held after the last purge, as the coordinator logged it ("-" before any).
terminal_held() {
    grep -o 'keptTerminal=[0-9]*' "$work/coordinator.log" | tail -1 | cut -d= -f2 | grep . || echo -
}

end=$((SECONDS + MINUTES * 60))
next_sample=$SECONDS
submitted=0
samples="$work/samples.tsv"
printf 'elapsed_s\trss_kib\tsubmitted\tterminal_kept\tdata_kib\n' | tee "$samples"
while [ "$SECONDS" -lt "$end" ]; do
    second_start=$SECONDS
    # One second's worth of jobs, then wait out the rest of the second: a steady rate.
    "$HERDER_BIN" bench --jobs "$RATE" --concurrency 2 --pipeline 8 --task sha256 \
        --text soak --coordinator "$CLIENT_ADDR" --json >/dev/null
    submitted=$((submitted + RATE))
    if [ "$SECONDS" -ge "$next_sample" ]; then
        printf '%s\t%s\t%s\t%s\t%s\n' "$((SECONDS - (end - MINUTES * 60)))" "$(rss_kib)" \
            "$submitted" "$(terminal_held)" "$(du -sk "$work/data" | cut -f1)" | tee -a "$samples"
        next_sample=$((next_sample + SAMPLE_SECONDS))
    fi
    while [ "$SECONDS" -eq "$second_start" ]; do sleep 0.05; done
done
echo "==> purges logged: $(grep -c 'Jobs purged' "$work/coordinator.log" || true)"
grep -E "VmHWM" "/proc/$coordinator_pid/status"
