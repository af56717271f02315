// The kernels' launch functions (kernels/<stage>/launch.hpp) on the CPU emulator: the grid each
// launch.cu computes, run by emu::launch, so that the emulated tests call the stages as the GPU
// check and the op (src/ops/cuda/gdn_cuda.cpp, compiled into the emulated tests) do. Also each
// kernel's dynamic shared memory (its `extern __shared__ char smem_raw[]`), one block at a time.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "emu/runtime.hpp"  // first: the CUDA builtins the kernels use, on the CPU
#include "kernels/common/tensor_map_encode.hpp"
#include "kernels/conv1d_bwd/kernel.cuh"
#include "kernels/conv1d_bwd/launch.hpp"
#include "kernels/conv1d_fwd/kernel.cuh"
#include "kernels/conv1d_fwd/launch.hpp"
#include "kernels/gate/kernel.cuh"
#include "kernels/gate/launch.hpp"
#include "kernels/intra_bwd/kernel.cuh"
#include "kernels/intra_bwd/launch.hpp"
#include "kernels/kkt_solve/kernel.cuh"
#include "kernels/kkt_solve/launch.hpp"
#include "kernels/norm_bwd/kernel.cuh"
#include "kernels/norm_bwd/launch.hpp"
#include "kernels/norm_fwd/kernel.cuh"
#include "kernels/norm_fwd/launch.hpp"
#include "kernels/qk_grad/kernel.cuh"
#include "kernels/qk_grad/launch.hpp"
#include "kernels/qk_norm/kernel.cuh"
#include "kernels/qk_norm/launch.hpp"
#include "kernels/walk_a_bwd/kernel.cuh"
#include "kernels/walk_a_bwd/launch.hpp"
#include "kernels/walk_a_bwd/maps.hpp"
#include "kernels/walk_a_fwd/launch.hpp"
#include "kernels/walk_a_fwd/maps.hpp"
#include "kernels/walk_a_fwd/roles.cuh"
#include "kernels/walk_a_fwd/split.hpp"

using cake::emu::Dim3;

namespace {

unsigned u(int64_t x) { return static_cast<unsigned>(x); }

// Blocks of one warp per row (qk_norm, qk_grad).
unsigned row_blocks(int64_t rows, int threads) {
  return u((rows + threads / 32 - 1) / (threads / 32));
}

}  // namespace

// The CUDA runtime's error strings, for the op's error path (no CUDA runtime is linked).
extern "C" char const* cudaGetErrorName(cudaError_t) { return "cudaError (emulated)"; }
extern "C" char const* cudaGetErrorString(cudaError_t) { return "emulated launch"; }
// The op's clearing of the h-walk's flags and its states of a call without tokens
// (src/ops/cuda/stages.hpp), on the CPU.
extern "C" cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
// One emulated device, 0: the ops' device guard (src/ops/cuda/device_guard.hpp) finds it current.
extern "C" cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
extern "C" cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
extern "C" cudaError_t cudaGetLastError() { return cudaSuccess; }
namespace {
int multiprocessor_count = 132;
}  // namespace
void cake::emu::set_multiprocessor_count(int count) { multiprocessor_count = count; }
extern "C" cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0 || attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
  *value = multiprocessor_count;
  return cudaSuccess;
}
extern "C" cudaError_t cudaMemcpyAsync(void* to, void const* from, size_t bytes, cudaMemcpyKind,
                                       cudaStream_t) {
  std::memcpy(to, from, bytes);
  return cudaSuccess;
}

namespace cake::kernels::kkt_solve {
alignas(16) char smem_raw[std::max(sizeof(SharedStorage<ScalarDecay>),
                                   sizeof(SharedStorage<ChannelDecay>))];
template <class Decay>
cudaError_t launch(Params const& p, cudaStream_t) {
  if (!params_valid<Decay>(p)) return cudaErrorInvalidValue;
  Dim3 grid{u(p.problem.num_slots), u(p.problem.num_qk_heads)};
  if constexpr (Decay::kGatedKkt) {
    grid = Dim3{u(
        channel_decay_ctas(p.problem, int64_t{kBlocksPerSm<ChannelDecay>} * multiprocessor_count))};
    if (grid.x == 0) return cudaSuccess;
  }
  emu::launch(grid, Dim3{kThreads}, smem_raw, [&] { kkt_solve_kernel<Decay>(p); });
  return cudaSuccess;
}
template cudaError_t launch<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch<ChannelDecay>(Params const&, cudaStream_t);
}  // namespace cake::kernels::kkt_solve

