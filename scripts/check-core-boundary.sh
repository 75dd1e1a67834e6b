#!/usr/bin/env bash
# Enforces the sans-IO boundary described in docs/ARCHITECTURE.md: herder-core depends on no
# async runtime, socket or database crate, and its source reaches no clock, thread, socket, file,
# environment or OS randomness.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
deps=$(cargo tree -p herder-core -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u)
for forbidden in tokio mio socket2 rusqlite libsqlite3-sys getrandom; do
    if grep -qx "$forbidden" <<<"$deps"; then
        echo "herder-core must not depend on $forbidden (see docs/ARCHITECTURE.md):" >&2
        cargo tree -p herder-core -e normal -i "$forbidden" >&2 || true
        status=1
    fi
done

# Source-level check: lines that reach the OS, ignoring comment lines.
pattern='SystemTime::now|Instant::now|thread_rng|OsRng|from_entropy|std::thread|std::net|std::fs|std::env|std::process|tokio::'
if hits=$(grep -rnE "$pattern" core/src | grep -vE '^[^:]+:[0-9]+:\s*//'); then
    echo "herder-core source reaches the OS (see docs/ARCHITECTURE.md):" >&2
    echo "$hits" >&2
    status=1
fi

if [ "$status" -eq 0 ]; then
    echo "herder-core: no I/O dependencies ($(wc -l <<<"$deps") crates in its tree), no OS calls in core/src"
fi
exit "$status"
