#!/usr/bin/env bash
# Runs `herder worker` with the given flags (building first if needed).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_built
exec "$HERDER_BIN" worker "$@"
