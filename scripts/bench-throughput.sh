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
# the load generator. MAX_ACTIVE is every coordinator's --max-active-jobs; PREFETCH is every
# worker's --prefetch (assignments held beyond its CAPACITY slots); RATE paces the bench (jobs/s;
# PIPELINES and BATCH are then not used). TLS=1 runs single and group with TLS on every port
# (mutual on the peer link; a throwaway CA from `herder gen-certs`), the workers and the bench
# verifying the coordinators.
#   JOBS="2000 20000" PIPELINES="1 8" RUNS=3 ./scripts/bench-throughput.sh
#   TOPOLOGIES="single group" JOBS=5000 OUT=/tmp/throughput.txt ./scripts/bench-throughput.sh
#
# SUITE=targets runs every throughput, latency and memory target instead, RUNS times each on
# the single coordinator and the group (alternating), and prints one table with each row's
# median against its target: batched submission, one submission in flight on each of four
# connections (beside the rate of durable commits this disk allows, measured the same way; the
# same load with no workers and no waits, so that only submissions run; and the floor: how fast
# a server with no job logic answers the same load, runtime/examples/ack_floor.rs, as it is and
# told how many requests to wait for),
# submit-to-completed latency at a paced 300 jobs/s, and the coordinator's peak resident
# memory with 100,000 jobs queued. SMOKE=1 makes every count 20 times smaller (CI runs it so,
# to show the suite works; its figures mean nothing).
# PREFETCH applies to the suite's workers too.
#   SUITE=targets RUNS=3 PREFETCH=16 ./scripts/bench-throughput.sh
# SPREADS spreads the jobs over queues and fairness keys, one configuration per word: `none`
# (every job in the default queue, no key), `queues=N` (round-robin over N queues) or `keys=N`
# (round-robin over N fairness keys of the default queue); the summary has a row per spread.
#   TOPOLOGIES=single SPREADS="none queues=100 keys=10000" BATCH=100 ./scripts/bench-throughput.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

JOBS="${JOBS:-2000 20000}"
PIPELINES="${PIPELINES:-1 8}"
RUNS="${RUNS:-3}"
CONCURRENCY="${CONCURRENCY:-4}"
BATCH="${BATCH:-1}"
RATE="${RATE:-}"
TOPOLOGIES="${TOPOLOGIES:-dev}"
WORKERS="${WORKERS:-3}"
CAPACITY="${CAPACITY:-4}"
PREFETCH="${PREFETCH:-0}"
OUT="${OUT:-}"
MAX_ACTIVE="${MAX_ACTIVE:-1000000}"
SUITE="${SUITE:-}"
SPREADS="${SPREADS:-none}"
SMOKE="${SMOKE:-}"
TLS="${TLS:-}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27070}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27071}"
# single and group: member i listens on BASE+10i (workers), +1 (clients), +2 (peers).
BASE="${BENCH_BASE_PORT:-27100}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-bench.XXXXXX")
trap 'cleanup_started; rm -rf "$work"' EXIT
results="$work/results.jsonl"
TLS_FLAGS=()
if [ -n "$TLS" ]; then
    "$HERDER_BIN" gen-certs --out "$work/tls" --host 127.0.0.1 >/dev/null
    TLS_FLAGS=(--tls-cert "$work/tls/node.pem" --tls-key "$work/tls/node-key.pem")
    # Every herder command of this script (workers, the bench, the probes, and the coordinators
    # for their peer link) trusts the throwaway CA.
    export HERDER_TLS_CA="$work/tls/ca.pem"
fi

port() { echo $((BASE + 10 * $1 + $2)); }

