# Shared helpers for the scripts in this folder. Source it; do not run it.
# shellcheck shell=bash

HERDER_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
HERDER_BIN="${HERDER_BIN:-$HERDER_ROOT/target/release/herder}"

# Builds the release binary once (quietly) if it is missing or older than the sources.
ensure_built() {
    if [ ! -x "$HERDER_BIN" ] || [ -n "$(find "$HERDER_ROOT"/{core,runtime,http,bins}/src "$HERDER_ROOT/Cargo.lock" -newer "$HERDER_BIN" -print -quit 2>/dev/null)" ]; then
        echo "==> Building herder (release)..." >&2
        (cd "$HERDER_ROOT" && cargo build --release -p herder --quiet) || exit 1
    fi
}

# PIDs this script started; only these are ever signalled.
STARTED_PIDS=()

cleanup_started() {
    for pid in "${STARTED_PIDS[@]}"; do
        kill -CONT "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}

# start_bg LOGFILE ARGS... : runs herder ARGS in the background, logging to LOGFILE; sets LAST_PID.
start_bg() {
    local log=$1
    shift
    "$HERDER_BIN" "$@" >"$log" 2>&1 &
    LAST_PID=$!
    STARTED_PIDS+=("$LAST_PID")
}

# wait_for SECONDS DESCRIPTION COMMAND... : polls COMMAND every 0.2 s until it succeeds.
wait_for() {
    local seconds=$1 what=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "!! timed out after ${seconds}s waiting for: $what" >&2
            return 1
        fi
        sleep 0.2
    done
}

# job_field JOB_ID FIELD : one field of `herder status --json`.
job_field() {
    "$HERDER_BIN" status "$1" --json --coordinator "$CLIENT_ADDR" |
        python3 -c "import json,sys; v=json.load(sys.stdin).get('$2'); print('' if v is None else v)"
}

# job_is JOB_ID FIELD VALUE : succeeds when the job's FIELD equals VALUE (for wait_for).
job_is() {
    [ "$(job_field "$1" "$2")" = "$3" ]
}

# workers_alive COUNT : succeeds once the coordinator (in a group, its leader) lists at least
# COUNT workers alive (for wait_for).
workers_alive() {
    "$HERDER_BIN" workers --json --coordinator "$CLIENT_ADDR" |
        python3 -c "import json,sys; ws=json.load(sys.stdin)['workers']; sys.exit(0 if sum(1 for w in ws if w['alive']) >= $1 else 1)"
}

# worker_registered NAME : succeeds once the coordinator lists NAME as alive (for wait_for).
worker_registered() {
    "$HERDER_BIN" workers --json --coordinator "$CLIENT_ADDR" |
        python3 -c "import json,sys; sys.exit(0 if any(w['id']=='$1' and w['alive'] for w in json.load(sys.stdin)['workers']) else 1)"
}
