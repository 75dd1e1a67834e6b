#!/usr/bin/env bash
# What idle sockets and a client that never reads do to a worker trying to register. Each
# scenario gets a fresh coordinator; a fresh worker is started and timed until it registers:
# from its start to the coordinator's "Worker registered" log line (reg_ms), and to the first
# WORKERS reply listing it alive on a client connection opened before the load (seen_ms).
#   a  baseline: an idle coordinator;
#   b  IDLE_SOCKETS TCP connections (5,000 by default, opened at IDLE_RATE per second: a
#      faster burst overflows the 128-entry listen queue and connects wait for SYN
#      retransmissions) to the worker port that never send a byte: the port holds at most
#      4,096 connections and closes one whose first message has not arrived within 10 s, so
#      the worker is refused until the deadline clears them;
#   c  the same idle sockets on the client port (the worker port should not notice; the CLI,
#      which needs a client connection, is refused meanwhile);
#   d  one client that pipelines STALL_REQUESTS STATUS requests (of a job id that does not
#      exist) and never reads a reply, so the kernel buffers fill and the coordinator's writer
#      stalls (it gives up on a write after 30 s) while the worker registers.
# For each it also reports what the load saw (when the coordinator closed the idle sockets, or
# the stalled connection), how `herder workers` fared meanwhile, every failed attempt the worker
# logged (with the reconnect delays of its backoff), the coordinator's warnings, and its memory.
# Bounded: registration is given up after GIVE_UP_S seconds, the stall after 60 s. Raises
# `ulimit -n` to 20,000 (or the hard limit) for the idle sockets.
#   IDLE_SOCKETS=5000 IDLE_RATE=5000 STALL_REQUESTS=100000 GIVE_UP_S=60 SCENARIOS="a b c d" \
#       ./scripts/bench-idle-sockets.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
# The measuring Python imports its wire helpers from here.
export HERDER_SCRIPTS="$HERDER_ROOT/scripts"
ensure_built

IDLE_SOCKETS="${IDLE_SOCKETS:-5000}"
IDLE_RATE="${IDLE_RATE:-5000}"
STALL_REQUESTS="${STALL_REQUESTS:-100000}"
GIVE_UP_S="${GIVE_UP_S:-60}"
SCENARIOS="${SCENARIOS:-a b c d}"
POLL_MS="${POLL_MS:-20}"
WORKER_ADDR="127.0.0.1:${BENCH_WORKER_PORT:-27370}"
CLIENT_ADDR="127.0.0.1:${BENCH_CLIENT_PORT:-27371}"

hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -gt 20000 ]; then hard=20000; fi
ulimit -n "$hard"
if [ "$(ulimit -n)" -lt $((IDLE_SOCKETS + 200)) ]; then
    echo "!! ulimit -n is $(ulimit -n), too low for $IDLE_SOCKETS idle sockets" >&2
    exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/herder-idle.XXXXXX")
# Logs are kept on failure, or always with KEEP_LOGS=1.
trap 'rc=$?; cleanup_started; if [ "$rc" = 0 ] && [ -z "${KEEP_LOGS:-}" ]; then rm -rf "$work"; else echo "(logs kept in $work)" >&2; fi' EXIT

cat >"$work/scenario.py" <<'PY'
import collections, datetime, json, os, re, selectors, socket, statistics, struct, subprocess
import sys, threading, time, uuid

(scenario, herder, worker_addr, client_addr, coord_pid, coord_log, work, idle_count, idle_rate,
 stall_requests, give_up_s, poll_ms) = sys.argv[1:]
coord_pid, idle_count, idle_rate = int(coord_pid), int(idle_count), int(idle_rate)
stall_requests = int(stall_requests)
give_up_s, poll_ms = float(give_up_s), int(poll_ms)


sys.path.insert(0, os.environ["HERDER_SCRIPTS"])
from herder_wire import Conn, frame, split  # noqa: E402


