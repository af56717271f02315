#!/usr/bin/env bash
# On the GPU machine, after tools/device_check.sh has built cake there (build/device): the C++ GPU
# check of main and of each patch of docs/next applied on top, timed side by side in one call.
# Each patch is applied in place (git apply), the check rebuilt incrementally (only what the patch
# touches recompiles: ~10-30 s on 16 cores), copied to /tmp/patch_variants/next_<name>, and the
# patch taken back out, so the tree ends as it began. tools/time_variants.sh then times them:
# ROUNDS rounds (default 2), palindromic (a b c c b a ...) so that drift shows as a difference
# between the halves, of `cake_cuda_check --time --workload W` for each of WORKLOADS (default
# kda-P4-16).
#   PATCHES="kkt-diagonal-tc intra-tc kkt-diagonal-tc+intra-tc" WORKLOADS="kda-P4-16 A" \
#     bash tools/time_patches.sh
# CHECK=1 first runs each variant's accuracy cases (`--no-time`: kkt_solve's and the fused
# backward's checks, GDN's and KDA's op cases against FP64, every mode bitwise; ~1 minute each).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -x build/device/cake_cuda_check ] || { echo "time_patches: build/device has no check"; exit 1; }
# Every named patch must exist: a missing one would otherwise be timed as main under its name.
for p in ${PATCHES:-}; do
  IFS=+ read -ra stack <<< "$p"
  for part in "${stack[@]}"; do
    [ -f "docs/next/$part.patch" ] || { echo "time_patches: no docs/next/$part.patch"; exit 1; }
  done
done
out=/tmp/patch_variants
rm -rf "$out" && mkdir -p "$out"
# main as the tree stands now (a no-op unless something changed it since the last build)
cmake --build build/device -j 16 --target cake_cuda_check > /tmp/main.build.log 2>&1 ||
  { echo "time_patches: main does not build"; tail -20 /tmp/main.build.log; exit 1; }
cp build/device/cake_cuda_check "$out/main"
names=(main)
# A staged patch is one diff or several commits (`git format-patch --stdout`). Its commits are
# applied one by one and taken back out in reverse order: `git apply -R` of the whole file would
# reverse the commit that creates a file before the later ones that change it, leave the file
# behind, and build it into every variant after.
parts_of() {  # the patch's commits as files, in order
  local dir=/tmp/patch_parts/$1
  rm -rf "$dir" && mkdir -p "$dir"
  if head -1 "docs/next/$1.patch" | grep -q '^From '; then
    git mailsplit -o"$dir" "docs/next/$1.patch" > /dev/null
  else
    cp "docs/next/$1.patch" "$dir/0001"
  fi
  ls "$dir"/* | sort
}
apply_staged() {  # apply_staged NAME: all of its commits, or none
  local applied_parts=() f i
  for f in $(parts_of "$1"); do
    if ! git apply "$f"; then
      for ((i = ${#applied_parts[@]} - 1; i >= 0; --i)); do git apply -R "${applied_parts[i]}"; done
      return 1
    fi
    applied_parts+=("$f")
  done
}
unapply_staged() {  # unapply_staged NAME: its commits taken back out, last first
  local f
  for f in $(parts_of "$1" | sort -r); do git apply -R "$f"; done
}
# A name may stack patches with "+" ("a+b": b applied on top of a), for patches written on top of
# another one, or to time the merge of several.
for p in ${PATCHES:-}; do
  IFS=+ read -ra stack <<< "$p"
  applied=()
  for part in "${stack[@]}"; do
    apply_staged "$part" || break
    applied=("$part" "${applied[@]}")
  done
  if [ ${#applied[@]} != ${#stack[@]} ]; then
    echo "== next_$p: does not apply"
  elif cmake --build build/device -j 16 --target cake_cuda_check > "/tmp/$p.build.log" 2>&1; then
    cp build/device/cake_cuda_check "$out/next_$p" && names+=("next_$p")
  else
    echo "== next_$p: build failed"; tail -20 "/tmp/$p.build.log"
  fi
  for part in "${applied[@]}"; do unapply_staged "$part"; done
done
cmake --build build/device -j 16 --target cake_cuda_check > /dev/null 2>&1  # main again
VARIANT_DIR=$out VARIANTS="${names[*]}" FULL_CHECK="${CHECK:-0}" STAGE_CHECKS=0 \
  WORKLOADS="${WORKLOADS:-kda-P4-16}" ROUNDS="${ROUNDS:-2}" bash tools/time_variants.sh
