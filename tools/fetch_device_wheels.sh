#!/usr/bin/env bash
# Fills .whl/ (ignored by git) with what the GPU machine lacks and cannot download: the baselines
# (flash-linear-attention 0.6.0, FlashQLA 0.1.3 with TileLang) and the build's nanobind and
# scikit-build-core, for Python 3.12 on x86-64; plus tilelang's libz3, xz-compressed, and
# TileLang's wheel repacked as tar.xz (it has no .data folder: its files are the site-packages
# tree), so that the whole folder stays well under the device tool's 64 MiB (~40 MB).
# tools/device_check.sh installs them there.
#   bash tools/fetch_device_wheels.sh [cudnn]
# "cudnn" adds bench/bench_kda.py's cudnn arm: nvidia-cudnn-frontend 1.32.0, its wheel (11.6 MB)
# repacked as tar.xz (~6 MB; no .data folder either). An opt-in, because the carried tree (with
# .devpkg and .tritoncache) has to fit 64 MiB too; without it any earlier pack is removed. Its
# other needs come with torch 2.11 (cuda-bindings, NVRTC, libcudnn) or with the machine's CUDA
# (the headers NVRTC compiles against).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# .gitignore lists .whl/; a checkout without it gets the line in info/exclude (in a worktree .git
# is a file, so the path comes from git).
git check-ignore -q .whl/ || echo "/.whl/" >> "$(git rev-parse --git-path info/exclude)"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl \
  flash-linear-attention==0.6.0 fla-core==0.6.0 flash-qla==0.1.3 tilelang==0.1.15 \
  "apache-tvm-ffi<0.1.13,>=0.1.11" torch-c-dlpack-ext==0.1.5 nanobind==3.1.0 \
  scikit-build-core==1.1.2
z3_dir=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$z3_dir" "z3-solver==4.15.4.0"
unzip -q -o -j "$z3_dir"/z3_solver-*.whl 'z3/lib/libz3.so.4.15' -d "$z3_dir"
xz -9 -c "$z3_dir/libz3.so.4.15" > .whl/libz3.so.4.15.xz
rm -rf "$z3_dir"
tl_dir=$(mktemp -d)
unzip -q .whl/tilelang-0.1.15-*.whl -d "$tl_dir"
[ ! -d "$tl_dir"/tilelang-0.1.15.data ] || { echo "tilelang's wheel has a .data folder"; exit 1; }
(cd "$tl_dir" && tar -cf - .) | xz -6 -T0 > .whl/tilelang-0.1.15.tar.xz
rm -rf "$tl_dir" .whl/tilelang-0.1.15-*.whl
rm -f .whl/nvidia_cudnn_frontend-*.tar.xz
if [ "${1:-}" = cudnn ]; then
  fe_dir=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$fe_dir" nvidia-cudnn-frontend==1.32.0
  mkdir "$fe_dir/tree" && unzip -q "$fe_dir"/nvidia_cudnn_frontend-1.32.0-*.whl -d "$fe_dir/tree"
  [ ! -d "$fe_dir"/tree/nvidia_cudnn_frontend-1.32.0.data ] \
    || { echo "nvidia-cudnn-frontend's wheel has a .data folder"; exit 1; }
  (cd "$fe_dir/tree" && tar -cf - .) | xz -6 -T0 > .whl/nvidia_cudnn_frontend-1.32.0.tar.xz
  rm -rf "$fe_dir"
fi
du -sh .whl