namespace cake::kernels::intra_bwd {
alignas(16) char smem_raw[sizeof(SharedStorage)];
cudaError_t launch(Params const& p, cudaStream_t) {
  // one CTA per SM, each walking its share of the items (the tests set few SMs, so that each
  // CTA walks several)
  int64_t const items = int64_t{p.problem.num_slots} * p.problem.num_qk_heads;
  if (items == 0) return cudaSuccess;
  emu::launch(Dim3{u(std::min<int64_t>(items, multiprocessor_count))}, Dim3{kThreads}, smem_raw,
              [&] { intra_bwd_kernel(p); });
  return cudaSuccess;
}
}  // namespace cake::kernels::intra_bwd

namespace cake::kernels::qk_norm {
cudaError_t launch(Params const& p, cudaStream_t) {
  if (p.num_rows == 0) return cudaSuccess;
  emu::launch(Dim3{row_blocks(p.num_rows, kThreads)}, Dim3{kThreads}, {},
              [&] { qk_norm_kernel(p); });
  return cudaSuccess;
}
}  // namespace cake::kernels::qk_norm

namespace cake::kernels::qk_grad {
cudaError_t launch(Params const& p, cudaStream_t) {
  int64_t const rows = p.num_tokens * p.num_qk_heads;
  if (rows == 0) return cudaSuccess;
  emu::launch(Dim3{row_blocks(rows, kThreads)}, Dim3{kThreads}, {}, [&] { qk_grad_kernel(p); });
  return cudaSuccess;
}
}  // namespace cake::kernels::qk_grad

// launch.cu's grids and order, on the emulator.
namespace cake::kernels::gate {
alignas(16) char smem_raw[sizeof(ReduceShared)];
cudaError_t launch_forward(Params const& p, cudaStream_t) {
  if (p.num_tokens == 0 || p.num_v_heads == 0) return cudaSuccess;
  if (p.activate_g) {
    emu::launch(Dim3{flat_grid(p.num_tokens * p.num_v_heads * p.width)}, Dim3{kThreads}, {},
                [&] { gate_fwd_kernel(p); });
  }
  if (p.activate_beta) {
    emu::launch(Dim3{flat_grid(p.num_tokens * p.num_v_heads)}, Dim3{kThreads}, {},
                [&] { beta_fwd_kernel(p); });
  }
  return cudaSuccess;
}
cudaError_t launch_backward(Params const& p, cudaStream_t) {
  if (p.num_v_heads == 0) return cudaSuccess;
  int const slots = p.num_v_heads * p.width;
  if (p.num_tokens > 0 && wants_gate_bwd(p)) {
    Grid const g = tile_grid(slots, p.num_tokens);
    emu::launch(Dim3{g.x, g.y}, Dim3{kThreads}, {}, [&] { gate_bwd_kernel(p); });
  }
  if (wants_reduce(p)) {
    emu::launch(Dim3{reduce_blocks(slots)}, Dim3{kReduceThreads}, smem_raw,
                [&] { gate_reduce_kernel(p); });
    if (p.dA_log != nullptr) {
      emu::launch(Dim3{blocks(p.num_v_heads)}, Dim3{kThreads}, {}, [&] { gate_head_kernel(p); });
    }
  }
  if (p.num_tokens > 0 && wants_beta_bwd(p)) {
    emu::launch(Dim3{flat_grid(p.num_tokens * p.num_v_heads)}, Dim3{kThreads}, {},
                [&] { beta_bwd_kernel(p); });
  }
  return cudaSuccess;
}
}  // namespace cake::kernels::gate

namespace cake::kernels::conv1d_fwd {
alignas(128) char smem_raw[conv1d::ring_shared_bytes(2)];
cudaError_t launch(Params const& p, cudaStream_t) {
  return conv1d::dispatch(p.x_dtype, p.width, [&](auto variant) {
    using T = typename decltype(variant)::Type;
    constexpr int W = decltype(variant)::kWidth;
    if (has_tiles(p)) {
      conv1d::Grid const g = tile_grid<T>(p);
      emu::launch(Dim3{g.x, g.y}, Dim3{kThreads}, {smem_raw, tile_shared_bytes(p)},
                  [&] { conv1d_fwd_kernel<T, W>(p); });
    }
    if (has_states(p)) {
      conv1d::Grid const g = state_grid(p);
      emu::launch(Dim3{g.x, g.y}, Dim3{kStateThreads}, {}, [&] { conv1d_state_kernel<T, W>(p); });
    }
    return cudaSuccess;
  });
}
}  // namespace cake::kernels::conv1d_fwd

