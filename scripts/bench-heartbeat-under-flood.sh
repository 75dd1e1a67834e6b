#!/usr/bin/env bash
# Heartbeat-loss detection delay while client connections flood the coordinator with reads. A
# coordinator (heartbeat interval HB_INTERVAL_MS, timeout HB_TIMEOUT_MS) and one worker run as
# separate processes; FLOODERS python connections each keep PIPELINE `STATUS` requests (of one
# completed job) in flight, reading every reply. Each run SIGSTOPs the worker (its socket stays
# open, its heartbeats stop), polls `WORKERS` every POLL_MS ms on a connection of its own until
# the worker shows `alive: false`, then SIGCONTs it and waits for it to register again. Per run:
#   late_ms  the coordinator's own "silent for N ms" (in its loss log line) minus the timeout:
#            how late the heartbeat check fired, whatever the heartbeat phase;
#   stop_ms  (loss log timestamp - SIGSTOP) minus the timeout: normally in [-interval, 0],
#            since the last heartbeat went out before the SIGSTOP;
#   seen_ms  (first WORKERS reply showing the loss - SIGSTOP) minus the timeout: what a client
#            sees, poll period included;
#   rtt_ms   median round trip of those WORKERS polls; req/s: STATUS replies per second across
#            all flooders during the run. Then min/median/max of each column.
# FLOOD=both (default) runs a baseline without flood, then the flood; FLOOD=0 only the
# baseline, FLOOD=1 only the flood. Bounded: a run gives up after the timeout plus 30 s.
#   RUNS=5 FLOODERS=4 PIPELINE=64 HB_INTERVAL_MS=200 HB_TIMEOUT_MS=1000 POLL_MS=20 \
#       ./scripts/bench-heartbeat-under-flood.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
# The measuring Python imports its wire helpers from here.
export HERDER_SCRIPTS="$HERDER_ROOT/scripts"
ensure_built

RUNS="${RUNS:-5}"
FLOOD="${FLOOD:-both}"
FLOODERS="${FLOODERS:-4}"
PIPELINE="${PIPELINE:-64}"
HB_INTERVAL_MS="${HB_INTERVAL_MS:-200}"
HB_TIMEOUT_MS="${HB_TIMEOUT_MS:-1000}"
POLL_MS="${POLL_MS:-20}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27270}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27271}"
case "$FLOOD" in
    both) phases="0 1" ;;
    0 | 1) phases=$FLOOD ;;
    *) echo "FLOOD must be 0, 1 or both" >&2; exit 2 ;;
esac
work=$(mktemp -d "${TMPDIR:-/tmp}/herder-hbflood.XXXXXX")
# Logs are kept on failure, or always with KEEP_LOGS=1.
trap 'rc=$?; cleanup_started; if [ "$rc" = 0 ] && [ -z "${KEEP_LOGS:-}" ]; then rm -rf "$work"; else echo "(logs kept in $work)" >&2; fi' EXIT

start_bg "$work/coordinator.log" coordinator --data-dir "$work/data" \
    --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR" \
    --heartbeat-interval-millis "$HB_INTERVAL_MS" --heartbeat-timeout-millis "$HB_TIMEOUT_MS"
coordinator_pid=$LAST_PID
wait_for 15 "the coordinator" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
start_bg "$work/worker-1.log" worker --id worker-1 --capacity 1 --coordinator "$WORKER_ADDR"
worker_pid=$LAST_PID
wait_for 15 "worker-1 to register" worker_registered worker-1
# The flood reads this job: a completed job, so every STATUS is answered from the table at once.
job=$("$HERDER_BIN" submit sha256 --text "heartbeat flood" --coordinator "$CLIENT_ADDR")
wait_for 15 "the job to complete" job_is "$job" state COMPLETED

cat >"$work/measure.py" <<'PY'
import datetime, json, multiprocessing as mp, os, random, re, signal, socket, statistics, struct, sys, time

(client_addr, worker_pid, worker_id, log_path, job_id, runs, flooders, pipeline,
 interval_ms, timeout_ms, poll_ms, flood) = sys.argv[1:]
worker_pid, runs, flooders, pipeline = int(worker_pid), int(runs), int(flooders), int(pipeline)
interval_ms, timeout_ms, poll_ms, flood = int(interval_ms), int(timeout_ms), int(poll_ms), flood == "1"
host, port = client_addr.rsplit(":", 1)
port = int(port)
sys.path.insert(0, os.environ["HERDER_SCRIPTS"])
from herder_wire import Conn, frame  # noqa: E402

