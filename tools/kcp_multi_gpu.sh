#!/usr/bin/env bash
# cake.kcp across real GPUs: tests/multi_gpu/kcp_check.py under torchrun, one process per GPU,
# NCCL between them (GDN and KDA, every layout, P = 1 and 2, initial and final states, against the
# single-GPU op within the accuracy gate, bitwise reproducible, mismatches raising on every rank).
#   bash tools/kcp_multi_gpu.sh [W] [kcp_check.py arguments...]
# Without W: one run for each of W = 2, 4, 8 that the GPUs hold. Without GPUs, on the CPU (gloo,
# float64, the FP64 reference; what tests/python/test_kcp_launcher.py runs):
#   bash tools/kcp_multi_gpu.sh 2 --backend gloo --device cpu
# KCP_PYTHON: the interpreter that holds torch and cake (default: the set-up's .venv where it
# exists, else python3). KCP_TIMEOUT: seconds a
# run may take before it is killed (default 360), a guard around torchrun itself (its start, the
# rendezvous); kcp_check.py's own watchdog (--timeout, 300 s) fires first and prints the stacks.
# Exit status 0 when every run passed.
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast stays off on the shared multi-GPU machines (a program using it can put the
# host's GPUs out of service); kcp_check.py sets the same again for its own processes.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
default_python=python3
[ -x .venv/bin/python ] && default_python=.venv/bin/python
python=${KCP_PYTHON:-$default_python}

if [[ ${1:-} =~ ^[0-9]+$ ]]; then
  sizes=("$1")
  shift
else
  gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())') || exit 1
  sizes=()
  for w in 2 4 8; do
    if [ "$w" -le "$gpus" ]; then sizes+=("$w"); fi
  done
  if [ ${#sizes[@]} = 0 ]; then
    echo "kcp_multi_gpu: $gpus GPU(s), fewer than 2: give W (on the CPU: 2 --backend gloo --device cpu)"
    exit 1
  fi
fi

status=0
for w in "${sizes[@]}"; do
  echo "kcp_multi_gpu: W = $w"
  start=$SECONDS
  timeout -k 30 "${KCP_TIMEOUT:-360}" "$python" -m torch.distributed.run --standalone \
    --nproc_per_node "$w" tests/multi_gpu/kcp_check.py "$@"
  rc=$?
  echo "kcp_multi_gpu: W = $w ended with status $rc after $((SECONDS - start)) s"
  [ "$rc" = 0 ] || status=1
done
exit $status
