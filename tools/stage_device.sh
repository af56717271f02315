#!/usr/bin/env bash
# Stages what a device run needs without building there: the package `cake` with the CUDA module
# built here for the GPU machine's Python 3.12 (build/py312, a CAKE_CUDA=ON build against that
# Python), and the C++ GPU check. The device tool carries .devpkg (ignored by git); there:
# PYTHONPATH=.devpkg (tools/device_check.sh does it). The first run configures build/py312 through
# scikit-build-core with the pinned nanobind (network needed once; PY312 names the interpreter,
# default python3.12); later runs rebuild it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/py312/build.ninja ]; then
  venv=build/py312-venv
  "${PY312:-python3.12}" -m venv "$venv"
  "$venv/bin/pip" install -q nanobind==3.1.0 scikit-build-core==1.1.2 ninja cmake
  PATH="$PWD/$venv/bin:$PATH" "$venv/bin/pip" install -q --no-build-isolation --no-deps \
    --target build/py312-site -Ccmake.define.CAKE_CUDA=ON -Cbuild-dir=build/py312 .
fi
cmake --build build/py312 -j 8 >/dev/null
rm -rf .devpkg && mkdir -p .devpkg
cp -r python/cake .devpkg/cake
cp build/py312/_C.abi3.so .devpkg/cake/
cp build/py312/cake_cuda_check .devpkg/
find .devpkg -name __pycache__ -prune -exec rm -rf {} +
git rev-parse --short HEAD > .devpkg/REF  # the commit the module was built from (device_check.sh)
# The device tool carries at most 64 MiB, and the baselines' wheels take ~62 MB of it: the binaries
# travel without symbols, the check program xz-compressed (tools/device_check.sh unpacks it).
strip --strip-unneeded .devpkg/cake/_C.abi3.so .devpkg/cake_cuda_check
xz -9 .devpkg/cake_cuda_check
du -sh .devpkg