namespace cake::kernels::conv1d_bwd {
alignas(128) char smem_raw[std::max(kTileSharedBytes, sizeof(ReduceShared))];

cudaError_t launch(Params const& p, cudaStream_t) {
  return conv1d::dispatch(p.x_dtype, p.width, [&](auto variant) {
    using T = typename decltype(variant)::Type;
    constexpr int W = decltype(variant)::kWidth;
    if (has_tiles(p)) {
      conv1d::Grid const g = tile_grid<T>(p);
      emu::launch(Dim3{g.x, g.y}, Dim3{kThreads}, {smem_raw, kTileSharedBytes},
                  [&] { conv1d_bwd_kernel<T, W>(p); });
    }
    if (has_states(p)) {
      conv1d::Grid const g = state_grid(p);
      emu::launch(Dim3{g.x, g.y}, Dim3{kStateThreads}, {},
                  [&] { conv1d_state_bwd_kernel<T, W>(p); });
    }
    if (has_reduce(p)) {
      conv1d::Grid const g = reduce_grid(p);
      emu::launch(Dim3{g.x, g.y}, Dim3{kReduceThreads}, {smem_raw, sizeof(ReduceShared)},
                  [&] { conv1d_reduce_kernel(p); });
    }
    return cudaSuccess;
  });
}
}  // namespace cake::kernels::conv1d_bwd

namespace cake::kernels::norm_fwd {
alignas(16) char smem_raw[4 * 1024];  // the weight of the widest row, N = 1024
cudaError_t launch(Params const& p, cudaStream_t) {
  if (p.rows == 0) return cudaSuccess;
  return norm::dispatch(p.x_dtype, p.layout.slots, [&](auto variant) {
    using T = typename decltype(variant)::Type;
    constexpr int S = decltype(variant)::kSlots;
    emu::launch(Dim3{u(p.layout.num_blocks)}, Dim3{kThreads}, {smem_raw, smem_bytes(p)},
                [&] { norm_fwd_kernel<T, S>(p); });
    return cudaSuccess;
  });
}
}  // namespace cake::kernels::norm_fwd

namespace cake::kernels::norm_bwd {
alignas(16) char smem_raw[4 * 1024 * (1 + kWarps)];  // weight and warp sums at N = 1024
cudaError_t launch(Params const& p, cudaStream_t) {
  return norm::dispatch(p.x_dtype, p.layout.slots, [&](auto variant) {
    using T = typename decltype(variant)::Type;
    constexpr int S = decltype(variant)::kSlots;
    if (p.rows > 0) {
      emu::launch(Dim3{u(p.layout.num_blocks)}, Dim3{kThreads}, {smem_raw, smem_bytes(p)},
                  [&] { norm_bwd_kernel<T, S>(p); });
    }
    if (p.dweight != nullptr) {
      emu::launch(Dim3{reduce_blocks(p)}, Dim3{kReduceThreads}, {smem_raw, kReduceSmemBytes},
                  [&] { norm_reduce_kernel(p); });
    }
    return cudaSuccess;
  });
}
}  // namespace cake::kernels::norm_bwd

// tensor_map_encode.hpp's functions, in the emulator's encoding, refusing what the driver's
// cuTensorMapEncodeTiled refuses (so that a call the GPU would fail fails here too): a dimension
// of 0 or over 2^32 elements, a base not 16-byte aligned, a stride not a multiple of 16 bytes.
namespace cake::kernels {
namespace {
bool driver_accepts(void const* base, std::initializer_list<uint64_t> dims,
                    std::initializer_list<uint64_t> strides) {
  for (uint64_t d : dims)
    if (d == 0 || d > (uint64_t{1} << 32)) return false;
  for (uint64_t s : strides)
    if (s % 16 != 0) return false;
  return reinterpret_cast<uintptr_t>(base) % 16 == 0;
}
}  // namespace
cudaError_t encode_tile_map(TensorMap& map, void const* base, int64_t tokens, int heads, int cols) {
  TileMapShape const m = tile_map_shape(tokens, heads, cols);
  if (!driver_accepts(base, {m.dims[0], m.dims[1]}, {m.stride})) return cudaErrorInvalidValue;
  encode_tensor_map_3d(map, base, 2, {m.dims[0], m.dims[1], 1}, {m.stride, m.stride * m.dims[1]},
                       {m.box[0], m.box[1], 1}, true);
  return cudaSuccess;
}
cudaError_t encode_h_map(TensorMap& map, void const* h, int64_t num_slots, int HV) {
  HMapShape const m = h_map_shape(num_slots, HV);
  if (!driver_accepts(h, {m.dims[0], m.dims[1], m.dims[2]}, {m.strides[0], m.strides[1]}))
    return cudaErrorInvalidValue;
  encode_tensor_map_3d(map, h, 2, {m.dims[0], m.dims[1], m.dims[2]}, {m.strides[0], m.strides[1]},
                       {m.box[0], m.box[1], m.box[2]}, true);
  return cudaSuccess;
}
}  // namespace cake::kernels