def log_time(line):
    ts = datetime.datetime.strptime(line.split()[0].rstrip("Z")[:26], "%Y-%m-%dT%H:%M:%S.%f")
    return ts.replace(tzinfo=datetime.timezone.utc).timestamp()


def rss_kib():
    with open(f"/proc/{coord_pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS"))


def listen_overflows():
    """Kernel-wide count of connections dropped because a listen queue was full."""
    with open("/proc/net/netstat") as f:
        rows = [l.split() for l in f if l.startswith("TcpExt:")]
    return int(dict(zip(rows[0], rows[1]))["ListenOverflows"])


class IdleSockets:
    """`count` connections that never send a byte, opened at `rate` per second: the
    coordinator's listen queue holds 128 connections, and a faster burst overflows it, so that
    SYNs are dropped and connects wait for their retransmission (1 s, 3 s, ...). One thread
    opens them and notes when the coordinator closes each."""

    def __init__(self, addr, count, rate):
        self.addr, self.count, self.rate = addr, count, rate
        self.selector = selectors.DefaultSelector()
        self.connected = {}  # socket -> time its connect completed
        self.connect_secs, self.closed_after, self.failed = [], [], []
        self.lock = threading.Lock()
        self.opened = threading.Event()
        self.stop = False

    def open(self):
        self.overflows0 = listen_overflows()
        self.t0 = time.time()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        self.opened.wait(60)

    def run(self):
        pending, started = {}, 0
        give_up = self.t0 + 30
        while not self.stop:
            while started < min(self.count, (time.time() - self.t0) * self.rate + 1) and time.time() < give_up:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                started += 1
                err = s.connect_ex(split(self.addr))
                if err not in (0, 115):  # 115: EINPROGRESS
                    self.failed.append(os.strerror(err))
                    s.close()
                    continue
                pending[s] = time.time()
                self.selector.register(s, selectors.EVENT_WRITE)
            if not self.opened.is_set() and not pending and (started >= self.count or time.time() >= give_up):
                self.opened_in = time.time() - self.t0
                self.overflows = listen_overflows() - self.overflows0
                self.opened.set()
            for key, events in self.selector.select(timeout=0.001 if started < self.count else 0.05):
                s = key.fileobj
                now = time.time()
                if s in pending:  # the connect finished
                    began = pending.pop(s)
                    self.selector.unregister(s)
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        self.failed.append(os.strerror(err))
                        s.close()
                        continue
                    with self.lock:
                        self.connect_secs.append(now - began)
                        self.connected[s] = now
                    self.selector.register(s, selectors.EVENT_READ)
                    continue
                try:
                    data = s.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if data:
                    continue  # the coordinator never writes to a socket that said nothing
                with self.lock:
                    self.closed_after.append(now - self.connected.pop(s))
                self.selector.unregister(s)
                s.close()
            if time.time() > give_up:  # connects still pending after 30 s
                for s in list(pending):
                    self.failed.append("connect still pending after 30 s")
                    self.selector.unregister(s)
                    s.close()
                    pending.pop(s)

    def open_now(self):
        with self.lock:
            return len(self.connected)

    def wait_all_closed(self, seconds):
        deadline = time.time() + seconds
        while self.open_now() > 0 and time.time() < deadline:
            time.sleep(0.1)

    def close(self):
        self.stop = True
        self.thread.join(timeout=2)
        for s in list(self.connected):
            s.close()

    def report(self):
        with self.lock:
            closed = sorted(self.closed_after)
            connects = sorted(self.connect_secs)
            still = len(self.connected)
        refused = [t for t in closed if t < 1.0]
        later = [t for t in closed if t >= 1.0]
        print(f"    idle sockets: {len(connects)} of {self.count} connected within {self.opened_in:.2f} s at {self.rate}/s"
              f" ({sum(t > 0.5 for t in connects)} took over 0.5 s, SYN retransmitted: the listen queue"
              f" overflowed {self.overflows} times, kernel-wide count)"
              + (f"; {len(self.failed)} failed: {collections.Counter(self.failed).most_common(2)}" if self.failed else ""))
        print(f"    closed by the coordinator: {len(refused)} within 1 s of connecting (refused: port full)"
              + (f"; {len(later)} after {later[0]:.2f}-{later[-1]:.2f} s (median {statistics.median(later):.2f} s)" if later else "")
              + f"; {still} still open at the end")


