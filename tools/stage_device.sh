#!/usr/bin/env bash
# Stages what a device run needs without building there: the package `cake` with the CUDA module
# built here for Python 3.12 (build/py312, a CAKE_CUDA=ON build against that Python), and the C++
# GPU check. The device tool carries .devpkg (ignored by git); there: PYTHONPATH=.devpkg.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build/py312 -j 8 >/dev/null
rm -rf .devpkg && mkdir -p .devpkg
cp -r python/cake .devpkg/cake
cp build/py312/_C.abi3.so .devpkg/cake/
cp build/py312/cake_cuda_check .devpkg/
find .devpkg -name __pycache__ -prune -exec rm -rf {} +
du -sh .devpkg
