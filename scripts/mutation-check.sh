#!/usr/bin/env bash
# Shows the simulator catches deliberately planted bugs. Each patch in sim/mutations is applied to
# a scratch copy of the committed workspace (never to the product), herder-sim is built there, and
# seeds are run (with the determinism check) until one fails. Prints, per planted bug, the first
# seed that caught it.
#   SEEDS=2000 ./scripts/mutation-check.sh
#   ONLY='^1[2-8]' ./scripts/mutation-check.sh     # only the patches whose name matches
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
SEEDS="${SEEDS:-2000}"
ONLY="${ONLY:-}"
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
    (cd "$scratch/ws" && patch -p1 --quiet <"$root/$patch")
    (cd "$scratch/ws" && cargo build --release --quiet -p herder-sim)
    # Swarm seeds (groups of 1, 3 and 5), each replayed twice to check determinism too; then,
    # if nothing failed, the three-coordinator standard scenario with the consensus faults.
    out=$("$CARGO_TARGET_DIR/release/herder-sim" run --seeds "0..$SEEDS" --strict --check-determinism 2>&1 || true)
    if ! grep -qE "^FAIL seed|panicked" <<<"$out"; then
        out=$("$CARGO_TARGET_DIR/release/herder-sim" run --seeds "0..$SEEDS" --standard-group --strict 2>&1 || true)
    fi
    first=$(grep -m1 -oE "^FAIL seed [0-9]+" <<<"$out" | awk '{print $3}' || true)
    if [ -z "$first" ] && grep -q "panicked" <<<"$out"; then
        # A planted bug that trips one of core's own assertions stops the run with a panic.
        caught=$((caught + 1))
        printf '%-42s caught (a core assertion panicked): %s\n' "$name" "$(grep -m1 -A1 panicked <<<"$out" | tail -1 | cut -c1-110)"
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
