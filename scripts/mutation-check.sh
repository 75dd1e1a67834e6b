#!/usr/bin/env bash
# Shows the simulator catches deliberately planted bugs. Each patch in sim/mutations is applied to
# a scratch copy of the committed workspace (never to the product), herder-sim is built there, and
# seeds are run (with the determinism check) until one fails. Prints, per planted bug, the first
# seed that caught it.
#   SEEDS=2000 ./scripts/mutation-check.sh
#   ONLY='^1[2-8]' ./scripts/mutation-check.sh     # only the patches whose name matches
# A planted bug that makes a seed run away or panic is caught too: the simulator reports that
# seed as `FAIL seed N: livelock: ...` or `FAIL seed N: panic at ...` and goes on. Its budgets
# end every seed; RUN_TIMEOUT (default 20m) bounds each run in case they ever do not, and a run
# that hits it is reported as NOT CAUGHT (timeout), as a hang is a fault of the simulator.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
SEEDS="${SEEDS:-2000}"
ONLY="${ONLY:-}"
RUN_TIMEOUT="${RUN_TIMEOUT:-20m}"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/herder-mutants.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
# One target directory for every mutant, so dependencies are built once.
export CARGO_TARGET_DIR="${MUTANT_TARGET_DIR:-${TMPDIR:-/tmp}/herder-mutants-target}"

caught=0
total=0
for patch in sim/mutations/*.patch; do
    name=$(basename "$patch" .patch)
    if [ -n "$ONLY" ] && ! grep -qE "$ONLY" <<<"$name"; then
        continue
    fi
    total=$((total + 1))
    rm -rf "$scratch/ws"
    mkdir -p "$scratch/ws"
    git archive HEAD | tar -x -C "$scratch/ws"
    if ! (cd "$scratch/ws" && patch -p1 --quiet <"$root/$patch" >/dev/null); then
        printf '%-42s NOT CAUGHT: the patch no longer applies to the code it plants a bug in\n' "$name"
        continue
    fi
    (cd "$scratch/ws" && cargo build --release --quiet -p herder-sim)
    # Swarm seeds (groups of 1, 3 and 5), each replayed twice to check determinism too; then,
    # if nothing failed, the three-coordinator standard scenario with the consensus faults.
    sim="$CARGO_TARGET_DIR/release/herder-sim"
    rc=0
    out=$(timeout "$RUN_TIMEOUT" "$sim" run --seeds "0..$SEEDS" --strict --check-determinism 2>&1) || rc=$?
    if [ "$rc" -ne 124 ] && ! grep -qE "^FAIL seed|panicked" <<<"$out"; then
        rc=0
        out=$(timeout "$RUN_TIMEOUT" "$sim" run --seeds "0..$SEEDS" --standard-group --strict 2>&1) || rc=$?
    fi
    if [ "$rc" -eq 124 ]; then
        printf '%-42s NOT CAUGHT (timeout: a run took over %s)\n' "$name" "$RUN_TIMEOUT"
        continue
    fi
    # Every failure is a catch: a broken invariant, a livelock (a seed past one of its budgets)
    # or a panic inside a seed (`FAIL seed N: panic at FILE:LINE: ...`).
    first=$(grep -m1 -oE "^FAIL seed [0-9]+" <<<"$out" | awk '{print $3}' || true)
    if [ -z "$first" ] && grep -q "panicked" <<<"$out"; then
        # A panic outside any seed stops the whole run; the planted bug still showed.
        caught=$((caught + 1))
        printf '%-42s caught (a panic stopped the run): %s\n' "$name" "$(grep -m1 -A1 panicked <<<"$out" | tail -1 | cut -c1-110)"
        continue
    fi
    if [ -n "$first" ]; then
        caught=$((caught + 1))
        why=$(grep -m1 -E "^FAIL seed" <<<"$out" | cut -c1-150)
        printf '%-42s caught at seed %-5s %s\n' "$name" "$first" "${why#FAIL seed $first: }"
    else
        printf '%-42s NOT CAUGHT in seeds 0..%s\n' "$name" "$SEEDS"
    fi
done
echo "caught $caught of $total planted bugs"
[ "$caught" -eq "$total" ]
