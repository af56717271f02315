#!/usr/bin/env bash
# On the GPU machine: the variants staged by tools/stage_variants.sh (or, with VARIANT_DIR, the
# checks built there by tools/time_patches.sh), side by side. Each one's
# checks against FP64 (cake_cuda_check --no-time: the forward and op cases; --walk-bwd --no-time:
# the backward's stages), then ROUNDS rounds
# (default 2) that time every variant in turn at workload A, or at each of WORKLOADS (e.g. "A G
# M": the check's --time --workload; a ref older than that option prints A's lines only)
# (forward and backward in recompute and saved modes, no states, and in recompute mode with the
# q/k L2 norm;
# then --walk-bwd --time: the backward's stages
# with states, dh0 wanted), in palindromic order (a b c c b a ...), so drift shows as
# a difference between the halves. Every run has a time limit, so that a variant that hangs on
# the GPU (a wait that never completes) costs minutes, not the call.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/variants
# VARIANTS (names as in REFS, e.g. "main next_split-group") picks a subset: one device call runs
# for at most 10 minutes. Measured on 2026-11-29: 4 variants with both checks each and ROUNDS=1
# finished within 290 s (under `timeout 290`); before the full check was added, 9 variants (stage
# checks, then 1.5 of the 2 rounds) filled a call.
# ended NAME WHAT STATUS: says so where a run did not end well (a hang cut by its timeout, a
# crash), whose PASS lines would otherwise just be missing.
ended() {
  if [ "$3" = 124 ]; then echo "== $1: $2 TIMED OUT"
  elif [ "$3" -gt 128 ]; then echo "== $1: $2 CRASHED (signal $(($3 - 128)))"
  elif [ "$3" != 0 ]; then echo "== $1: $2 exited with status $3"; fi
}
wanted() { [ -z "${VARIANTS:-}" ] || [[ " $VARIANTS " == *" $1 "* ]]; }
names=()
if [ -n "${VARIANT_DIR:-}" ]; then
  # checks built on this machine (tools/time_patches.sh), one executable per variant
  bin=$VARIANT_DIR
  for f in "$bin"/*; do
    n=$(basename "$f")
    if [ -f "$f" ] && [ -x "$f" ] && wanted "$n"; then names+=("$n"); fi
  done
else
  bin=/tmp/variants
  for f in .devpkg/variants/*.xz; do
    n=$(basename "$f" .xz)
    wanted "$n" || continue
    python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
      "$f" "$bin/$n" && chmod +x "$bin/$n" && names+=("$n")
  done
  cat .devpkg/variants/REFS
fi
# FULL_CHECK=0 skips the forward and op cases (about a minute per variant) where the variants
# change only the backward's stages, whose own check still runs. STAGE_CHECKS=0 skips GDN's
# backward stage check and its timing (variants of other stages, e.g. KDA's).
for n in "${names[@]}"; do
  if [ "${FULL_CHECK:-1}" != 0 ]; then
    echo "== $n: check (forward and op cases)"
    timeout 180 "$bin/$n" --no-time 2>&1 | grep -E "PASS|FAIL|ERROR|failed"
    ended "$n" "check" "${PIPESTATUS[0]}"
  fi
  if [ "${STAGE_CHECKS:-1}" != 0 ]; then
    echo "== $n: the backward's stage check"
    timeout 120 "$bin/$n" --walk-bwd --no-time 2>&1 | grep -E "PASS|FAIL|ERROR"
    ended "$n" "stage check" "${PIPESTATUS[0]}"
  fi
done
reversed=()
for ((i = ${#names[@]} - 1; i >= 0; --i)); do reversed+=("${names[i]}"); done
for ((r = 0; r < ${ROUNDS:-2}; ++r)); do
  if ((r % 2 == 0)); then order=("${names[@]}"); else order=("${reversed[@]}"); fi
  for n in "${order[@]}"; do
    # MODES=0 skips the modes' forward and backward (about 50 s per variant and round) where the
    # variants change only the backward's stages, timed below
    if [ "${MODES:-1}" != 0 ]; then
      for w in ${WORKLOADS:-A}; do
        timeout 150 "$bin/$n" --time --workload "$w" 2>&1 |
          grep -E "^workload $w .*mode" | sed "s/^workload $w ([^)]*)/$n $w/"
        ended "$n" "timing at $w" "${PIPESTATUS[0]}"
      done
    fi
    # the backward stages alone, with states (dh0 wanted)
    if [ "${STAGE_CHECKS:-1}" != 0 ]; then
      echo "$n $(timeout 120 "$bin/$n" --walk-bwd --time 2>&1 | tail -1)"
    fi
  done
done
