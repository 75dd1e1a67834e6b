#!/usr/bin/env bash
# End-to-end test of the web dashboard: starts `herder dev` with its HTTP API on free loopback
# ports, drives the dashboard in headless Chromium (tests/browser/dashboard.mjs), then checks
# that /metrics parses as Prometheus text (scripts/check-metrics.py).
#
# Installs what a fresh Debian machine lacks (Chromium, Node.js, the test's node modules).
# Set HERDER_BIN to an existing herder binary to skip the release build.
# The screenshot is saved to target/browser/dashboard.png.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BROWSER_DIR="$ROOT/tests/browser"
OUT_DIR="$ROOT/target/browser"
SCREENSHOT="$OUT_DIR/dashboard.png"
CHROMIUM=/usr/bin/chromium

say() { echo "==> $*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "!! need root to run: $*" >&2
        return 1
    fi
}

APT_UPDATED=0
apt_install() {
    if [ "$APT_UPDATED" -eq 0 ]; then
        as_root apt-get update -qq
        APT_UPDATED=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# ---- Prerequisites -------------------------------------------------------------------------

if [ ! -x "$CHROMIUM" ]; then
    say "Installing chromium (apt-get)"
    apt_install chromium
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    say "Installing nodejs and npm (apt-get)"
    apt_install nodejs npm
fi
for tool in curl python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        say "Installing $tool (apt-get)"
        apt_install "$tool"
    fi
done

if [ ! -d "$BROWSER_DIR/node_modules/playwright-core" ] ||
    [ "$BROWSER_DIR/package-lock.json" -nt "$BROWSER_DIR/node_modules/.package-lock.json" ]; then
    say "Installing the browser test's node modules (npm ci)"
    (cd "$BROWSER_DIR" && npm ci --no-audit --no-fund)
fi

if [ -n "${HERDER_BIN:-}" ]; then
    if [ ! -x "$HERDER_BIN" ]; then
        echo "!! HERDER_BIN=$HERDER_BIN is not an executable file" >&2
        exit 1
    fi
    say "Using $HERDER_BIN"
else
    say "Building herder (cargo build --release -p herder --bin herder)"
    (cd "$ROOT" && cargo build --release -p herder --bin herder)
    HERDER_BIN="$ROOT/target/release/herder"
fi

# ---- Start herder dev ----------------------------------------------------------------------

WORK=$(mktemp -d "${TMPDIR:-/tmp}/herder-browser.XXXXXX")
DEV_LOG="$WORK/dev.log"
DEV_PID=""
mkdir -p "$OUT_DIR"

stop_dev() {
    [ -n "$DEV_PID" ] || return 0
    if kill -0 "$DEV_PID" 2>/dev/null; then
        kill -TERM "$DEV_PID" 2>/dev/null || true
        # The first SIGTERM drains; give it a moment, then a second one stops at once.
        for _ in $(seq 1 50); do
            kill -0 "$DEV_PID" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$DEV_PID" 2>/dev/null; then
            kill -TERM "$DEV_PID" 2>/dev/null || true
            sleep 1
        fi
        if kill -0 "$DEV_PID" 2>/dev/null; then
            kill -KILL "$DEV_PID" 2>/dev/null || true
        fi
    fi
    wait "$DEV_PID" 2>/dev/null || true
    DEV_PID=""
}

on_exit() {
    local rc=$?
    stop_dev
    if [ "$rc" -ne 0 ]; then
        echo "!! browser test FAILED (exit $rc)" >&2
        if [ -f "$DEV_LOG" ]; then
            cp "$DEV_LOG" "$OUT_DIR/dev.log" 2>/dev/null || true
            echo "---- last 60 lines of the herder dev log ($OUT_DIR/dev.log) ----" >&2
            tail -n 60 "$DEV_LOG" >&2 || true
            echo "----" >&2
        fi
    fi
    rm -rf "$WORK"
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Four distinct free loopback ports, held open together while they are chosen.
read -r P_WORKER P_CLIENT P_PEER P_HTTP < <(python3 - <<'EOF'
import socket
socks = []
for _ in range(4):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
)
HTTP="http://127.0.0.1:$P_HTTP"

say "Starting herder dev (worker $P_WORKER, client $P_CLIENT, peer $P_PEER, http $P_HTTP)"
"$HERDER_BIN" dev --data-dir "$WORK/data" \
    --worker-port "127.0.0.1:$P_WORKER" \
    --client-port "127.0.0.1:$P_CLIENT" \
    --peer-port "127.0.0.1:$P_PEER" \
    --http-port "127.0.0.1:$P_HTTP" \
    --drain-timeout 2s \
    >"$DEV_LOG" 2>&1 &
DEV_PID=$!

deadline=$((SECONDS + 60))
until curl -sf -o /dev/null --max-time 2 "$HTTP/api/v1/cluster"; do
    if ! kill -0 "$DEV_PID" 2>/dev/null; then
        echo "!! herder dev exited before its HTTP API answered" >&2
        exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "!! timed out after 60 s waiting for $HTTP/api/v1/cluster" >&2
        exit 1
    fi
    sleep 0.3
done
say "HTTP API answers at $HTTP"

# ---- Tests ---------------------------------------------------------------------------------

rm -f "$SCREENSHOT" "${SCREENSHOT%.png}-failure.png"
say "Running the dashboard test"
HERDER_HTTP="$HTTP" SCREENSHOT="$SCREENSHOT" CHROMIUM="$CHROMIUM" node "$BROWSER_DIR/dashboard.mjs"

say "Checking $HTTP/metrics"
python3 "$ROOT/scripts/check-metrics.py" "$HTTP/metrics"

stop_dev

# ---- A coordinator that checks tokens ------------------------------------------------------

TOKEN=$(head -c 32 /dev/urandom | base64 | tr -d '\n')
printf 'dash reader %s\n' "$TOKEN" >"$WORK/tokens"
say "Starting a coordinator that checks tokens (http $P_HTTP)"
"$HERDER_BIN" coordinator --data-dir "$WORK/tokens-data" \
    --worker-port "127.0.0.1:$P_WORKER" \
    --client-port "127.0.0.1:$P_CLIENT" \
    --http-port "127.0.0.1:$P_HTTP" \
    --client-tokens-file "$WORK/tokens" \
    >"$DEV_LOG" 2>&1 &
DEV_PID=$!
deadline=$((SECONDS + 60))
until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$HTTP/api/v1/cluster")" = 401 ]; do
    if ! kill -0 "$DEV_PID" 2>/dev/null; then
        echo "!! the coordinator exited before its HTTP API answered" >&2
        exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "!! timed out after 60 s waiting for $HTTP/api/v1/cluster to ask for a token" >&2
        exit 1
    fi
    sleep 0.3
done
say "Running the token test"
HERDER_HTTP="$HTTP" HERDER_TOKEN="$TOKEN" SCREENSHOT="$OUT_DIR/token.png" CHROMIUM="$CHROMIUM" \
    node "$BROWSER_DIR/token.mjs"

say "Browser test passed; screenshots: $SCREENSHOT, $OUT_DIR/token.png"
