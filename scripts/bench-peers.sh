#!/usr/bin/env bash
# Herder's throughput targets held against two job queues people reach for, like for like:
# BullMQ on Redis and graphile-worker on PostgreSQL, each set to acknowledge a submission only
# once it is on disk (Redis: append-only file, `appendfsync always`; PostgreSQL: its defaults,
# `fsync=on`, `synchronous_commit=on`), 3 worker processes x 4 jobs at once, the same tiny task
# (the SHA-256 of a short text), the load generator a separate process on the same cores. Per
# system and RUNS times (alternating), in separate processes, on fresh data:
#   one     one submission in flight on each of 4 connections, 20,000 jobs, to the last finished
#   batch   bulk submissions of 100 on 8 connections, 40,000 jobs, to the last finished (each
#           connection sends its next bulk at once; Herder's bench waits for a batch's jobs
#           before it sends the next, which is the harder load)
#   alone   `one` with no workers, counted at the acknowledgements: the submission path alone
# and the same three loads on one Herder coordinator with 3 `herder worker` processes. Prints one
# JSON line per run, then a table of medians.
# Needs node and npm (the pinned packages in scripts/peers/package.json are installed into a
# temporary folder), redis-server and PostgreSQL's server binaries:
#   apt-get install nodejs npm redis-server postgresql
#   RUNS=3 ./scripts/bench-peers.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built

RUNS="${RUNS:-3}"
SMOKE="${SMOKE:-}"
REDIS_PORT="${REDIS_PORT:-27190}"
PG_PORT="${PG_PORT:-27191}"
BASE="${BENCH_BASE_PORT:-27192}"
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
for need in node npm redis-server redis-cli; do
    command -v "$need" >/dev/null || { echo "!! $need is missing: apt-get install nodejs npm redis-server postgresql" >&2; exit 2; }
done
[ -x "$PG_BIN/postgres" ] || { echo "!! PostgreSQL's server is missing: apt-get install postgresql" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/herder-peers.XXXXXX")
chmod 755 "$work"
trap 'stop_databases; cleanup_started; rm -rf "$work"' EXIT
results="$work/results.jsonl"
cp "$HERDER_ROOT/scripts/peers/"*.mjs "$HERDER_ROOT/scripts/peers/package.json" "$work/"
echo "==> installing the peers' packages" >&2
(cd "$work" && npm install --silent --no-audit --no-fund >/dev/null)

# PostgreSQL refuses to run as root; it runs as the postgres user then.
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -c "$*"; else sh -c "$*"; fi; }
mkdir -p "$work/pg" && [ "$(id -u)" = 0 ] && chown postgres "$work/pg"
as_pg "'$PG_BIN/initdb' -D '$work/pg/data' -A trust -U postgres" >"$work/initdb.log"
as_pg "'$PG_BIN/pg_ctl' -D '$work/pg/data' -l '$work/pg/log' -w -o '-p $PG_PORT -k $work/pg -c listen_addresses=127.0.0.1' start" >/dev/null
PSQL=(psql -q -h 127.0.0.1 -p "$PG_PORT" -U postgres)
stop_databases() {
    as_pg "'$PG_BIN/pg_ctl' -D '$work/pg/data' -m fast stop" >/dev/null 2>&1 || true
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
}
export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/peers" REDIS_PORT

# scaled COUNT: COUNT, or a twentieth of it for a smoke run (SMOKE=1; its figures mean nothing).
scaled() { if [ -n "$SMOKE" ]; then echo $(($1 / 20)); else echo "$1"; fi; }

# fresh SYSTEM: empty storage for SYSTEM.
fresh() {
    case $1 in
    bullmq)
        redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
        rm -rf "$work/redis" && mkdir -p "$work/redis"
        redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$work/redis" --appendonly yes \
            --appendfsync always --save "" --maxmemory-policy noeviction --daemonize yes \
            --pidfile "$work/redis.pid" --logfile "$work/redis.log"
        wait_for 15 "redis" redis-cli -p "$REDIS_PORT" ping
        [ "$(redis-cli -p "$REDIS_PORT" dbsize)" = 0 ] || { echo "!! redis is not empty" >&2; exit 1; }
        ;;
    graphile)
        "${PSQL[@]}" -c "drop database if exists peers" -c "create database peers"
        (cd "$work" && SYSTEM=graphile MODE=migrate JOBS=0 CONNECTIONS=1 node bench.mjs)
        ;;
    esac
}

