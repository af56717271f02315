#!/usr/bin/env bash
# Sets up (tools/setup.sh), then runs every test: the C++ tests (ctest) and the Python tests
# (pytest; GPU tests skip where there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

cmake -S . -B build/tests -G Ninja -DCAKE_CUDA=OFF -DCAKE_BUILD_TESTS=ON >/dev/null
cmake --build build/tests -j"$(nproc)"
ctest --test-dir build/tests -j"$(nproc)" --output-on-failure

python -m pytest -q tests/python
