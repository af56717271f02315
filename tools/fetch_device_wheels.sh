#!/usr/bin/env bash
# Fills .whl/ (ignored by git) with what the GPU machine lacks and cannot download: the baselines
# (flash-linear-attention 0.6.0, FlashQLA 0.1.3 with TileLang) and the build's nanobind and
# scikit-build-core, for Python 3.12 on x86-64; plus tilelang's libz3, xz-compressed, and
# TileLang's wheel repacked as tar.xz (it has no .data folder: its files are the site-packages
# tree), so that the whole folder stays well under the device tool's 64 MiB (~40 MB).
# tools/device_check.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
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
du -sh .whl