def cli_workers(label):
    """One `herder workers` call (the CLI needs a client connection of its own)."""
    t0 = time.time()
    p = subprocess.run([herder, "workers", "--json", "--call-timeout-millis", "5000", "--coordinator", client_addr],
                       capture_output=True, text=True, timeout=60)
    ms = (time.time() - t0) * 1000
    out = (p.stdout.strip() or p.stderr.strip()).splitlines()
    detail = ""
    if p.returncode != 0 and out:
        try:
            detail = json.loads(out[0])["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = out[0]
        detail = f": {detail[:160]}"
    print(f"    herder workers (CLI) {label}: exit {p.returncode} after {ms:.0f} ms{detail}")


def worker_view(poll, worker_id):
    _, _, reply = poll.call({"type": "WORKERS"})
    return next((w for w in reply.get("workers", []) if w["id"] == worker_id), None)


def register_worker(poll, worker_id):
    """Starts a worker; returns (reg_ms, seen_ms), None where it did not happen in time."""
    log_path = os.path.join(work, f"{worker_id}.log")
    with open(log_path, "w") as log:
        t_start = time.time()
        proc = subprocess.Popen([herder, "worker", "--id", worker_id, "--capacity", "1",
                                 "--coordinator", worker_addr], stdout=log, stderr=subprocess.STDOUT)
    seen, reg = None, None
    try:
        deadline = t_start + give_up_s
        while time.time() < deadline:
            sent, got, reply = poll.call({"type": "WORKERS"})
            w = next((w for w in reply.get("workers", []) if w["id"] == worker_id), None)
            if w and w["alive"]:
                seen = got
                break
            if proc.poll() is not None:
                print(f"    !! the worker exited with {proc.returncode}")
                break
            time.sleep(max(0.0, poll_ms / 1000 - (time.time() - sent)))
        time.sleep(0.2)  # let both logs be written
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with open(coord_log, errors="replace") as f:
        for line in f:
            if f"Worker registered: workerId={worker_id} " in line:
                reg = log_time(line)
                break
    reg_ms = None if reg is None else (reg - t_start) * 1000
    seen_ms = None if seen is None else (seen - t_start) * 1000
    # What the worker said about its failed attempts.
    reasons, delays, registered_line = collections.Counter(), [], None
    with open(log_path, errors="replace") as f:
        for line in f:
            m = re.search(r"Disconnected \((.*)\); reconnecting in (\d+) ms", line)
            if m and registered_line is None:
                reasons[re.sub(r"\d+", "N", m.group(1))] += 1
                delays.append(int(m.group(2)))
            elif "Registered with coordinator" in line and registered_line is None:
                registered_line = line
            elif re.search(r" (WARN|ERROR) ", line):
                reasons["(warn) " + re.sub(r"^\S+\s+", "", line.strip())[:120]] += 1
    fmt = lambda v: "never" if v is None else f"{v:.0f} ms"
    print(f"    {worker_id}: registered after {fmt(reg_ms)} (coordinator log), seen alive after {fmt(seen_ms)} (WORKERS)"
          + ("" if seen is not None else f"; gave up after {give_up_s:.0f} s"))
    if reasons:
        print(f"    the worker's failed attempts before registering: {sum(reasons.values())}")
        for reason, n in reasons.most_common():
            print(f"        {n:>4} x {reason}")
        if delays:
            print(f"        reconnect delays (ms, jittered backoff): {delays}")
    else:
        print("    the worker logged no failed attempt")
    return reg_ms, seen_ms


def coordinator_warnings(since_line):
    with open(coord_log, errors="replace") as f:
        lines = f.readlines()[since_line:]
    counts = collections.Counter()
    for line in lines:
        if f"workerId=worker-{scenario} reason=connection lost: connection closed" in line:
            continue  # the script stopping its worker
        if re.search(r" (WARN|ERROR) ", line):
            msg = re.sub(r"^\S+\s+", "", line.strip())
            counts[re.sub(r"\b(open|conn|id)=\S+", r"\1=N", msg)[:160]] += 1
    if counts:
        print(f"    coordinator warnings/errors ({sum(counts.values())} lines, its worker's exit left out):")
        for msg, n in counts.most_common(6):
            print(f"        {n:>5} x {msg}")
    else:
        print("    coordinator warnings/errors: none")


def tcp_sockets():
    """(local port, remote port) -> (state, tx_queue, rx_queue) for IPv4 loopback sockets."""
    out = {}
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            parts = line.split()
            local, remote, state, queues = parts[1], parts[2], parts[3], parts[4]
            tx, rx = (int(x, 16) for x in queues.split(":"))
            out[(int(local.split(":")[1], 16), int(remote.split(":")[1], 16))] = (state, tx, rx)
    return out


def stalled_client(poll, worker_id):
    """Scenario d: a pipelining client that never reads, while a worker registers."""
    _, client_port = split(client_addr)
    rss0 = rss_kib()
    s = socket.create_connection(split(client_addr), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setblocking(True)
    my_port = s.getsockname()[1]
    job = str(uuid.uuid4()).encode()
    payload = b"".join(
        struct.pack(">I", len(b)) + b for b in
        (b'{"type":"STATUS","request_id":%d,"job_id":"%s"}' % (i, job) for i in range(1, stall_requests + 1)))
    sent = {"bytes": 0, "error": None, "done": None}

    def send():
        try:
            view = memoryview(payload)
            while sent["bytes"] < len(payload):
                sent["bytes"] += s.send(view[sent["bytes"]:sent["bytes"] + 65536])
        except OSError as error:
            sent["error"] = str(error)
        sent["done"] = time.time()

    t0 = time.time()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    sender.join(timeout=20)
    if sent["done"] is None:
        print(f"    !! the STATUS burst is still being sent after 20 s ({sent['bytes']} of {len(payload)} bytes): the coordinator stopped reading")
    else:
        print(f"    non-reading client: {stall_requests} STATUS ({len(payload)} bytes) sent in {sent['done'] - t0:.2f} s"
              + (f"; send failed: {sent['error']}" if sent["error"] else ""))
    time.sleep(1.0)  # let the replies pile up
    state = tcp_sockets()
    mine, theirs = state.get((my_port, client_port)), state.get((client_port, my_port))
    if mine and theirs:
        print(f"    1 s later: {mine[2]} reply bytes unread in the client's receive queue, "
              f"{theirs[1]} in the coordinator's send queue; coordinator RSS {rss0} -> {rss_kib()} KiB")
    cli_workers("while the client stalls")
    result = register_worker(poll, worker_id)
    _, _, reply = poll.call({"type": "WORKERS"})
    print(f"    a WORKERS call on another connection while stalled: answered ({reply['type']})")
    # When does the coordinator give up on the stalled connection?
    closed = None
    deadline = time.time() + 60
    while time.time() < deadline:
        theirs = tcp_sockets().get((client_port, my_port))
        if theirs is None or theirs[0] != "01":  # 01: ESTABLISHED
            closed = time.time()
            break
        time.sleep(0.1)
    if closed is None:
        print("    !! the coordinator still holds the stalled connection 60 s after the burst")
    else:
        since = closed - (sent["done"] or t0)
        print(f"    the coordinator closed the stalled connection {since:.1f} s after the burst was sent "
              f"(state {theirs[0] if theirs else 'gone'}); coordinator RSS now {rss_kib()} KiB")
    # Drain what was delivered before the close.
    got, replies, buf = 0, 0, bytearray()
    s.settimeout(2)
    try:
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
            buf += chunk
            off = 0
            while len(buf) - off >= 4:
                n = int.from_bytes(buf[off:off + 4], "big")
                if len(buf) - off < 4 + n:
                    break
                off += 4 + n
                replies += 1
            del buf[:off]
    except OSError as error:
        print(f"    draining the stalled connection ended with: {error}")
    s.close()
    print(f"    the client then read {replies} whole replies ({got} bytes) of {stall_requests} requests before EOF")
    return result


with open(coord_log, errors="replace") as f:
    log_start = len(f.readlines())
poll = Conn(client_addr)
poll.call({"type": "WORKERS"})  # the poll connection is established before any load
worker_id = f"worker-{scenario}"
if scenario == "a":
    cli_workers("on an idle coordinator")
    result = register_worker(poll, worker_id)
elif scenario in ("b", "c"):
    idle = IdleSockets(worker_addr if scenario == "b" else client_addr, idle_count, idle_rate)
    rss0 = rss_kib()
    idle.open()
    time.sleep(0.3)
    print(f"    {idle.open_now()} idle sockets open 0.3 s after the last connect; coordinator RSS {rss0} -> {rss_kib()} KiB")
    try:
        cli_workers("with the idle sockets open")
        result = register_worker(poll, worker_id)
        idle.wait_all_closed(15)
        idle.report()
        if scenario == "c":
            cli_workers("after the idle sockets were closed")
    finally:
        idle.close()
elif scenario == "d":
    result = stalled_client(poll, worker_id)
coordinator_warnings(log_start)
with open(os.path.join(work, "results"), "a") as f:
    f.write(json.dumps({"scenario": scenario, "reg_ms": result[0], "seen_ms": result[1]}) + "\n")
PY

titles=(
    [0]=""
    [1]="(a) baseline, idle coordinator"
    [2]="(b) $IDLE_SOCKETS idle sockets on the worker port"
    [3]="(c) $IDLE_SOCKETS idle sockets on the client port"
    [4]="(d) a client that never reads, $STALL_REQUESTS STATUS queued"
)
index() { case "$1" in a) echo 1 ;; b) echo 2 ;; c) echo 3 ;; d) echo 4 ;; *) echo 0 ;; esac; }