# start_topology NAME: starts it on fresh data and sets CLIENT_ADDR to where the bench goes.
start_topology() {
    rm -rf "$work/data"
    mkdir -p "$work/data"
    case $1 in
    dev)
        if [ -n "$TLS" ]; then
            echo "!! TLS=1 runs the single and group topologies only" >&2
            exit 2
        fi
        CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27071}"
        start_bg "$work/dev.log" dev --workers "$WORKERS" --capacity "$CAPACITY" --prefetch "$PREFETCH" \
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
                "${TLS_FLAGS[@]}" --max-active-jobs "$MAX_ACTIVE" --http-port off
            ROLES+=("coordinator-$i=$LAST_PID")
        done
        CLIENT_ADDR=$(IFS=,; echo "${clients[*]}")
        local worker_addrs
        worker_addrs=$(IFS=,; echo "${workers[*]}")
        for w in $(seq "$WORKERS"); do
            start_bg "$work/worker-$w.log" worker --id "worker-$w" --capacity "$CAPACITY" --prefetch "$PREFETCH" \
                --coordinator "$worker_addrs"
            ROLES+=("worker-$w=$LAST_PID")
        done
        ;;
    *)
        echo "!! unknown topology $1 (dev, single or group)" >&2
        exit 2
        ;;
    esac
    wait_for 30 "$1: every worker registered" workers_alive "$WORKERS"
}

# scaled COUNT: COUNT, or a twentieth of it for a smoke run.
scaled() { if [ -n "$SMOKE" ]; then echo $(($1 / 20)); else echo "$1"; fi; }

# peak_memory: the coordinator's peak resident memory (KiB) once 100,000 jobs are queued on
# it (no workers, so they stay queued), submitted from a JSON-lines file in batches.
peak_memory() {
    local queued
    queued=$(scaled 100000)
    rm -rf "$work/data"
    STARTED_PIDS=()
    start_bg "$work/memory.log" coordinator --data-dir "$work/data" --worker-port "127.0.0.1:$(port 0 0)" \
        --client-port "127.0.0.1:$(port 0 1)" --http-port off --max-active-jobs "$MAX_ACTIVE"
    local pid=$LAST_PID
    CLIENT_ADDR="127.0.0.1:$(port 0 1)"
    wait_for 15 "the coordinator" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
    python3 -c "import json,sys
for i in range($queued): print(json.dumps({'task': {'kind': 'sha256', 'text': f'herder {i}'}}))" >"$work/queued.jsonl"
    "$HERDER_BIN" submit --batch-file "$work/queued.jsonl" --coordinator "$CLIENT_ADDR" >/dev/null
    awk '/^VmHWM/ {print $2}' "/proc/$pid/status"
    cleanup_started
}

