#!/usr/bin/env bash
# On a GPU machine without network (the device tool): build cake with CUDA for this Python, run the
# GPU tests, then the side-by-side benchmark. Baselines come as wheels in .whl/ (tools/fetch_device_wheels.sh).
#   bash tools/device_check.sh [bench arguments...]      logs and results under $OUT (or ./out)
# Everything is printed (redirect it to $OUT/run.log); files under $OUT: ncu_a.txt, ncu.txt,
# train/log.json, train/loss.png, gpu_tests.log, crash_bt.txt, accuracy.jsonl, bench.jsonl,
# autotune.tar.gz (the device tool returns at most 8).
# The "tests" stage runs all of tests/python in one pytest process, as users do (at most
# CAKE_PYTEST_TIMEOUT seconds, by default what is left of 540 s since the script started), and
# prints "GPU tests: passed", "FAILED", "CRASHED
# (signal N)" or "TIMED OUT"; after a crash it
# reruns the crashing test under cuda-gdb for a native backtrace (crash_bt.txt). Any of these but
# "passed" makes the exit status 1, after the other stages have run; so does any other stage
# that fails, and a stage name that is not one of those below (exit status 2, before the build).
# CAKE_ACCURACY_OPS the ops of the accuracy stage (bench/accuracy.py --op; default "gdn", e.g.
# "gdn kda"), CAKE_ACCURACY_CASES a subset of their cases (--cases), CAKE_ACCURACY_SEEDS the draws
# per case (--seeds; errors pooled over them).
# CAKE_STAGES picks what runs after the build (unset: "demo tests accuracy bench"; set but empty:
# nothing, the build alone, e.g. before tools/time_patches.sh); "train" runs
# python -m cake.train in full with --compare fla and CAKE_TRAIN_ARGS (the demo stage runs 30
# steps of it); "check" runs
# the C++ GPU check first (with CAKE_CHECK_ARGS, e.g. "--kkt" or "--no-time") and stops on
# failure; "profile" adds Nsight Compute on one forward + backward of workload M
# (tools/profile_gdn.py); "stalls" the walks' (or CAKE_STALL_KERNELS') stall reasons at workload A
# (Nsight Compute on the C++ check; CAKE_STALL_ARGS its arguments, default "--once", e.g.
# "--once --workload kda-P4-16"); "sources" where their warps wait, per instruction
# (tools/stall_sources.py, the same kernels and arguments); "kda_bench" the KDA benchmark
# (bench/bench_kda.py, with CAKE_KDA_BENCH_ARGS, into kda_bench.jsonl); "conv1d_bench" the causal conv1d benchmark
# (bench/bench_conv1d.py, with CAKE_CONV1D_BENCH_ARGS, into conv1d_bench.jsonl);
# "conv1d_profile" Nsight Compute on one conv1d forward + backward of cake and of FLA
# (tools/profile_conv1d.py, with CAKE_CONV1D_PROFILE_ARGS, default A at D = 2048, into
# ncu_conv1d.txt: speed of light, occupancy, warp states, memory); "layers_bench"
# one GDN and one KDA layer of cake against FLA's with the same weights, kernel by kernel
# (bench/bench_layers.py, with CAKE_LAYERS_BENCH_ARGS, into layers_bench.jsonl); "kcp1_bench"
# context parallelism on one GPU, each rank's share replayed alone (bench/bench_kcp_one_gpu.py,
# with CAKE_KCP1_BENCH_ARGS, into kcp1_bench.jsonl); "step_profile" where a training step of the
# main job goes, cake's and FLA's (tools/profile_step.py, with CAKE_STEP_PROFILE_ARGS, into
# step_profile.json and its log); on a machine of several GPUs, "kcp_check"
# cake.kcp across them (tools/kcp_multi_gpu.sh: W = 2, 4, 8 as the GPUs allow, or CAKE_KCP_W;
# NCCL) into kcp_check.log, and "kcp_bench" the KCP benchmark (bench/bench_kcp.py under torchrun
# at W = CAKE_KCP_W, default every GPU, with CAKE_KCP_BENCH_ARGS) into kcp_bench.jsonl. Without a
# build there when tools/stage_device.sh has filled .devpkg here (carry it).
set -uo pipefail
cd "$(dirname "$0")/.."
known=" check demo train tests profile stalls sources accuracy bench kda_bench conv1d_bench conv1d_profile layers_bench step_profile kcp1_bench kcp_check kcp_bench "
for stage in ${CAKE_STAGES:-}; do
  if [[ $known != *" $stage "* ]]; then
    echo "device_check: unknown stage '$stage' in CAKE_STAGES (known:$known)"
    exit 2
  fi
