#!/usr/bin/env bash
# Leader failover, against real processes (nothing simulated):
#   three coordinators form a group and elect a leader; three workers connect to all of them; a
#   long job starts, and a stream of short jobs is submitted; the leader is SIGKILLed; the two
#   others elect a new leader, the workers re-register with it and report what they run, and the
#   long job completes on its first attempt (re-adopted, not re-run), and every acknowledged job
#   ends COMPLETED.
# Ports start at DEMO_BASE_PORT (default 17170); DEMO_SLEEP_MS sets the long job's length.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

BASE="${DEMO_BASE_PORT:-17170}"
SLEEP_MS="${DEMO_SLEEP_MS:-6000}"
SHORT_JOBS="${DEMO_SHORT_JOBS:-30}"
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-failover.XXXXXX")
trap 'cleanup_started; echo "(logs kept in $work)"' EXIT

# Member i: workers BASE+10i, clients BASE+10i+1, peers BASE+10i+2.
port() { echo $((BASE + 10 * $1 + $2)); }
PEERS="c0=127.0.0.1:$(port 0 2),c1=127.0.0.1:$(port 1 2),c2=127.0.0.1:$(port 2 2)"
CLIENT_ADDRS="127.0.0.1:$(port 0 1),127.0.0.1:$(port 1 1),127.0.0.1:$(port 2 1)"
WORKER_ADDRS="127.0.0.1:$(port 0 0),127.0.0.1:$(port 1 0),127.0.0.1:$(port 2 0)"
CLIENT_ADDR="$CLIENT_ADDRS"
declare -A COORD_PID
for i in 0 1 2; do
    start_bg "$work/c$i.log" coordinator --id "c$i" --data-dir "$work/c$i" \
        --worker-port "127.0.0.1:$(port "$i" 0)" --client-port "127.0.0.1:$(port "$i" 1)" \
        --peers "$PEERS" --heartbeat-interval-millis 200 --heartbeat-timeout-millis 1000
    COORD_PID[c$i]=$LAST_PID
done

# The member every other member names as leader.
leader_id() {
    "$HERDER_BIN" cluster --json --coordinator "$CLIENT_ADDRS" |
        python3 -c "import json,sys; v=json.load(sys.stdin); print(v.get('leader') or '')"
}
has_leader() { [ -n "$(leader_id)" ]; }

wait_for 20 "a leader to be elected" has_leader
LEADER=$(leader_id)
echo "==> Group formed; the leader is $LEADER"

for w in 1 2 3; do
    start_bg "$work/worker-$w.log" worker --id "worker-$w" --capacity 2 --coordinator "$WORKER_ADDRS"
done
for w in 1 2 3; do
    wait_for 20 "worker-$w to register" worker_registered "worker-$w"
done

LONG=$("$HERDER_BIN" submit sleep --milliseconds "$SLEEP_MS" --coordinator "$CLIENT_ADDRS")
echo "==> Submitted the long job $LONG (sleep ${SLEEP_MS} ms)"
wait_for 15 "the long job to start" job_is "$LONG" state RUNNING
echo "==> It runs on $(job_field "$LONG" worker), attempt $(job_field "$LONG" attempt)"

# A stream of short, keyed jobs while the leader dies (a keyed submission is resent safely if
# the answer is lost with the leader).
acked="$work/acked.txt"
: >"$acked"
(
    for n in $(seq 1 "$SHORT_JOBS"); do
        if id=$("$HERDER_BIN" submit sha256 --text "job-$n" --idempotency-key "failover-$n" \
            --coordinator "$CLIENT_ADDRS" 2>>"$work/submit-errors.log"); then
            echo "$id" >>"$acked"
        fi
        sleep 0.05
    done
) &
STREAM_PID=$!
STARTED_PIDS+=("$STREAM_PID")
sleep 0.5

echo "==> Killing the leader $LEADER with SIGKILL (pid ${COORD_PID[$LEADER]})"
kill -KILL "${COORD_PID[$LEADER]}"
wait "${COORD_PID[$LEADER]}" 2>/dev/null || true
killed_at=$(date +%s%N)

new_leader() { l=$(leader_id); [ -n "$l" ] && [ "$l" != "$LEADER" ]; }
wait_for 20 "a new leader" new_leader
NEW=$(leader_id)
FIRST=$("$HERDER_BIN" submit sha256 --text after-failover --idempotency-key after-failover \
    --coordinator "$CLIENT_ADDRS")
acked_at=$(date +%s%N)
echo "==> $NEW leads now; a new submission was acknowledged $(((acked_at - killed_at) / 1000000)) ms after the kill"
echo "$FIRST" >>"$acked"

wait "$STREAM_PID" || true
"$HERDER_BIN" wait "$LONG" --coordinator "$CLIENT_ADDRS" >/dev/null || true
"$HERDER_BIN" status "$LONG" --coordinator "$CLIENT_ADDRS"

failed=0
while read -r id _; do
    # A resend answered from its idempotency key prints its id with a note after it.
    [ -n "$id" ] || continue
    state=$("$HERDER_BIN" wait "$id" --json --timeout-millis 20000 --coordinator "$CLIENT_ADDRS" |
        python3 -c "import json,sys; print(json.load(sys.stdin)['state'])" || echo UNKNOWN)
    if [ "$state" != COMPLETED ]; then
        echo "!! acknowledged job $id ended $state" >&2
        failed=1
    fi
done <"$acked"
count=$(grep -c . "$acked")

echo
echo "==> The new leader's log tells the story:"
grep -hE "Leader elected|Leader took over|re-adopted|Stepped down" "$work"/c*.log | sort |
    sed -E 's/^[^ ]+ +[A-Z]+ +//' | head -10

state=$(job_field "$LONG" state)
attempt=$(job_field "$LONG" attempt)
if [ "$state" = COMPLETED ] && [ "$attempt" = 1 ] && [ "$failed" = 0 ]; then
    echo "==> OK: the long job completed on attempt 1 across the failover (re-adopted, not re-run),"
    echo "    and all $count acknowledged jobs completed"
else
    echo "!! expected the long job COMPLETED on attempt 1 and every acknowledged job COMPLETED;" >&2
    echo "   the long job is $state on attempt $attempt" >&2
    exit 1
fi