run_targets() {
    FLOOR_BIN="$HERDER_ROOT/target/release/examples/ack_floor"
    (cd "$HERDER_ROOT" && cargo build --release -q -p herder-runtime --example ack_floor) || exit 1
    # Each row: its name, the workers it runs with, the bench's flags. "Submissions alone" is the
    # one-in-flight load on coordinators with no workers, the bench not waiting for jobs, so only
    # the submission path and its commits run (the jobs stay queued): what to hold against the
    # floor, which runs no jobs either.
    local rows=(
        "batched (batch 100, 8 connections)|$WORKERS|--jobs $(scaled 40000) --concurrency 8 --batch 100"
        "one in flight on each of 4 connections|$WORKERS|--jobs $(scaled 20000) --concurrency 4 --pipeline 1"
        "one in flight, submissions alone (no workers)|0|--jobs $(scaled 20000) --concurrency 4 --pipeline 1 --no-wait"
        "paced at 300 jobs/s (4 connections)|$WORKERS|--jobs $(scaled 6000) --concurrency 4 --rate 300"
    )
    for row in "${rows[@]}"; do
        local name=${row%%|*} rest=${row#*|}
        local workers=${rest%%|*} flags=${rest#*|}
        for run in $(seq "$RUNS"); do
            for topology in single group; do
                STARTED_PIDS=()
                ROLES=()
                WORKERS=$workers start_topology "$topology"
                # shellcheck disable=SC2086 # the flags are words
                python3 "$HERDER_ROOT/scripts/bench-run.py" "$topology" "$run" "${ROLES[@]}" -- \
                    "$HERDER_BIN" bench $flags --task sha256 --text herder \
                    --coordinator "$CLIENT_ADDR" --json |
                    python3 -c "import json,sys; print(json.dumps({'target': '$name', **json.loads(sys.stdin.read())}))" |
                    tee -a "$results"
                cleanup_started
            done
        done
    done
    mkdir -p "$work/fsync"
    python3 "$HERDER_ROOT/scripts/fsync-limit.py" "$work/fsync" "$(scaled 2000)" >"$work/fsync.json"
    # The floor: a server with no job logic that only commits and answers (ack_floor.rs); and
    # the ideal floor, the same server told to wait up to 100 us for all 4 requests before each
    # commit, which no server that does not know its load can do.
    for run in $(seq "$RUNS"); do
        for floor in floor ideal-floor; do
            local gather=()
            [ "$floor" = ideal-floor ] && gather=(4 100)
            rm -rf "$work/floor"
            "$FLOOR_BIN" server "127.0.0.1:$(port 0 3)" "$work/floor" "${gather[@]}" &
            STARTED_PIDS=("$!")
            wait_for 15 "the floor server" python3 -c "import socket; socket.create_connection(('127.0.0.1', $(port 0 3)), 1)"
            echo "{\"target\": \"$floor\", \"run\": $run, \"floor\": $("$FLOOR_BIN" client "127.0.0.1:$(port 0 3)" 4 "$(scaled 20000)")}" |
                tee -a "$results"
            cleanup_started
        done
    done
    for run in $(seq "$RUNS"); do
        echo "{\"target\": \"memory\", \"run\": $run, \"peak_rss_kib\": $(peak_memory)}" | tee -a "$results"
    done
    python3 - "$results" "$work/fsync.json" "$WORKERS x $CAPACITY slots, prefetch $PREFETCH" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fsync = json.load(open(sys.argv[2]))
limit = 4 * fsync["commits_per_second"]
def median(target, topology, key):
    values = [key(r) for r in rows if r.get("target") == target and r.get("topology") == topology]
    return (statistics.median(values), values) if values else (None, [])
throughput = lambda r: r["throughput_jobs_per_second"]
p99 = lambda r: r["end_to_end_millis"]["p99"]
print()
print(f"workers: {sys.argv[3]}")
print(f"{'target':<46} {'topology':<8} {'runs':<26} {'median':>9}  goal")
def line(name, topology, key, unit, goal, scale=1.0):
    m, values = median(name, topology, key)
    if m is None:
        return
    runs = " ".join(f"{v * scale:.0f}" if unit != "ms" else f"{v:.2f}" for v in values)
    shown = f"{m * scale:.0f}" if unit != "ms" else f"{m:.2f}"
    print(f"{name:<46} {topology:<8} {runs:<26} {shown:>9}  {goal}")
line("batched (batch 100, 8 connections)", "single", throughput, "jobs/s", "at least 20,000 jobs/s")
line("batched (batch 100, 8 connections)", "group", throughput, "jobs/s", "at least 10,000 jobs/s")
def floor_of(target):
    values = [r["floor"]["per_second"] for r in rows if r.get("target") == target]
    return (statistics.median(values) if values else 0), values
floor_median, floor = floor_of("floor")
of_floor = lambda m: f"{m / floor_median:.0%} of the floor" if floor_median else ""
for topology in ("single", "group"):
    m, _ = median("one in flight on each of 4 connections", topology, throughput)
    line("one in flight on each of 4 connections", topology, throughput, "jobs/s",
         f"at least 80% of {limit:,} jobs/s (4 x {fsync['commits_per_second']:,} commits/s, p50 commit {fsync['commit_millis_p50']} ms); "
         + (of_floor(m) if m else ""))
alone = "one in flight, submissions alone (no workers)"
for topology in ("single", "group"):
    m, _ = median(alone, topology, throughput)
    if m:
        line(alone, topology, throughput, "jobs/s", f"(diagnostic) {of_floor(m)}")
for target, label, what in (
    ("floor", "  the floor: commit-and-answer, no job logic", "commit-and-answer alone, same disk and cores"),
    ("ideal-floor", "  the ideal floor: waits for all 4 (<= 100 us)", "a server that knows its load"),
):
    m, values = floor_of(target)
    if values:
        runs = " ".join(f"{v:.0f}" for v in values)
        print(f"{label:<46} {'-':<8} {runs:<26} {m:>9.0f}  {what}: {m / limit:.0%} of that limit")
line("paced at 300 jobs/s (4 connections)", "single", p99, "ms", "submit-to-completed p99 at most 5 ms")
line("paced at 300 jobs/s (4 connections)", "group", p99, "ms", "submit-to-completed p99 at most 10 ms")
memory = [r["peak_rss_kib"] for r in rows if r.get("target") == "memory"]
if memory:
    runs = " ".join(f"{v / 1024:.0f}" for v in memory)
    print(f"{'peak resident memory, jobs queued (MiB)':<46} {'single':<8} {runs:<26} {statistics.median(memory) / 1024:>9.0f}  at most 200 MiB with 100,000 queued")
PY
}

if [ "$SUITE" = targets ]; then
    run_targets | tee -a "${OUT:-/dev/null}"
    exit 0
fi

# Runs of different topologies alternate, so that whatever else the machine does weighs on
# each alike.
for jobs in $JOBS; do
    for pipeline in $PIPELINES; do
        for run in $(seq "$RUNS"); do
            for spread in $SPREADS; do
                case "$spread" in
                    none) placed=() ;;
                    queues=*) placed=(--queues "${spread#queues=}") ;;
                    keys=*) placed=(--fairness-keys "${spread#keys=}") ;;
                    *) echo "unknown spread $spread (none, queues=N, keys=N)" >&2; exit 2 ;;
                esac
                for topology in $TOPOLOGIES; do
                    STARTED_PIDS=()
                    ROLES=()
                    start_topology "$topology"
                    load=(--pipeline "$pipeline" --batch "$BATCH")
                    [ -n "$RATE" ] && load=(--rate "$RATE")
                    python3 "$HERDER_ROOT/scripts/bench-run.py" "$topology" "$run" "${ROLES[@]}" -- \
                        "$HERDER_BIN" bench --jobs "$jobs" --concurrency "$CONCURRENCY" \
                        "${load[@]}" ${placed[@]+"${placed[@]}"} --task sha256 --text herder \
                        --coordinator "$CLIENT_ADDR" --json | tee -a "$results"
                    cleanup_started
                done
            done
        done
    done