LOSS = re.compile(r"^(\S+)\s+WARN\s+Worker connection lost: workerId=(\S+) reason=(.*)$")


def flooder(index, counter, stop):
    """Keeps `pipeline` STATUS requests in flight on one connection, reading every reply."""
    try:
        sock = socket.create_connection((host, port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(0.5)
        job = job_id.encode()
        rid = 0

        def batch(k):
            nonlocal rid
            parts = []
            for _ in range(k):
                rid += 1
                body = b'{"type":"STATUS","request_id":%d,"job_id":"%s"}' % (rid, job)
                parts.append(struct.pack(">I", len(body)) + body)
            return b"".join(parts)

        sock.sendall(batch(pipeline))
        buf = bytearray()
        checked = False
        outstanding = pipeline
        drain_until = None
        # Once told to stop, it sends nothing more and reads the replies still owed (for up to
        # 2 s), so that the coordinator is not left writing to a closed socket.
        while outstanding > 0:
            if drain_until is None and stop.is_set():
                drain_until = time.time() + 2
            if drain_until is not None and time.time() > drain_until:
                break
            try:
                chunk = sock.recv(262144)
            except socket.timeout:
                continue
            if not chunk:
                print(f"!! flooder {index}: coordinator closed the connection", file=sys.stderr)
                return
            buf += chunk
            off, n = 0, 0
            while len(buf) - off >= 4:
                size = int.from_bytes(buf[off:off + 4], "big")
                if len(buf) - off < 4 + size:
                    break
                if not checked:
                    kind = json.loads(bytes(buf[off + 4:off + 4 + size])).get("type")
                    if kind != "JOB":
                        print(f"!! flooder {index}: first reply is {kind}, not JOB", file=sys.stderr)
                    checked = True
                off += 4 + size
                n += 1
            del buf[:off]
            outstanding -= n
            if n:
                counter.value += n
                if drain_until is None:
                    sock.sendall(batch(n))
                    outstanding += n
        sock.close()
    except Exception as error:  # reported, the run goes on with fewer flooders
        print(f"!! flooder {index}: {error}", file=sys.stderr)


def log_losses():
    """(timestamp, worker, reason) of every loss line in the coordinator log."""
    out = []
    with open(log_path, errors="replace") as log:
        for line in log:
            m = LOSS.match(line.strip())
            if m:
                ts = datetime.datetime.strptime(m.group(1).rstrip("Z")[:26], "%Y-%m-%dT%H:%M:%S.%f")
                out.append((ts.replace(tzinfo=datetime.timezone.utc).timestamp(), m.group(2), m.group(3)))
    return out


def view(poll):
    _, _, reply = poll.call({"type": "WORKERS"})
    return next((w for w in reply.get("workers", []) if w["id"] == worker_id), None)


def wait_alive(poll, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        w = view(poll)
        if w and w["alive"]:
            return True
        time.sleep(0.05)
    return False


ctx = mp.get_context("fork")
stop = ctx.Event()
counters = [ctx.Value("q", 0, lock=False) for _ in range(flooders if flood else 0)]
procs = [ctx.Process(target=flooder, args=(i, c, stop), daemon=True) for i, c in enumerate(counters)]
poll = Conn(client_addr)
rows, failures, unexpected = [], 0, []
losses_before = len(log_losses())


def total():
    return sum(c.value for c in counters)


try:
    for p in procs:
        p.start()
    if flood:
        time.sleep(1.0)  # let the flood reach its pace
        if total() == 0:
            sys.exit("!! the flood answered nothing in 1 s")
        print(f"    flood running: {total()} replies in its first second, {sum(p.is_alive() for p in procs)} of {flooders} flooders alive")
    print("run      req/s  late_ms  stop_ms  seen_ms  rtt_ms          loss reason (coordinator log)")
    for run in range(1, runs + 1):
        if not wait_alive(poll, 20):
            print(f"{run:>3}  !! {worker_id} did not come back alive within 20 s")
            failures += 1
            break
        # Steady heartbeats before the pause, which falls at a random point of the heartbeat cycle.
        time.sleep(max(0.5, 3 * interval_ms / 1000) + random.uniform(0, interval_ms / 1000))
        c0, t0 = total(), time.time()
        before = log_losses()
        t_stop = time.time()
        os.kill(worker_pid, signal.SIGSTOP)
        rtts, seen, give_up = [], None, t_stop + timeout_ms / 1000 + 30
        while time.time() < give_up:
            sent, got, reply = poll.call({"type": "WORKERS"})
            rtts.append(got - sent)
            w = next((w for w in reply.get("workers", []) if w["id"] == worker_id), None)
            if w and not w["alive"]:
                seen = got
                break
            time.sleep(max(0.0, poll_ms / 1000 - (time.time() - sent)))
        c1, t1 = total(), time.time()
        os.kill(worker_pid, signal.SIGCONT)
        if seen is None:
            print(f"{run:>3}  !! not declared lost within {timeout_ms} ms + 30 s")
            failures += 1
            continue
        found = None
        for _ in range(40):  # the log is written by a background thread
            new = log_losses()[len(before):]
            found = next((l for l in new if l[1] == worker_id and l[0] >= t_stop - 1), None)
            if found:
                break
            time.sleep(0.05)
        unexpected += [l for l in before[losses_before:] if l[1] == worker_id]
        losses_before = len(before) + 1
        silent = re.search(r"silent for (\d+) ms", found[2]) if found else None
        row = {
            "run": run,
            "rps": (c1 - c0) / (t1 - t0),
            "late": int(silent.group(1)) - timeout_ms if silent else None,
            "stop": (found[0] - t_stop) * 1000 - timeout_ms if found else None,
            "seen": (seen - t_stop) * 1000 - timeout_ms,
            "rtt": statistics.median(rtts) * 1000,
            "rtt_max": max(rtts) * 1000,
            "reason": found[2] if found else "(no loss line in the log)",
        }
        rows.append(row)
        fmt = lambda v, p=0: "-" if v is None else f"{v:.{p}f}"
        print(f"{run:>3}  {fmt(row['rps']):>9}  {fmt(row['late']):>7}  {fmt(row['stop']):>7}  "
              f"{fmt(row['seen']):>7}  {fmt(row['rtt'], 1):>6} (max {fmt(row['rtt_max'], 1)})  {row['reason']}")
finally:
    stop.set()
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.terminate()
    try:
        os.kill(worker_pid, signal.SIGCONT)
    except ProcessLookupError:
        pass

for key, name in (("rps", "req/s"), ("late", "late_ms"), ("stop", "stop_ms"), ("seen", "seen_ms"), ("rtt", "rtt_ms")):
    values = [r[key] for r in rows if r[key] is not None]
    if values:
        print(f"     {name:<8} min {min(values):9.1f}  median {statistics.median(values):9.1f}  max {max(values):9.1f}")
if unexpected:
    print(f"!! {len(unexpected)} loss(es) of {worker_id} before a SIGSTOP (declared lost while running):")
    for ts, _, reason in unexpected:
        print(f"   {datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat()} {reason}")
sys.exit(1 if failures else 0)
PY

status=0
for phase in $phases; do
    echo
    if [ "$phase" = 0 ]; then
        echo "==> Baseline, no flood: $RUNS runs; heartbeat interval $HB_INTERVAL_MS ms, timeout $HB_TIMEOUT_MS ms; WORKERS polled every $POLL_MS ms"
    else
        echo "==> Flood: $FLOODERS connections x $PIPELINE pipelined STATUS; $RUNS runs; heartbeat interval $HB_INTERVAL_MS ms, timeout $HB_TIMEOUT_MS ms; WORKERS polled every $POLL_MS ms"
    fi
    python3 "$work/measure.py" "$CLIENT_ADDR" "$worker_pid" worker-1 "$work/coordinator.log" "$job" \
        "$RUNS" "$FLOODERS" "$PIPELINE" "$HB_INTERVAL_MS" "$HB_TIMEOUT_MS" "$POLL_MS" "$phase" || status=1
done

echo
problems=$(grep -E " (WARN|ERROR) " "$work/coordinator.log" | grep -v -E "Worker connection lost: workerId=worker-1 reason=heartbeat timeout" || true)
if [ -n "$problems" ]; then
    echo "==> Other warnings and errors in the coordinator log ($(printf '%s\n' "$problems" | wc -l) lines; first 10):"
    printf '%s\n' "$problems" | head -10
else
    echo "==> No other warnings or errors in the coordinator log"
fi
# After each SIGCONT the worker logs one disconnect: "coordinator silent" (its own timer fired
# first) or "connection closed by peer" (it read the coordinator's close first). More than one
# per run means it gave up on a running coordinator.
echo "==> Worker disconnects, by reason (one per run is expected, after each SIGCONT):"
grep -o "Disconnected (.*" "$work/worker-1.log" | sed -E 's/[0-9]+ ms/N ms/g' | sort | uniq -c || echo "    none"
grep -E "VmHWM" "/proc/$coordinator_pid/status" | sed 's/^/==> coordinator /'
exit "$status"