status=0
for scenario in $SCENARIOS; do
    i=$(index "$scenario")
    [ "$i" != 0 ] || { echo "!! unknown scenario $scenario (expected a, b, c or d)" >&2; exit 2; }
    echo
    echo "==> ${titles[$i]}"
    rm -rf "$work/data"
    start_bg "$work/coordinator-$scenario.log" coordinator --data-dir "$work/data" \
        --worker-port "$WORKER_ADDR" --client-port "$CLIENT_ADDR"
    coordinator_pid=$LAST_PID
    wait_for 15 "the coordinator" "$HERDER_BIN" workers --coordinator "$CLIENT_ADDR"
    python3 "$work/scenario.py" "$scenario" "$HERDER_BIN" "$WORKER_ADDR" "$CLIENT_ADDR" \
        "$coordinator_pid" "$work/coordinator-$scenario.log" "$work" "$IDLE_SOCKETS" "$IDLE_RATE" "$STALL_REQUESTS" \
        "$GIVE_UP_S" "$POLL_MS" || { echo "!! scenario $scenario failed" >&2; status=1; }
    kill "$coordinator_pid"
    wait "$coordinator_pid" 2>/dev/null || true
done

echo
echo "==> Registration delay of a fresh worker (ms from its start)"
printf '%-60s %10s %10s\n' scenario reg_ms seen_ms
python3 - "$work/results" "${titles[@]:1}" <<'PY'
import json, sys
titles = dict(zip("abcd", sys.argv[2:]))
fmt = lambda v: "never" if v is None else f"{v:.0f}"
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except FileNotFoundError:
    rows = []
for r in rows:
    print(f"{titles[r['scenario']]:<60} {fmt(r['reg_ms']):>10} {fmt(r['seen_ms']):>10}")
PY
exit "$status"
