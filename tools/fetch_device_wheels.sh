#!/usr/bin/env bash
# Fills .whl/ (ignored by git) with what the GPU machine lacks and cannot download: the baselines
# (flash-linear-attention 0.6.0, FlashQLA 0.1.3 with TileLang) and the build's nanobind and
# scikit-build-core, for Python 3.12 on x86-64; plus tilelang's libz3, xz-compressed, and
# TileLang's wheel repacked as tar.xz (it has no .data folder: its files are the site-packages
# tree), so that the whole folder stays well under the device tool's 64 MiB (~40 MB).
# tools/device_check.sh installs them there.
#   bash tools/fetch_device_wheels.sh [cudnn] [causal_conv1d] [train]
# "cudnn" adds bench/bench_kda.py's cudnn arm: nvidia-cudnn-frontend 1.32.0, its wheel (11.6 MB)
# repacked as tar.xz (~6 MB; no .data folder either). An opt-in, because the carried tree (with
# .devpkg and .tritoncache) has to fit 64 MiB too; without it any earlier pack is removed. Its
# other needs come with torch 2.11 (cuda-bindings, NVRTC, libcudnn) or with the machine's CUDA
# (the headers NVRTC compiles against).
# "causal_conv1d" adds bench/bench_conv1d.py's causal_conv1d arm: causal-conv1d 1.7.0, an sdist
# on PyPI; its GitHub releases' build matrix stopped at torch 2.10 (PR #110, adding 2.11, was
# open; the v1.7.0 assets could not be listed from here), and such a wheel holds nine arches. So
# it is built here (nvcc, Python 3.12) against torch 2.11.0+cu130 (the device's) for sm_90 only,
# without -lineinfo (profilers' line tables, the same SASS; they triple the fatbin) and with the
# fatbin uncompressed (nvcc's own compression of the large ones leaves what xz cannot shrink),
# host debug info stripped, repacked as tar.xz (3.5 MB; no .data folder; with setup.py's flags
# for sm_90 it was a 25 MB wheel, 21 MB as xz). The build: a venv with that torch (4.6 GB, under
# build/, ~1-2 minutes from PyPI), then ~4 minutes on 2 cores; its pack is kept there, so a later
# run only copies it (rm -rf build/causal-conv1d to build again). Opt-in, as cudnn; removed
# without it.
# "train" is for `python -m cake.train --compare fla` (device_check's "train" stage): fla.layers
# imports transformers (only its logging at import time). Its wheels and what their import needs
# (~18 MB; numpy the machine has; tokenizers, hf-xet and kernels with pydantic, ~13 MB, it does
# not: fla.layers imports without them, checked on transformers 5.25.0 and huggingface-hub
# 2.4.0) are added to the set, which keeps TileLang: FLA's gated dq/dk backward raises on Hopper
# with Triton < 3.7.1 (torch 2.11's Triton) unless TileLang serves it. With the 3.2 MB tree that
# is ~62.6 MiB of the 64 MiB a call carries: carry .whl alone (the device builds cake with pip, ~35
# s), and not with "cudnn". Their names are kept in .whl/train.txt, so that a later run without
# "train" removes them.
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
opt_in=" $* "
rm -f .whl/nvidia_cudnn_frontend-*.tar.xz .whl/causal_conv1d-*.tar.xz
if [[ $opt_in == *" cudnn "* ]]; then
  fe_dir=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$fe_dir" nvidia-cudnn-frontend==1.32.0
  mkdir "$fe_dir/tree" && unzip -q "$fe_dir"/nvidia_cudnn_frontend-1.32.0-*.whl -d "$fe_dir/tree"
  [ ! -d "$fe_dir"/tree/nvidia_cudnn_frontend-1.32.0.data ] \
    || { echo "nvidia-cudnn-frontend's wheel has a .data folder"; exit 1; }
  (cd "$fe_dir/tree" && tar -cf - .) | xz -6 -T0 > .whl/nvidia_cudnn_frontend-1.32.0.tar.xz
  rm -rf "$fe_dir"