# run SYSTEM LOAD RUN: one measured run; prints its JSON line.
run() {
    local system=$1 load=$2 run=$3 workers=3 env=()
    case $load in
    one) env=(MODE=one JOBS="$(scaled 20000)" CONNECTIONS=4) ;;
    batch) env=(MODE=batch JOBS="$(scaled 40000)" CONNECTIONS=8 BATCH=100) ;;
    alone) env=(MODE=one JOBS="$(scaled 20000)" CONNECTIONS=4 NO_WAIT=1) workers=0 ;;
    esac
    STARTED_PIDS=()
    if [ "$system" = herder ]; then
        local flags=()
        case $load in
        one) flags=(--jobs "$(scaled 20000)" --concurrency 4 --pipeline 1) ;;
        batch) flags=(--jobs "$(scaled 40000)" --concurrency 8 --batch 100) ;;
        alone) flags=(--jobs "$(scaled 20000)" --concurrency 4 --pipeline 1 --no-wait) ;;
        esac
        rm -rf "$work/herder"
        start_bg "$work/coordinator.log" coordinator --data-dir "$work/herder" --worker-port "127.0.0.1:$BASE" \
            --client-port "127.0.0.1:$((BASE + 1))" --http-port off --max-active-jobs 1000000
        CLIENT_ADDR="127.0.0.1:$((BASE + 1))"
        for w in $(seq "$workers"); do
            start_bg "$work/worker-$w.log" worker --id "worker-$w" --capacity 4 --prefetch 16 --coordinator "127.0.0.1:$BASE"
        done
        wait_for 15 "every herder worker" workers_alive "$workers"
        "$HERDER_BIN" bench "${flags[@]}" --task sha256 --text herder --coordinator "$CLIENT_ADDR" --json |
            python3 -c "import json,sys; b=json.load(sys.stdin); print(json.dumps({'system': 'herder', 'load': '$load', 'run': $run, 'jobs_per_second': b['accepted'] / b['elapsed_seconds'], 'ack_p50_ms': b['submit_ack_millis']['p50'], 'ack_p99_ms': b['submit_ack_millis']['p99']}))"
    else
        fresh "$system" >/dev/null
        for w in $(seq "$workers"); do
            (cd "$work" && SYSTEM=$system CONCURRENCY=4 exec node worker.mjs) >"$work/worker-$w.log" 2>&1 &
            STARTED_PIDS+=("$!")
        done
        sleep 1 # the workers connect; a job submitted before is picked up when they do
        (cd "$work" && env SYSTEM="$system" "${env[@]}" node bench.mjs) |
            python3 -c "import json,sys; b=json.load(sys.stdin); print(json.dumps({'system': '$system', 'load': '$load', 'run': $run, **{k: b[k] for k in ('jobs_per_second', 'ack_p50_ms', 'ack_p99_ms')}}))"
        # A worker whose shutdown waits on its queue would hold up the next run.
        for pid in "${STARTED_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    fi
    cleanup_started
}

for run in $(seq "$RUNS"); do
    for load in one batch alone; do
        for system in herder bullmq graphile; do
            run "$system" "$load" "$run" | tee -a "$results"
        done
    done
done

python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
names = {"one": "one in flight on each of 4 connections", "batch": "bulk of 100 on 8 connections",
         "alone": "one in flight, submissions alone"}
print()
print(f"{'load':<40} {'system':<10} {'runs (jobs/s)':<26} {'median':>8} {'ack p50':>9}  vs Herder")
for load in ("one", "batch", "alone"):
    herder = None
    for system in ("herder", "bullmq", "graphile"):
        mine = [r for r in rows if r["load"] == load and r["system"] == system]
        if not mine:
            continue
        m = statistics.median(r["jobs_per_second"] for r in mine)
        p50 = statistics.median(r["ack_p50_ms"] for r in mine)
        herder = m if system == "herder" else herder
        runs = " ".join(f"{r['jobs_per_second']:.0f}" for r in mine)
        ratio = ""
        if herder and system != "herder":
            ratio = f"{herder / m:.1f}x slower" if m <= herder else f"{m / herder:.1f}x faster"
        print(f"{names[load]:<40} {system:<10} {runs:<26} {m:>8.0f} {p50:>7.2f}ms  {ratio}")
PY
