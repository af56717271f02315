#!/usr/bin/env bash
# Compiles each kernel (src/kernels/*/launch.cu) for sm_90a as the build does and fails where
# ptxas serialises wgmma (its C7510/C7512 notes, "wgmma.mma_async instructions are serialized
# due to ..."): every product then waits for the one before, and a role walk's step loses the
# overlap it is built on. ptxas does it without an error, for instance when a change leaves a
# warpgroup role short of registers (docs/perf-notes.md: a restructuring of walk_a_bwd's column
# roles that did so serialised all 137 of the kernel's wgmma). Also prints each kernel's
# registers and spills.
#   tests/ptxas/check_wgmma.sh <nvcc> <repository root>
set -uo pipefail
nvcc=$1
root=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
for src in "$root"/src/kernels/*/launch.cu; do
  stage=$(basename "$(dirname "$src")")
  log="$out/$stage.log"
  if ! "$nvcc" -cubin -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++17 \
       -O3 -Xptxas -v -I "$root/src" -I "$root/include" -o "$out/$stage.cubin" "$src" >"$log" 2>&1
  then
    echo "$stage: nvcc failed"; cat "$log"; status=1; continue
  fi
  grep -E "bytes stack frame|Used [0-9]+ registers" "$log" | sed "s/^/$stage: /"
  if grep -E "C751[02]|wgmma.mma_async instructions are serialized" "$log"; then
    echo "$stage: FAIL: ptxas serialises wgmma"; status=1
  fi
done
[ $status -eq 0 ] && echo "no kernel has serialised wgmma"
exit $status