fi
if [[ $opt_in == *" causal_conv1d "* ]]; then
  cc=build/causal-conv1d  # ignored by git
  cc_pack=$cc/causal_conv1d-1.7.0-torch2.11.0+cu130-sm90.tar.xz
  if [ ! -f "$cc_pack" ]; then
    py=python3.12  # pyenv's shim answers only where 3.12 is selected
    $py -c "" 2>/dev/null || py="$(pyenv root)/versions/$(pyenv versions --bare \
      | grep -E '^3\.12' | tail -1)/bin/python3.12"
    [ -x "$cc/venv/bin/python" ] || "$py" -m venv "$cc/venv"
    "$cc/venv/bin/python" -m pip install -q torch==2.11.0 setuptools==81.0.0 wheel==0.48.0 \
      packaging==26.4 ninja==1.13.2
    [ "$("$cc/venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)" \
      = 2.11.0+cu130 ] || { echo "PyPI's torch 2.11.0 is not the device's 2.11.0+cu130"; exit 1; }
    rm -rf "$cc/src" "$cc/dist" "$cc/tree" && mkdir -p "$cc/src" "$cc/tree"
    sdist_sha=3202758494eaa7b597ce1c282dfa188889506bfcb92cad3c407d26736bfcd32b
    echo "causal-conv1d==1.7.0 --hash=sha256:$sdist_sha" > "$cc/requirements.txt"
    # An sdist's metadata runs its setup.py, which imports torch: the venv's, nothing compiled.
    CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE "$cc/venv/bin/python" -m pip download -q --no-deps \
      --no-binary :all: --no-build-isolation -r "$cc/requirements.txt" -d "$cc/src"
    tar -xzf "$cc/src/causal_conv1d-1.7.0.tar.gz" -C "$cc/src"
    setup=$cc/src/causal_conv1d-1.7.0/setup.py
    # Its setup.py hard-codes nine -gencode pairs (sm_75 to sm_121), which also make torch ignore
    # TORCH_CUDA_ARCH_LIST: emptied, the arches are that list's; -lineinfo becomes --no-compress.
    grep -q '^    # HACK: The compiler flag' "$setup" && grep -q '"-lineinfo",' "$setup" \
      || { echo "causal-conv1d's setup.py changed: check the patch"; exit 1; }
    sed -i -e 's/^    # HACK: The compiler flag/    cc_flag = []  # cake\n&/' \
      -e 's/"-lineinfo",/"--no-compress",/' "$setup"
    start=$SECONDS
    PATH="$PWD/$cc/venv/bin:${CUDA_HOME:-/usr/local/cuda}/bin:$PATH" \
      CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" CAUSAL_CONV1D_FORCE_BUILD=TRUE \
      TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=2 "$cc/venv/bin/python" -m pip wheel -v --no-deps \
      --no-build-isolation --no-cache-dir -w "$cc/dist" "$cc/src/causal_conv1d-1.7.0" \
      > "$cc/build.log" 2>&1 || { tail -30 "$cc/build.log"; exit 1; }
    echo "causal-conv1d built in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
    unzip -q "$cc"/dist/causal_conv1d-1.7.0-cp312-cp312-linux_x86_64.whl -d "$cc/tree"
    [ ! -d "$cc"/tree/causal_conv1d-1.7.0.data ] \
      || { echo "causal-conv1d's wheel has a .data folder"; exit 1; }
    strip --strip-debug "$cc"/tree/causal_conv1d_cuda.*.so  # Python's CFLAGS have -g
    # The extension's symbols resolve against this torch (no GPU needed to import it).
    PYTHONPATH="$cc/tree" "$cc/venv/bin/python" -W ignore -c "import causal_conv1d as c, \
      causal_conv1d_cuda; print('causal_conv1d', c.__version__, 'imports')"
    (cd "$cc/tree" && tar -cf - .) | xz -6 -T0 > "$cc_pack.tmp" && mv "$cc_pack.tmp" "$cc_pack"
    rm -rf "$cc/tree"
  fi
  cp "$cc_pack" .whl/causal_conv1d-1.7.0.tar.xz
fi
if [ -f .whl/train.txt ]; then
  (cd .whl && xargs -r rm -f < train.txt && rm -f train.txt)
fi
if [[ $opt_in == *" train "* ]]; then
  [[ $opt_in != *" cudnn "* ]] || { echo "train and cudnn do not fit one carry (64 MiB)"; exit 1; }
  tr_dir=$(mktemp -d)
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$tr_dir" transformers==5.25.0
  (cd "$tr_dir" && rm -f numpy-*.whl tokenizers-*.whl hf_xet-*.whl kernels-*.whl pydantic-*.whl \
     pydantic_core-*.whl annotated_types-*.whl typing_inspection-*.whl && ls *.whl) > .whl/train.txt
  mv "$tr_dir"/*.whl .whl/ && rm -rf "$tr_dir"
fi
du -sh .whl
