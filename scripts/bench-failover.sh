#!/usr/bin/env bash
# Failover time of a 3-coordinator group, with real processes on 127.0.0.1 and the DEFAULT
# timeouts (election timeout 200 ms, so a follower starts an election 200-400 ms after it last
# heard the leader).
#
# Each run starts a fresh group and one worker, waits for a leader, and starts a submitter: a
# separate process that submits keyed sha256 jobs back to back (one `herder submit` process at a
# time, through all three addresses, so it follows redirects and fails over like any client)
# and records when each was sent and acknowledged (bash's $EPOCHREALTIME, microseconds). Then
# the leader is SIGKILLed. Measured per run:
#   failover: from just before the kill to the acknowledgement of the first submission sent
#             after it (only a new leader can have acknowledged that one; the submission in
#             flight at the kill may have been answered by the dying leader, so it is not used);
#   election: from the kill to the new leader's "Leader took over" log line (its clock and ours
#             are the same machine's).
# The submitter waits for each answer before sending the next, so "failover" may be late by up to
# one submit round trip (printed: the median before the kill), never early.
#
#   RUNS=20 ./scripts/bench-failover.sh        # raw results also go to $OUT
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

RUNS="${RUNS:-20}"
BASE="${FAILOVER_BASE_PORT:-17270}"
OUT="${OUT:-/work/results/failover.txt}"
WARMUP_ACKS="${WARMUP_ACKS:-20}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-bench-failover.XXXXXX")
trap 'cleanup_started; [ -n "${KEEP:-}" ] && echo "(logs kept in $work)" || rm -rf "$work"' EXIT
mkdir -p "$(dirname "$OUT")"

port() { echo $((BASE + 10 * $1 + $2)); }
PEERS="c0=127.0.0.1:$(port 0 2),c1=127.0.0.1:$(port 1 2),c2=127.0.0.1:$(port 2 2)"
CLIENT_ADDRS="127.0.0.1:$(port 0 1),127.0.0.1:$(port 1 1),127.0.0.1:$(port 2 1)"
WORKER_ADDRS="127.0.0.1:$(port 0 0),127.0.0.1:$(port 1 0),127.0.0.1:$(port 2 0)"
CLIENT_ADDR="$CLIENT_ADDRS"

leader_id() {
    "$HERDER_BIN" cluster --json --coordinator "$CLIENT_ADDRS" |
        python3 -c "import json,sys; v=json.load(sys.stdin); print(v.get('leader') or '')"
}
has_leader() { [ -n "$(leader_id)" ]; }

# submitter DIR RUN: keyed submissions back to back until DIR/stop exists (at most 60 s);
# one line per submission: sent_us acked_us ok|fail.
submitter() {
    local dir=$1 run=$2 n=0 t0 t1 ok
    local deadline=$((SECONDS + 60))
    while [ ! -e "$dir/stop" ] && [ "$SECONDS" -lt "$deadline" ]; do
        n=$((n + 1))
        t0=$EPOCHREALTIME
        if "$HERDER_BIN" submit sha256 --text "r$run-$n" --idempotency-key "r$run-$n" \
            --coordinator "$CLIENT_ADDRS" >/dev/null 2>>"$dir/submit-errors.log"; then
            ok=ok
        else
            ok=fail
        fi
        t1=$EPOCHREALTIME
        echo "${t0/./} ${t1/./} $ok" >>"$dir/submissions.txt"
    done
}

# acks_after FILE US: how many acknowledgements FILE holds that arrived after US.
acks_after() {
    awk -v k="$2" '$3 == "ok" && $2 > k { n++ } END { print n + 0 }' "$1" 2>/dev/null || echo 0
}
enough_acks() { [ "$(acks_after "$1" 0)" -ge "$WARMUP_ACKS" ]; }
# sent_and_acked_after FILE US: whether a submission sent after US has been acknowledged.
sent_and_acked_after() {
    awk -v k="$2" '$3 == "ok" && $1 > k { found = 1 } END { exit !found }' "$1" 2>/dev/null
}