done
export PYTHONUNBUFFERED=1 OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
# FLA's Triton autotuning takes ~2 minutes per new head configuration; its results (small JSON
# files in Triton's cache) travel between sessions: .tritoncache/autotune.tar.gz here (copied from
# a run's $OUT), unpacked before and packed again after the stages. Likewise TileLang's compiled
# kernels (FlashQLA's, FLA's backward on Hopper: ~4 minutes of compiling in a fresh machine):
# .tritoncache/tilelang.tar.xz, packed into $OUT when this run compiled kernels and the pack fits
# the 16 MiB a returned file may have.
if [ -f .tritoncache/autotune.tar.gz ]; then
  mkdir -p "$HOME/.triton/cache" && tar -xzf .tritoncache/autotune.tar.gz -C "$HOME/.triton/cache"
fi
if [ -f .tritoncache/tilelang.tar.xz ]; then
  mkdir -p "$HOME/.tilelang/cache" && tar -xJf .tritoncache/tilelang.tar.xz -C "$HOME/.tilelang/cache"
fi
touch /tmp/tilelang_cache_stamp  # what is newer in the cache at exit, this run compiled
pack_autotune() {
  (cd "$HOME/.triton/cache" 2>/dev/null && find . -name "*.autotune.json" -print0 \
     | tar --null -czf "$OUT/autotune.tar.gz" -T - 2>/dev/null) || true
  if [ -n "$(find "$HOME/.tilelang/cache" -type f -newer /tmp/tilelang_cache_stamp 2>/dev/null \
             | head -1)" ]; then
    # Packed under a temporary name, so that a call killed while packing returns no torn pack.
    (cd "$HOME/.tilelang/cache" && tar -cf - . | xz -6 -T0 > "$OUT/tilelang.tar.xz.part" \
       && mv "$OUT/tilelang.tar.xz.part" "$OUT/tilelang.tar.xz") || rm -f "$OUT/tilelang.tar.xz.part"
    if [ "$(stat -c %s "$OUT/tilelang.tar.xz" 2>/dev/null || echo 0)" -gt $((16 * 1024 * 1024)) ]; then
      echo "TileLang's kernel cache is over 16 MiB packed; not returned" && rm -f "$OUT/tilelang.tar.xz"
    fi
  fi
}
trap pack_autotune EXIT
trap 'exit 143' TERM  # a timeout's SIGTERM still packs (through the EXIT trap)

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
# Wheels repacked as tar.xz by tools/fetch_device_wheels.sh (TileLang's: 50 MB as a wheel, 30 as
# tar.xz): a wheel without a .data folder is its site-packages tree, so unpacking it installs it.
for t in .whl/*.tar.xz; do
  [ -f "$t" ] && mkdir -p /tmp/site && tar -xJf "$t" -C /tmp/site
done
# tilelang's native library needs z3's; only that library travels (xz-compressed, to fit the limit).
if [ -f .whl/libz3.so.4.15.xz ]; then
  mkdir -p /tmp/z3lib
  python3 -c "import lzma,sys; open('/tmp/z3lib/libz3.so.4.15','wb').write(lzma.open(sys.argv[1]).read())" \
    .whl/libz3.so.4.15.xz
  export LD_LIBRARY_PATH="/tmp/z3lib:${LD_LIBRARY_PATH:-}"
fi
if [ -d .devpkg/cake ]; then
  # Staged here by tools/stage_device.sh (module and check program built for this Python).
  export PYTHONPATH="$PWD/.devpkg:/tmp/site"
  check=/tmp/cake_cuda_check
  python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" \
    .devpkg/cake_cuda_check.xz "$check" && chmod +x "$check"
else
  # The build uses the carried nanobind and scikit-build-core (the versions of
  # tools/requirements-dev.txt), not whatever the machine's image holds.
  # A warm machine keeps /tmp from the call before: pip --target does not replace a package that
  # is there, so the old module would run under this commit's name.
  export PYTHONPATH=/tmp/site
  rm -rf /tmp/cake
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/cake \
    -Ccmake.define.CAKE_CUDA=ON -Cbuild-dir=build/device . 2>&1 | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "device_check: building cake with pip failed"; exit 1; }
  export PYTHONPATH=/tmp/cake:/tmp/site
  check=build/device/cake_cuda_check
fi
# What was built, and with what (the compiler, the CUDA runtime, nanobind and scikit-build-core as
# imported): the first thing to compare when a staged build and this one behave differently.
python3 -c "import cake, json; print('build_info:', json.dumps(cake.build_info()))" 2>&1
python3 -m pip list 2>/dev/null | grep -iE "^(nanobind|scikit.build.core|cmake|torch) " || true
# The results name the commit the module was built from: .devpkg/REF when staged (the checkout
# there may be another commit), else this checkout's HEAD, and where the files differ from HEAD
# (the device tool copies the working tree beside the git directory of the session's first commit)
# also the tree they make: "HEAD+tree T"; `git log --all --format='%h %t' | grep T` names the
# commit whose tree that is.
working_tree() {
  local index=/tmp/cake_tree_index
  rm -f "$index"
  GIT_INDEX_FILE=$index git add -A . >/dev/null 2>&1 && GIT_INDEX_FILE=$index git write-tree \
    2>/dev/null | cut -c1-7
  rm -f "$index"
}
if [ -f .devpkg/REF ] && [ -d .devpkg/cake ]; then
  export CAKE_COMMIT="${CAKE_COMMIT:-$(cat .devpkg/REF)}"
elif [ -z "${CAKE_COMMIT:-}" ]; then
  head=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  tree=$(working_tree)
  if [ -n "$tree" ] && [ "$tree" != "$(git rev-parse --short=7 'HEAD^{tree}' 2>/dev/null)" ]; then
    head="$head+tree $tree"
  fi
  export CAKE_COMMIT="$head"
fi
echo "commit: $CAKE_COMMIT"

stages=" ${CAKE_STAGES-demo tests accuracy bench} "  # set but empty: the build alone
stage_failed=""

if [[ $stages == *" check "* ]]; then
  # The C++ GPU check (all accuracy cases, saved == recompute, workload A timings); the run
  # stops here when it fails. Then each kernel's time at workload A under Nsight Compute.
  "$check" ${CAKE_CHECK_ARGS:-} 2>&1 || { echo "cake_cuda_check failed"; exit 1; }
  timeout 120 ncu --clock-control none --section SpeedOfLight "$check" --once > "$OUT/ncu_a.txt" 2>&1
  grep -E "_kernel\(|Duration" "$OUT/ncu_a.txt" | sed 's/(.*Params)//' | paste - - \
    | awk '{print $1, $(NF-1), $NF}'
fi

if [[ $stages == *" demo "* ]]; then
  # The main job, short: 30 steps of its GPU model (log.json and loss.png under $OUT/train).
  python3 -m cake.train --steps 30 --out "$OUT/train" 2>&1 || stage_failed+=" demo"
fi
if [[ $stages == *" train "* ]]; then
  # The main job in full, side by side with FLA's layers where they import (fla.layers needs
  # transformers besides the wheels in .whl): loss curves and tokens/s under $OUT/train.
  if python3 -c "import fla.layers" 2>/dev/null; then compare=(--compare fla); else
    echo "train: fla.layers does not import here: training with cake's layers only"; compare=()
  fi
  # CAKE_TRAIN_ARGS: more options, e.g. "--cu-seqlens-cpu" (split at spaces)
  python3 -m cake.train "${compare[@]}" ${CAKE_TRAIN_ARGS:-} --out "$OUT/train" 2>&1 \
    || stage_failed+=" train"
fi
if [[ $stages == *" tests "* ]]; then
  # The whole of tests/python in ONE pytest process, as users run it (a crash of the process, e.g.
  # a segmentation fault when cake raises for CUDA tensors, shows here; one process per test hid
  # one). On a timeout SIGABRT makes faulthandler print where it hangs; 30 s later SIGKILL.
  start=$SECONDS
  # CAKE_PYTEST_K (a pytest -k expression, e.g. "kda or kcp") or CAKE_PYTEST_FILES (paths,
  # e.g. the files that use the GPU, when the CPU-only tests need not run there) split the tests
  # over calls when the call is short; CAKE_PYTEST_TIMEOUT (default: what is left of 540 s since
  # the start) ends pytest inside the call's own limit of 600 s, so that its log, the slowest
  # tests' durations, the cache packs and the later stages come back. -v names each test as it
  # runs, so that a log cut by the timeout names the test it stopped in, and with it each test's
  # time (console_output_style=times), so that such a log also says where the time went.
  left=$((540 - SECONDS))
  limit=${CAKE_PYTEST_TIMEOUT:-$((left > 60 ? left : 60))}
  timeout -s ABRT -k 30 "$limit" python3 -X faulthandler -m pytest -v \
    -o console_output_style=times -rfEs --durations=20 \
    ${CAKE_PYTEST_FILES:-tests/python} ${CAKE_PYTEST_K:+-k "$CAKE_PYTEST_K"} \
    > "$OUT/gpu_tests.log" 2>&1
  rc=$?
  if [ "$rc" = 124 ] || { [ "$rc" = 137 ] && [ $((SECONDS - start)) -ge "$limit" ]; }; then
    tail -40 "$OUT/gpu_tests.log"
    echo "GPU tests: TIMED OUT after $limit s (where it hung: the traceback in gpu_tests.log)"
    stage_failed+=" tests"
  elif [ "$rc" -gt 128 ]; then
    # faulthandler's traceback (innermost call first), else the log's end.
    fatal=$(sed -n '/Fatal Python error/,$p' "$OUT/gpu_tests.log")
    head -20 <<<"${fatal:-$(tail -20 "$OUT/gpu_tests.log")}"
    echo "GPU tests: CRASHED (signal $((rc - 128)))"
    stage_failed+=" tests"
    # Rerun the crashing test under cuda-gdb for a native backtrace (this machine has no gdb;
    # cuda-gdb debugs programs without GPU code too). The test: the innermost test function in
    # faulthandler's traceback; else the test file it names; else the GPU test file.
    test_file='tests/python/test_[A-Za-z0-9_]+\.py'
    frame=$(grep -oE "$test_file\", line [0-9]+ in test_[A-Za-z0-9_]+" <<<"$fatal" | head -1)
    file=$(grep -oE "$test_file" <<<"${frame:-$fatal}" | head -1)
    target=("${file:-tests/python/test_gpu_gdn.py}")
    [ -n "$frame" ] && target+=(-k "${frame##* in }")
    gdb_bin=$(command -v cuda-gdb || echo /usr/local/cuda/bin/cuda-gdb)
    if [ -x "$gdb_bin" ]; then
      echo "GPU tests: rerunning ${target[*]} under cuda-gdb: native backtrace in crash_bt.txt"
      timeout -k 30 300 "$gdb_bin" -q -batch -ex run -ex bt -ex "info sharedlibrary" \
        --args python3 -X faulthandler -m pytest -q -x "${target[@]}" > "$OUT/crash_bt.txt" 2>&1
      grep -E "received signal|^#[0-9]+ " "$OUT/crash_bt.txt" | head -25
    else
      echo "GPU tests: no cuda-gdb here ($gdb_bin): no native backtrace"
    fi
  else
    tail -40 "$OUT/gpu_tests.log"
    if [ "$rc" != 0 ]; then
      echo "GPU tests: FAILED (pytest exit status $rc)"
      stage_failed+=" tests"
    else
      echo "GPU tests: passed"
    fi
  fi
fi
if [[ $stages == *" profile "* ]]; then
  kernels='regex:^(qk_norm|kkt_solve|walk_a_fwd|walk_a_bwd|qk_grad)'
  ncu --clock-control none -k "$kernels" --launch-skip 12 --launch-count 12 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    python3 tools/profile_gdn.py --workload M > "$OUT/ncu.txt" 2>&1
  tail -5 "$OUT/ncu.txt"
fi
if [[ $stages == *" stalls "* ]]; then
  # Why a kernel takes what it takes: per-reason stall cycles per issued instruction, excess
  # sectors and wavefronts, the memory tables, at workload A; by default the two state walks
  # (CAKE_STALL_KERNELS: another regex of kernel names, each profiled once).
  ncu --clock-control none -k "regex:^(${CAKE_STALL_KERNELS:-walk_a_fwd|walk_a_bwd})" \
    --launch-count 3 --section WarpStateStats --section SourceCounters \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    "$check" ${CAKE_STALL_ARGS:---once} > "$OUT/ncu_stalls.txt" 2>&1
  tail -3 "$OUT/ncu_stalls.txt"
fi
if [[ $stages == *" sources "* ]]; then
  # Where the walks' warps wait, per SASS instruction (warp-stall sampling), at workload A: the
  # source page as CSV (xz) for tools/stall_sources.py, and its summary. This is how the
  # backward's v19 gain was found: the column roles waited 21 % of their time at StepDone for
  # the side roles' dk stores (docs/perf-notes.md).
  ncu --clock-control none -k "regex:^(${CAKE_STALL_KERNELS:-walk_a_fwd|walk_a_bwd})" \
    --launch-count 3 --section SourceCounters --section WarpStateStats --import-source yes \
    -f -o /tmp/sources "$check" ${CAKE_STALL_ARGS:---once} > "$OUT/ncu_sources.txt" 2>&1
  ncu -i /tmp/sources.ncu-rep --page source --csv --print-source sass > /tmp/sources_sass.csv
  xz -6 -c /tmp/sources_sass.csv > "$OUT/sources_sass.csv.xz"
  python3 tools/stall_sources.py /tmp/sources_sass.csv --top 20 | tee "$OUT/stall_sources.txt"
fi
if [[ $stages == *" accuracy "* ]]; then
  for op in ${CAKE_ACCURACY_OPS:-gdn}; do
    python3 bench/accuracy.py --op "$op" --out "$OUT/accuracy.jsonl" \
      ${CAKE_ACCURACY_CASES:+--cases $CAKE_ACCURACY_CASES} ${CAKE_ACCURACY_SEEDS:+--seeds $CAKE_ACCURACY_SEEDS} 2>&1 \
      || stage_failed+=" accuracy($op)"
  done
fi
if [[ $stages == *" bench "* ]]; then
  python3 bench/bench_gdn.py --out "$OUT/bench.jsonl" "$@" 2>&1 || stage_failed+=" bench"
fi
# The short benchmarks first, so that a call's limit falls on the KDA benchmark (FLA's and cuDNN's
# first compiles). On the H100 (2026-12-06) one call ran the build, 87 GPU tests, kcp1 (10 cells),
# conv1d (all arms) and KDA at P4, 16 heads (fwd and fwd+bwd) in 497 s; the stages were not timed
# one by one.
if [[ $stages == *" kcp1_bench "* ]]; then
  python3 bench/bench_kcp_one_gpu.py --out "$OUT/kcp1_bench.jsonl" ${CAKE_KCP1_BENCH_ARGS:-} 2>&1 \
    || stage_failed+=" kcp1_bench"
fi
if [[ $stages == *" conv1d_bench "* ]]; then
  python3 bench/bench_conv1d.py --out "$OUT/conv1d_bench.jsonl" ${CAKE_CONV1D_BENCH_ARGS:-} 2>&1 \
    || stage_failed+=" conv1d_bench"
fi
if [[ $stages == *" conv1d_profile "* ]]; then
  ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis \
    python3 tools/profile_conv1d.py ${CAKE_CONV1D_PROFILE_ARGS:-} > "$OUT/ncu_conv1d.txt" 2>&1 \
    || stage_failed+=" conv1d_profile"
  grep -E "_kernel|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Issue Slots" \
    "$OUT/ncu_conv1d.txt" | head -60
fi
if [[ $stages == *" layers_bench "* ]]; then
  python3 bench/bench_layers.py --out "$OUT/layers_bench.jsonl" ${CAKE_LAYERS_BENCH_ARGS:-} 2>&1 \
    || stage_failed+=" layers_bench"
fi
if [[ $stages == *" step_profile "* ]]; then
  python3 tools/profile_step.py --out "$OUT/step_profile.json" ${CAKE_STEP_PROFILE_ARGS:-} 2>&1 \
    | tee "$OUT/step_profile.log"
  [ "${PIPESTATUS[0]}" = 0 ] || stage_failed+=" step_profile"
fi
if [[ $stages == *" kda_bench "* ]]; then
  python3 bench/bench_kda.py --out "$OUT/kda_bench.jsonl" ${CAKE_KDA_BENCH_ARGS:-} 2>&1 \
    || stage_failed+=" kda_bench"
fi
if [[ $stages == *" kcp_check "* ]]; then
  bash tools/kcp_multi_gpu.sh ${CAKE_KCP_W:-} 2>&1 | tee "$OUT/kcp_check.log"
  [ "${PIPESTATUS[0]}" = 0 ] || stage_failed+=" kcp_check"
fi
if [[ $stages == *" kcp_bench "* ]]; then
  # NVLink multicast off, as tools/kcp_multi_gpu.sh (bench_kcp.py sets it again for itself).
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    python3 -m torch.distributed.run --standalone \
    --nproc_per_node "${CAKE_KCP_W:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}" \
    bench/bench_kcp.py --out "$OUT/kcp_bench.jsonl" ${CAKE_KCP_BENCH_ARGS:-} 2>&1 \
    || stage_failed+=" kcp_bench"
fi
if [ -n "$stage_failed" ]; then
  echo "device_check: failed:$stage_failed (the other stages ran)"
  exit 1
fi
