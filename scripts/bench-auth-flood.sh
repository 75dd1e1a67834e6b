#!/usr/bin/env bash
# What failed handshakes cost a coordinator whose ports check credentials. One coordinator with
# a worker secret, a peer secret and a tokens file; then, in rounds of ROUND connections each
# (ROUNDS rounds, CONCURRENCY at a time), every kind of stranger:
#   a worker that guesses a proof (AUTH_HELLO, then a random AUTH_PROOF);
#   a worker that skips the handshake (REGISTER straight away);
#   a client with an unknown token;
#   a client that skips the handshake (a WORKERS request);
#   a connection that closes after half a frame.
# Each must be refused (a typed error, then the connection closed); the script counts what each
# stranger got. Between rounds it reads the coordinator's resident memory (VmRSS), and at the
# end the refusals /metrics counted and whether an honest client and worker still get through.
#   ROUNDS=10 ROUND=1000 CONCURRENCY=16 ./scripts/bench-auth-flood.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export HERDER_SCRIPTS="$HERDER_ROOT/scripts"
ensure_built

ROUNDS="${ROUNDS:-10}"
ROUND="${ROUND:-1000}"
CONCURRENCY="${CONCURRENCY:-16}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27470}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27471}"
HTTP_ADDR="127.0.0.1:${BENCH_HTTP_PORT:-27472}"

work=$(mktemp -d)
trap 'cleanup_started; rm -rf "$work"' EXIT
token=$(head -c 32 /dev/urandom | base64 | tr -d '\n')
head -c 32 /dev/urandom | base64 >"$work/worker.secret"
head -c 32 /dev/urandom | base64 >"$work/peer.secret"
printf 'bench admin %s\n' "$token" >"$work/tokens"

start_bg "$work/coordinator.log" coordinator --data-dir "$work/data" \
    --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" --http-port "$HTTP_ADDR" \
    --worker-secret-file "$work/worker.secret" --peer-secret-file "$work/peer.secret" \
    --client-tokens-file "$work/tokens"
coordinator=$LAST_PID
export HERDER_TOKEN="$token"
wait_for 30 "the coordinator answers" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$coordinator/status"; }

echo "round,connections,refused_typed,closed_without_answer,answered_otherwise,rss_kib"
echo "0,0,0,0,0,$(rss_kib)"
for round in $(seq 1 "$ROUNDS"); do
    result=$(python3 - "$WORKER_ADDR" "$CLIENT_ADDR" "$ROUND" "$CONCURRENCY" <<'PY'
import os, socket, struct, sys, json
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, os.environ["HERDER_SCRIPTS"])
from herder_wire import frame, split

worker, client, total, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def read_frame(sock):
    buf = b""
    while len(buf) < 4:
        chunk = sock.recv(4 - len(buf))
        if not chunk:
            return None
        buf += chunk
    n = struct.unpack(">I", buf)[0]
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    return json.loads(body)

def stranger(i):
    kind = i % 5
    addr = worker if kind in (0, 1, 4) else client
    sock = socket.create_connection(split(addr), timeout=10)
    try:
        if kind == 0:
            sock.sendall(frame({"type": "AUTH_HELLO", "link": "worker", "nonce": os.urandom(32).hex()}))
            challenge = read_frame(sock)
            if not challenge or challenge.get("type") != "AUTH_CHALLENGE":
                return "other"
            sock.sendall(frame({"type": "AUTH_PROOF", "proof": os.urandom(32).hex()}))
        elif kind == 1:
            sock.sendall(frame({"type": "REGISTER", "worker_id": "impostor", "incarnation": i,
                                "capacity": 4, "running": [], "finished": []}))
        elif kind == 2:
            sock.sendall(frame({"type": "AUTH_TOKEN", "token": os.urandom(24).hex()}))
        elif kind == 3:
            sock.sendall(frame({"type": "WORKERS", "request_id": 1}))
        else:
            sock.sendall(struct.pack(">I", 100) + b"{\"type\":")
            sock.shutdown(socket.SHUT_WR)
            return "closed" if sock.recv(1) == b"" else "other"
        reply = read_frame(sock)
        if reply is None:
            return "closed"
        code = reply.get("code")
        if code == "UNAUTHENTICATED" and sock.recv(1) == b"":
            return "typed"
        return "other"
    except (ConnectionError, socket.timeout):
        return "closed"
    finally:
        sock.close()

with ThreadPoolExecutor(concurrency) as pool:
    outcomes = list(pool.map(stranger, range(total)))
print(outcomes.count("typed"), outcomes.count("closed"), outcomes.count("other"))
PY
)
    read -r typed closed other <<<"$result"
    echo "$round,$ROUND,$typed,$closed,$other,$(rss_kib)"
done

refusals=$(curl -s -H "Authorization: Bearer $token" "http://$HTTP_ADDR/metrics" | grep '^herder_auth_refusals_total' || true)
echo "metrics:"
echo "$refusals"
warnings=$(grep -c "Connection refused: no valid credential" "$work/coordinator.log" || true)
echo "refusal log lines: $warnings"
start_bg "$work/worker.log" worker --id honest --coordinator "$WORKER_ADDR" --worker-secret-file "$work/worker.secret"
job=$("$HERDER_BIN" submit sha256 --text abc --coordinator "$CLIENT_ADDR" --wait --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['job']['state'])")
echo "an honest client's job after the flood: $job"