{
    echo "# herder failover bench: $(date -u +%FT%TZ), $RUNS runs, 3 coordinators on 127.0.0.1,"
    echo "# default timeouts (election 200 ms), 1 worker; kill = SIGKILL of the leader."
    echo "# failover_ms: kill -> acknowledgement of the first submission sent after the kill"
    echo "#              (one client submitting back to back, keyed, through all three addresses)"
    echo "# election_ms: kill -> the new leader's 'Leader took over' log line"
    echo "# submit_rtt_ms: median submit round trip before the kill (resolution of failover_ms)"
    echo "# run killed new_leader failover_ms election_ms submit_rtt_ms"
} >"$OUT"

for run in $(seq "$RUNS"); do
    dir="$work/run$run"
    mkdir -p "$dir"
    STARTED_PIDS=()
    declare -A PID=()
    for i in 0 1 2; do
        start_bg "$dir/c$i.log" coordinator --id "c$i" --data-dir "$dir/c$i" \
            --worker-port "127.0.0.1:$(port "$i" 0)" --client-port "127.0.0.1:$(port "$i" 1)" \
            --peers "$PEERS"
        PID[c$i]=$LAST_PID
    done
    wait_for 20 "a leader (run $run)" has_leader
    start_bg "$dir/worker.log" worker --id w1 --capacity 4 --coordinator "$WORKER_ADDRS"
    wait_for 20 "the worker (run $run)" worker_registered w1
    LEADER=$(leader_id)

    submitter "$dir" "$run" &
    SUB_PID=$!
    STARTED_PIDS+=("$SUB_PID")
    wait_for 30 "steady submissions (run $run)" enough_acks "$dir/submissions.txt"

    kill_us=${EPOCHREALTIME/./}
    kill -KILL "${PID[$LEADER]}"
    wait "${PID[$LEADER]}" 2>/dev/null || true
    wait_for 30 "an acknowledged submission sent after the kill (run $run)" \
        sent_and_acked_after "$dir/submissions.txt" "$kill_us"
    touch "$dir/stop"
    wait "$SUB_PID" || true

    NEW=$(leader_id)
    line=$(python3 - "$dir" "$kill_us" "$LEADER" "$NEW" "$run" <<'EOF'
import datetime, statistics, sys
d, kill_us, old, new, run = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rows = [l.split() for l in open(f"{d}/submissions.txt") if l.strip()]
rows = [(int(a), int(b), ok) for a, b, ok in rows]
first = min(b for a, b, ok in rows if ok == "ok" and a > kill_us)
rtt = statistics.median((b - a) for a, b, ok in rows if ok == "ok" and b < kill_us)
election = "-"
for line in open(f"{d}/{new}.log"):
    if "Leader took over" in line:
        stamp = datetime.datetime.strptime(line.split()[0], "%Y-%m-%dT%H:%M:%S.%fZ")
        us = int(stamp.replace(tzinfo=datetime.timezone.utc).timestamp() * 1e6)
        if us > kill_us:
            election = f"{(us - kill_us) / 1000:.1f}"
            break
print(f"{run} {old} {new} {(first - kill_us) / 1000:.1f} {election} {rtt / 1000:.1f}")
EOF
)
    echo "$line" >>"$OUT"
    read -r _ old new failover election rtt <<<"$line"
    echo "run $run: killed $old, $new took over; failover ${failover} ms, election ${election} ms (submit rtt ${rtt} ms)"

    cleanup_started
    unset PID
done

python3 - "$OUT" <<'EOF' | tee -a "$OUT"
import math, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith("#")]
def summary(name, values):
    values = sorted(values)
    rank = lambda p: values[max(0, math.ceil(p / 100 * len(values)) - 1)]
    median = (values[(len(values) - 1) // 2] + values[len(values) // 2]) / 2
    return (f"# {name:<12} n={len(values)} min={values[0]:.1f} median={median:.1f} "
            f"p90={rank(90):.1f} p99={rank(99):.1f} max={values[-1]:.1f} (ms)")
print(summary("failover", [float(r[3]) for r in rows]))
elections = [float(r[4]) for r in rows if r[4] != "-"]
if elections:
    print(summary("election", elections))
print(summary("submit rtt", [float(r[5]) for r in rows]))
EOF
echo "==> raw results in $OUT"