namespace cake::kernels::walk_a_fwd {
namespace roles {
alignas(1024) char smem_raw[std::max(sizeof(SharedStorage<ScalarDecay>),
                                     sizeof(SharedStorage<ChannelDecay>))];
}  // namespace roles
// launch.cu checks and launches as here
template <class Decay>
cudaError_t launch(Params const& p, cudaStream_t) {
  if (p.walk_done != nullptr && p.o != nullptr) return cudaErrorInvalidValue;
  if (p.o == nullptr && p.h == nullptr) return cudaErrorInvalidValue;
  Problem const& pr = p.problem;
  roles::RolesParams rp{p, {}, {}, {}, {}, {}, {}, {}};
  if (cudaError_t const err = encode_maps<Decay>(rp); err != cudaSuccess) return err;
  int64_t const num_walks = int64_t{pr.num_seqs} * pr.num_v_heads;
  bool const split = split_walks(num_walks, multiprocessor_count);
  Dim3 const grid{u(num_walks * (split ? kSlicesOfH : 1))};
  auto const run = [&](auto kernel) {
    emu::launch(grid, Dim3{roles::kThreads}, roles::smem_raw, [&] { kernel(rp); });
  };
  if (split) {
    if (p.o != nullptr)
      run(roles::walk_a_fwd_roles_kernel<Decay, true, kSlicesOfH>);
    else
      run(roles::walk_a_fwd_roles_kernel<Decay, false, kSlicesOfH>);
  } else {
    if (p.o != nullptr)
      run(roles::walk_a_fwd_roles_kernel<Decay, true, 1>);
    else
      run(roles::walk_a_fwd_roles_kernel<Decay, false, 1>);
  }
  return cudaSuccess;
}
template cudaError_t launch<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch<ChannelDecay>(Params const&, cudaStream_t);
}  // namespace cake::kernels::walk_a_fwd

namespace cake::kernels::walk_a_bwd {
alignas(1024) char smem_raw[std::max(sizeof(SharedStorage<ScalarDecay>),
                                     sizeof(SharedStorage<ChannelDecay>))];
// launch.cu checks and launches as here (the walk, the chunk pass and the dS-walk, split on the
// emulated SM count as launch.cu splits it on the device's)
template <class Decay, Form kForm, int kSlices>
cudaError_t launch_form(Params const& p, int64_t blocks) {
  if (Decay::kGatedKkt && p.eo_split) return cudaErrorInvalidValue;
  KernelParams kp{p, {}, {}, {}, {}, {}, {}, {}, {}};
  if (cudaError_t const err = encode_maps<Decay, kForm == Form::kDsWalk>(kp); err != cudaSuccess)
    return err;
  emu::launch(Dim3{u(blocks)}, Dim3{kThreads}, smem_raw,
              [&] { walk_a_bwd_kernel<Decay, kForm, kSlices>(kp); });
  return cudaSuccess;
}
template <class Decay>
cudaError_t launch(Params const& p, cudaStream_t) {
  Problem const& pr = p.problem;
  if (p.ds_end_out != nullptr) return cudaErrorInvalidValue;
  if (p.ds_end == nullptr)
    return launch_form<Decay, Form::kWalk, 1>(p, int64_t{pr.num_seqs} * pr.num_v_heads);
  if (p.dh0 != nullptr) return cudaErrorInvalidValue;
  return launch_form<Decay, Form::kChunkPass, 1>(p, pr.num_slots * pr.num_v_heads);
}
template <class Decay>
cudaError_t launch_ds_walk(Params const& p, cudaStream_t) {
  Problem const& pr = p.problem;
  if (p.ds_end_out == nullptr || p.ds_end != nullptr || p.order != nullptr)
    return cudaErrorInvalidValue;
  int64_t const num_walks = int64_t{pr.num_seqs} * pr.num_v_heads;
  if (walk_a_fwd::split_walks(num_walks, multiprocessor_count))
    return launch_form<Decay, Form::kDsWalk, kSlicesOfH>(p, num_walks * kSlicesOfH);
  return launch_form<Decay, Form::kDsWalk, 1>(p, num_walks);
}
template cudaError_t launch<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch<ChannelDecay>(Params const&, cudaStream_t);
template cudaError_t launch_ds_walk<ScalarDecay>(Params const&, cudaStream_t);
template cudaError_t launch_ds_walk<ChannelDecay>(Params const&, cudaStream_t);
}  // namespace cake::kernels::walk_a_bwd
