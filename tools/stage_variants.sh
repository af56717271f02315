#!/usr/bin/env bash
# Builds the C++ GPU check (cake_cuda_check) of several git refs into .devpkg/variants/<name>.xz,
# for tools/time_variants.sh to time them side by side in one device call (each variant is a
# branch that changes a kernel; the check's --walk-bwd stage check and timing need no Python).
#   bash tools/stage_variants.sh main next/bwd-8warps ...     (after tools/stage_device.sh)
# A ref may also be a patch of docs/next/ (git format-patch): it is applied (git am) on a branch
# staged/<its name> made afresh from the checked-out ref, and staged as variant next_<its name>, e.g.
#   bash tools/stage_variants.sh main docs/next/fwd-early-tiles.patch
# Uses build/py312 (configured by tools/stage_device.sh) and restores the checked-out ref.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "commit first"; exit 1; }
back=$(git rev-parse --abbrev-ref HEAD)
# On a detached HEAD, the commit itself (else each patch would apply on top of the last one).
[ "$back" != HEAD ] || back=$(git rev-parse HEAD)
trap 'git checkout -q "$back"' EXIT  # also when stopped midway (a failed build, a closed pipe)
mkdir -p .devpkg/variants
for ref in "$@"; do
  name=$(echo "$ref" | tr '/' '_')
  if [[ "$ref" == *.patch ]]; then
    # applied on a branch of its own namespace, staged/<name>, made afresh each time, so that no
    # branch of the developer's (next/<name> included) is reset; the variant is still next_<name>
    patch="$(realpath "$ref")"
    name="next_$(basename "$ref" .patch)"
    ref="staged/$(basename "$ref" .patch)"
    git checkout -q -B "$ref" "$back"
    git am -q "$patch" || { git am --abort; echo "$patch does not apply to $back"; exit 1; }
  fi
  git checkout -q "$ref"
  cmake --build build/py312 -j 8 --target cake_cuda_check >/dev/null
  strip --strip-unneeded -o ".devpkg/variants/$name" build/py312/cake_cuda_check
  xz -9 -f ".devpkg/variants/$name"
  echo "$name: $(git rev-parse --short HEAD)" | tee -a .devpkg/variants/REFS
done
du -sh .devpkg/variants
