#!/usr/bin/env bash
# The container deployment, tested: builds the image (scripts/build-image.sh), brings up
# deploy/compose.yaml (three coordinators and three workers, every port with its credential and
# TLS) with the Docker daemon of Debian's docker.io package, runs jobs, SIGKILLs the leader's
# container, and checks that every acknowledged job completes and that the killed member rejoins;
# then tears everything down. Skips itself, saying why, where no Docker daemon can run.
#   ./scripts/test-compose.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"

JOBS_BEFORE="${JOBS_BEFORE:-24}"
JOBS_AFTER="${JOBS_AFTER:-12}"
PROJECT="herder-compose-test-$$"
export HERDER_IMAGE="herder:compose-test"

skip() {
    echo "SKIP scripts/test-compose.sh: $*"
    exit 0
}

work=$(mktemp -d "${TMPDIR:-/tmp}/herder-compose.XXXXXX")
DOCKERD_PID=""
compose() { docker-compose -p "$PROJECT" -f "$HERDER_ROOT/deploy/compose.yaml" "$@"; }
finish() {
    local status=$?
    if [ "$status" -ne 0 ] && [ -f "$work/up" ]; then
        echo "== container logs ==" >&2
        compose logs --no-color --tail 40 >&2 || true
    fi
    [ -f "$work/up" ] && compose down -v --remove-orphans >/dev/null 2>&1 || true
    if [ -n "$DOCKERD_PID" ]; then
        kill "$DOCKERD_PID" 2>/dev/null || true
        wait "$DOCKERD_PID" 2>/dev/null || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap finish EXIT

# The tools: Debian's docker.io (daemon and client) and docker-compose, installed if missing.
if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "==> Installing docker.io and docker-compose" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose >"$work/apt.log" 2>&1 ||
            skip "docker.io could not be installed (see apt-get's output)"
    else
        skip "no dockerd or docker-compose here, and no root to install Debian's docker.io"
    fi
fi
if ! docker info >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || skip "no Docker daemon runs, and only root could start one"
    echo "==> Starting a Docker daemon for this test" >&2
    dockerd >"$work/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    deadline=$((SECONDS + 30))
    until docker info >/dev/null 2>&1; do
        if ! kill -0 "$DOCKERD_PID" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
            skip "no Docker daemon can run here: $(tail -1 "$work/dockerd.log")"
        fi
        sleep 0.5
    done
fi

IMAGE="$HERDER_IMAGE" "$HERDER_ROOT/scripts/build-image.sh"
user=$(docker image inspect "$HERDER_IMAGE" --format '{{.Config.User}}')
[ "$user" = "10001:10001" ] || { echo "!! the image runs as '$user', not the unprivileged 10001" >&2; exit 1; }

# Credentials, readable by the image's user only.
secrets="$work/secrets"
mkdir -p "$secrets"
random() { python3 -c "import secrets; print(secrets.token_urlsafe(30))"; }
random >"$secrets/peer.secret"
random >"$secrets/worker.secret"
TOKEN=$(random)
echo "ops admin $TOKEN" >"$secrets/tokens"
"$HERDER_BIN" gen-certs --out "$secrets/tls" --host 127.0.0.1 --host localhost >/dev/null
chown -R 10001:10001 "$secrets"
chmod -R go-rwx "$secrets"
export HERDER_SECRETS="$secrets"

# The host's CLI speaks to the group as the admin, over TLS.
export HERDER_TOKEN="$TOKEN" HERDER_TLS_CA="$secrets/tls/ca.pem"
CLIENT_ADDR="127.0.0.1:17171,127.0.0.1:17271,127.0.0.1:17371"

echo "==> docker-compose up (project $PROJECT)" >&2
touch "$work/up"
compose up -d >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; exit 1; }
wait_for 60 "three workers registered with the group's leader" workers_alive 3
for member in c1 c2 c3; do
    pid=$(docker inspect --format '{{.State.Pid}}' "$(compose ps -q "$member")")
    uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
    [ "$uid" = 10001 ] || { echo "!! $member runs as uid $uid" >&2; exit 1; }
done
echo "==> Every container runs as uid 10001" >&2

submit() {
    "$HERDER_BIN" submit "$@" --json --coordinator "$CLIENT_ADDR" |
        python3 -c "import json,sys; print(json.load(sys.stdin)['job_id'])"
}
: >"$work/acknowledged"
for n in $(seq "$JOBS_BEFORE"); do
    if [ $((n % 2)) = 0 ]; then
        submit sleep --milliseconds 1500 >>"$work/acknowledged"
    else
        submit sha256 --text "compose $n" >>"$work/acknowledged"
    fi
done

leader=$("$HERDER_BIN" cluster --json --coordinator "$CLIENT_ADDR" |
    python3 -c "import json,sys; v=json.load(sys.stdin); l=v.get('leader'); print(l['node_id'] if isinstance(l, dict) else l)")
case "$leader" in c1 | c2 | c3) ;; *) echo "!! no leader named: $leader" >&2; exit 1 ;; esac
echo "==> SIGKILL the leader's container ($leader) with $JOBS_BEFORE jobs acknowledged" >&2
compose kill -s SIGKILL "$leader" >/dev/null 2>&1

# Acknowledged after the failover: the CLI follows the group to its new leader.
for n in $(seq "$JOBS_AFTER"); do
    submit sha256 --text "after $n" >>"$work/acknowledged"
done
echo "==> $JOBS_AFTER more jobs acknowledged by the new leader" >&2

failed=0
while read -r job; do
    state=$("$HERDER_BIN" wait "$job" --timeout-millis 60000 --json --coordinator "$CLIENT_ADDR" |
        python3 -c "import json,sys; v=json.load(sys.stdin); print(v.get('job', v).get('state'))") || state="unanswered"
    if [ "$state" != COMPLETED ]; then
        echo "!! job $job ended $state" >&2
        failed=1
    fi
done <"$work/acknowledged"
[ "$failed" = 0 ] || exit 1
total=$(wc -l <"$work/acknowledged")
echo "==> All $total acknowledged jobs COMPLETED" >&2

# The killed member comes back on its volume and follows the new leader; its probes say so.
compose start "$leader" >/dev/null 2>&1
http_port=$(( 17080 + 100 * ${leader#c} ))
wait_for 60 "$leader ready again" curl -fsS --cacert "$secrets/tls/ca.pem" "https://127.0.0.1:$http_port/readyz"
curl -fsS --cacert "$secrets/tls/ca.pem" "https://127.0.0.1:$http_port/healthz" >/dev/null
echo "==> $leader restarted on its volume and is ready (HTTPS /readyz)" >&2
echo "PASS scripts/test-compose.sh: $total jobs acknowledged across a leader's SIGKILL, all completed"
