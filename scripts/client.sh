#!/usr/bin/env bash
# Runs a client verb: submit, status, wait, cancel, list, workers, cluster, bench.
#   ./scripts/client.sh submit sleep --milliseconds 30000
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built
exec "$HERDER_BIN" "$@"
