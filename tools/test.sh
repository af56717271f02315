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

# Where nvcc is (setup.sh then builds the module with the kernels), the C++ tests once more with
# the kernels compiled in: the validation of CUDA tensors, the saved-set and workspace queries and
# the ptxas checks run only there (no GPU needed; ~1 minute on 2 cores). The emulated kernel tests
# above run only in the build without them.
if command -v nvcc >/dev/null && [ "${CAKE_CUDA:-ON}" != OFF ]; then
  cmake -S . -B build/cudatests -G Ninja -DCAKE_CUDA=ON -DCAKE_BUILD_TESTS=ON >/dev/null
  cmake --build build/cudatests -j"$(nproc)"
  ctest --test-dir build/cudatests -j"$(nproc)" --output-on-failure
fi

python -m pytest -q tests/python