done

summary=$(python3 - "$results" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
medians = {}
for r in rows:
    spread = f"q{r.get('queues', 0)}/k{r.get('fairness_keys', 0)}"
    medians.setdefault((r["topology"], r["jobs"], r["pipeline"], r.get("batch", 1), r["concurrency"], spread), []).append(
        r["throughput_jobs_per_second"])
print(f"{'topology':<9} {'jobs':>6} {'conc':>4} {'pipe':>4} {'batch':>5} {'spread':>10}  {'runs (jobs/s)':<28} {'median':>8}  vs single")
for (topology, jobs, pipeline, batch, conc, spread), values in sorted(medians.items()):
    median = statistics.median(values)
    single = medians.get(("single", jobs, pipeline, batch, conc, spread))
    ratio = f"{median / statistics.median(single):.2f}" if single and topology != "single" else "-"
    runs = " ".join(f"{v:.0f}" for v in values)
    print(f"{topology:<9} {jobs:>6} {conc:>4} {pipeline:>4} {batch:>5} {spread:>10}  {runs:<28} {median:>8.0f}  {ratio}")
EOF
)
echo "$summary"
if [ -n "$OUT" ]; then
    mkdir -p "$(dirname "$OUT")"
    cat "$results" >>"$OUT"
    echo "$summary" >>"$OUT"
fi
