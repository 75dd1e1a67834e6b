#!/usr/bin/env bash
# Throughput and latency of tiny jobs (sha256 of a short text): 3 workers x 4 slots, a separate
# `herder bench` process submitting, every transition durable. TOPOLOGIES picks what runs them:
#   dev     the embedded default: one coordinator and the workers in one process (`herder dev`)
#   single  one `herder coordinator` process and 3 `herder worker` processes
#   group   a 3-member coordinator group (3 processes joined by --peers, every transition
#           replicated to a majority) and 3 `herder worker` processes connected to all three;
#           the bench is given every member's address and follows redirects to the leader
# Each configuration runs on fresh data directories, RUNS times; prints one JSON line per run
# (the bench's, with "topology" and "run" added), then the median jobs/s of each configuration
# and, when both ran, the group's median as a fraction of the single coordinator's. With OUT
# set, the same lines are appended to that file. Each line also carries "cpu_per_1000_jobs":
# the CPU-seconds (user and kernel) each role spent per 1,000 accepted jobs, read from /proc
# when the bench ends: coordinators (split into their store thread and the rest), workers and
# the load generator. MAX_ACTIVE is every coordinator's --max-active-jobs.
#   JOBS="2000 20000" PIPELINES="1 8" RUNS=3 ./scripts/bench-throughput.sh
#   TOPOLOGIES="single group" JOBS=5000 OUT=/tmp/throughput.txt ./scripts/bench-throughput.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

JOBS="${JOBS:-2000 20000}"
PIPELINES="${PIPELINES:-1 8}"
RUNS="${RUNS:-3}"
CONCURRENCY="${CONCURRENCY:-4}"
BATCH="${BATCH:-1}"
TOPOLOGIES="${TOPOLOGIES:-dev}"
WORKERS="${WORKERS:-3}"
CAPACITY="${CAPACITY:-4}"
OUT="${OUT:-}"
MAX_ACTIVE="${MAX_ACTIVE:-1000000}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27070}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27071}"
# single and group: member i listens on BASE+10i (workers), +1 (clients), +2 (peers).
BASE="${BENCH_BASE_PORT:-27100}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-bench.XXXXXX")
trap 'cleanup_started; rm -rf "$work"' EXIT
results="$work/results.jsonl"

port() { echo $((BASE + 10 * $1 + $2)); }

# all_workers_alive: the coordinator (group: its leader) lists every worker alive.
all_workers_alive() {
    "$HERDER_BIN" workers --json --coordinator "$CLIENT_ADDR" |
        python3 -c "import json,sys; ws=json.load(sys.stdin)['workers']; sys.exit(0 if sum(1 for w in ws if w['alive']) >= $WORKERS else 1)"
}

# start_topology NAME: starts it on fresh data and sets CLIENT_ADDR to where the bench goes.
start_topology() {
    rm -rf "$work/data"
    mkdir -p "$work/data"
    case $1 in
    dev)
        CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27071}"
        start_bg "$work/dev.log" dev --workers "$WORKERS" --capacity "$CAPACITY" \
            --data-dir "$work/data" --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" \
            --max-active-jobs "$MAX_ACTIVE" --http-port off
        ROLES+=("dev=$LAST_PID")
        wait_for 15 "the dev cluster" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
        ;;
    single | group)
        local members=1 peers="" clients=() workers=()
        [ "$1" = group ] && members=3
        for i in $(seq 0 $((members - 1))); do
            peers+="${peers:+,}c$i=127.0.0.1:$(port "$i" 2)"
            clients+=("127.0.0.1:$(port "$i" 1)")
            workers+=("127.0.0.1:$(port "$i" 0)")
        done
        for i in $(seq 0 $((members - 1))); do
            local group_flags=()
            [ "$members" -gt 1 ] && group_flags=(--id "c$i" --peers "$peers")
            start_bg "$work/c$i.log" coordinator --data-dir "$work/data/c$i" \
                --worker-port "${workers[$i]}" --client-port "${clients[$i]}" "${group_flags[@]}" \
                --max-active-jobs "$MAX_ACTIVE" --http-port off
            ROLES+=("coordinator-$i=$LAST_PID")
        done
        CLIENT_ADDR=$(IFS=,; echo "${clients[*]}")
        local worker_addrs
        worker_addrs=$(IFS=,; echo "${workers[*]}")
        for w in $(seq "$WORKERS"); do
            start_bg "$work/worker-$w.log" worker --id "worker-$w" --capacity "$CAPACITY" \
                --coordinator "$worker_addrs"
            ROLES+=("worker-$w=$LAST_PID")
        done
        ;;
    *)
        echo "!! unknown topology $1 (dev, single or group)" >&2
        exit 2
        ;;
    esac
    wait_for 30 "$1: every worker registered" all_workers_alive
}

# Runs of different topologies alternate, so that whatever else the machine does weighs on
# each alike.
for jobs in $JOBS; do
    for pipeline in $PIPELINES; do
        for run in $(seq "$RUNS"); do
            for topology in $TOPOLOGIES; do
                STARTED_PIDS=()
                ROLES=()
                start_topology "$topology"
                python3 "$HERDER_ROOT/scripts/bench-run.py" "$topology" "$run" "${ROLES[@]}" -- \
                    "$HERDER_BIN" bench --jobs "$jobs" --concurrency "$CONCURRENCY" \
                    --pipeline "$pipeline" --batch "$BATCH" --task sha256 --text herder \
                    --coordinator "$CLIENT_ADDR" --json | tee -a "$results"
                cleanup_started
            done
        done
    done
done

summary=$(python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
medians = {}
for r in rows:
    medians.setdefault((r["topology"], r["jobs"], r["pipeline"], r.get("batch", 1), r["concurrency"]), []).append(
        r["throughput_jobs_per_second"])
print(f"{'topology':<9} {'jobs':>6} {'conc':>4} {'pipe':>4} {'batch':>5}  {'runs (jobs/s)':<28} {'median':>8}  vs single")
for (topology, jobs, pipeline, batch, conc), values in sorted(medians.items()):
    median = statistics.median(values)
    single = medians.get(("single", jobs, pipeline, batch, conc))
    ratio = f"{median / statistics.median(single):.2f}" if single and topology != "single" else "-"
    runs = " ".join(f"{v:.0f}" for v in values)
    print(f"{topology:<9} {jobs:>6} {conc:>4} {pipeline:>4} {batch:>5}  {runs:<28} {median:>8.0f}  {ratio}")
EOF
)
echo "$summary"
if [ -n "$OUT" ]; then
    mkdir -p "$(dirname "$OUT")"
    cat "$results" >>"$OUT"
    echo "$summary" >>"$OUT"
fi
