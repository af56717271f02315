#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: system packages (Debian), a virtual environment in .venv with
# tools/requirements-dev.txt, and cake built into it. Sourced by tools/demo.sh and tools/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A C++20 compiler and GoogleTest come from Debian; install them where they are missing.
missing=()
command -v g++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} from Debian"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# torch from PyPI brings its CUDA libraries: about 5.5 GB installed. Without a wheel cache pip needs
# that much once, not twice (a CI run failed with ENOSPC while the cache held a second copy).
pip_install=(.venv/bin/python -m pip install -q --disable-pip-version-check --no-cache-dir)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
  if [ "$free_kb" -lt $((6 * 1024 * 1024)) ]; then
    echo "setup: warning: $((free_kb / 1024)) MiB free here; installing torch needs about 5.5 GiB" >&2
  fi
fi
"${pip_install[@]}" -r tools/requirements-dev.txt

# CUDA kernels are built when nvcc is there (CAKE_CUDA=OFF skips them); no GPU is needed to build.
if [ -z "${CAKE_CUDA:-}" ]; then
  if command -v nvcc >/dev/null && [ -f cmake/cuda.cmake ]; then CAKE_CUDA=ON; else CAKE_CUDA=OFF; fi
fi
export CAKE_CUDA
echo "setup: building cake (CAKE_CUDA=$CAKE_CUDA)"
"${pip_install[@]}" --no-build-isolation --no-deps -Ccmake.define.CAKE_CUDA="$CAKE_CUDA" .
