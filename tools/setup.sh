#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: system packages (Debian), a virtual environment in .venv with
# tools/requirements-dev.txt, and cake built into it. Run by tools/demo.sh and tools/test.sh.
# Each step that has work to do says so before it starts; a re-run with everything in place prints
# three lines (what it builds, CMake's CUDA verdict, the time taken) and takes a few seconds.
#   CAKE_CUDA=AUTO (default) builds the sm_90a CUDA kernels when nvcc (CUDA >= 12.0) is found
#   (on PATH, or CUDACXX, or $CUDA_PATH/bin); CAKE_CUDA=ON requires them; CAKE_CUDA=OFF builds
#   the CPU-only module (the FP64 reference). No GPU is needed to build the kernels.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS

# A C++20 compiler and GoogleTest come from Debian; install them where they are missing.
missing=()
command -v g++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
python3 -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: Debian packages: installing ${missing[*]} (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Use-Pty=0 "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: virtual environment: creating .venv ($(python3 --version))"
  python3 -m venv .venv
fi

# torch from PyPI brings its CUDA libraries: about 5.5 GB installed. Without a wheel cache pip needs
# that much once, not twice (a CI run failed with ENOSPC while the cache held a second copy).
pip_install=(.venv/bin/python -m pip install --disable-pip-version-check --no-cache-dir)
if .venv/bin/python -c "import torch" 2>/dev/null; then
  # Everything is normally there already: a quiet check (about a second).
  "${pip_install[@]}" -q -r tools/requirements-dev.txt
else
  echo "setup: Python requirements (tools/requirements-dev.txt) into .venv: torch is large" \
       "(~5.5 GB with its CUDA libraries) and takes minutes the first time"
  free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
  if [ "$free_kb" -lt $((6 * 1024 * 1024)) ]; then
    echo "setup: warning: $((free_kb / 1024)) MiB free here; installing torch needs about 5.5 GiB" >&2
  fi
  # Not quiet: pip names each package as it downloads and installs it (with a progress bar on a
  # terminal).
  "${pip_install[@]}" -r tools/requirements-dev.txt
fi

# The build of cake: CMake decides with or without the CUDA kernels (CAKE_CUDA, CMakeLists.txt);
# what it will likely find is said before the build, CMake's verdict (its "cake:" line) during it.
cake_cuda=${CAKE_CUDA:-AUTO}
nvcc_path=${CUDACXX:-$(command -v nvcc || true)}
if [ -z "$nvcc_path" ] && [ -n "${CUDA_PATH:-}" ] && [ -x "$CUDA_PATH/bin/nvcc" ]; then
  nvcc_path=$CUDA_PATH/bin/nvcc
fi
case "${cake_cuda^^}" in
  OFF | 0 | NO | FALSE | N)
    echo "setup: building cake without the CUDA kernels (CAKE_CUDA=$cake_cuda: CPU only, ~20 s)" ;;
  *)
    if [ -n "$nvcc_path" ]; then
      echo "setup: building cake with the sm_90a CUDA kernels ($nvcc_path; the CUDA build takes" \
           "a minute or two the first time)"
    elif [ "${cake_cuda^^}" = AUTO ]; then
      echo "setup: building cake without the CUDA kernels (no nvcc found: CPU only, ~20 s)"
    else
      echo "setup: building cake with the CUDA kernels required (CAKE_CUDA=$cake_cuda), but no" \
           "nvcc found on PATH"
    fi ;;
esac
# pip -v shows the build's output: CMake's "cake:" line (with or without the kernels) and ninja's
# progress ([n/N] per file, only where there is something to build) are printed, everything goes
# to build/setup-build.log (its errors printed when the build fails).
mkdir -p build
log=build/setup-build.log
set +e
CAKE_CUDA=$cake_cuda "${pip_install[@]}" -v --no-build-isolation --no-deps . 2>&1 | tee "$log" \
  | { grep --line-buffered -E '^ *(-- cake: |\[[1-9][0-9]*/[0-9]+\] )' \
      | sed -u 's/^ *-- /  /' || true; }
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ]; then
  # CMake's or the compiler's errors where there are some, else the log's end.
  { grep -E -A12 '(CMake Error|FAILED: |error:)' "$log" || tail -40 "$log"; } | head -60 >&2
  echo "setup: building cake failed (pip exit $status); its whole output is in $log" >&2
  exit "$status"
fi
echo "setup: done in $((SECONDS - start)) s"
