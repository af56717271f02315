#!/usr/bin/env bash
# On the GPU machine, after tools/device_check.sh has built cake there (build/device): the C++ GPU
# check of main and of each patch of docs/next applied on top, timed side by side in one call.
# Each patch is applied in place (git apply), the check rebuilt incrementally (only what the patch
# touches recompiles: ~10-30 s on 16 cores), copied to /tmp/variants/next_<name>, and the patch
# taken back out, so the tree ends as it began. Then ROUNDS rounds (default 2), palindromic
# (a b c c b a ...) so that drift shows as a difference between the halves, of
# `cake_cuda_check --time --workload W` for each of WORKLOADS (default kda-P4-16).
#   PATCHES="kkt-diagonal-tc intra-tc" WORKLOADS="kda-P4-16 A" bash tools/time_patches.sh
# CHECK=1 first runs each variant's accuracy cases (`--no-time`: kkt_solve's and the fused
# backward's checks, GDN's and KDA's op cases against FP64, every mode bitwise; ~1 minute each).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -x build/device/cake_cuda_check ] || { echo "time_patches: build/device has no check"; exit 1; }
mkdir -p /tmp/variants
cp build/device/cake_cuda_check /tmp/variants/main
names=(main)
for p in ${PATCHES:-}; do
  patch="docs/next/$p.patch"
  if ! git apply "$patch"; then echo "== next_$p: does not apply"; continue; fi
  if cmake --build build/device -j 16 --target cake_cuda_check > "/tmp/variants/$p.build.log" 2>&1
  then
    cp build/device/cake_cuda_check "/tmp/variants/next_$p" && names+=("next_$p")
  else
    echo "== next_$p: build failed"; tail -20 "/tmp/variants/$p.build.log"
  fi
  git apply -R "$patch"
done
cmake --build build/device -j 16 --target cake_cuda_check > /dev/null 2>&1  # main again
if [ "${CHECK:-0}" = 1 ]; then
  for n in "${names[@]}"; do
    echo "== $n: check"
    timeout 180 "/tmp/variants/$n" --no-time 2>&1 | grep -E "PASS|FAIL|ERROR|failed"
  done
fi
reversed=()
for ((i = ${#names[@]} - 1; i >= 0; --i)); do reversed+=("${names[i]}"); done
for ((r = 0; r < ${ROUNDS:-2}; ++r)); do
  if ((r % 2 == 0)); then order=("${names[@]}"); else order=("${reversed[@]}"); fi
  for n in "${order[@]}"; do
    for w in ${WORKLOADS:-kda-P4-16}; do
      timeout 150 "/tmp/variants/$n" --time --workload "$w" 2>&1 |
        grep -E "^workload $w .*mode" | sed "s/^workload $w ([^)]*)/$n $w/"
      status=${PIPESTATUS[0]}
      [ "$status" = 0 ] || echo "== $n $w: exited with status $status"
    done
  done
done
