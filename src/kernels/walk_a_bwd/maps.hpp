// The TMA maps of a reverse-walk launch, encoded from its Params into KernelParams: the one
// sequence that launch.cu and the CPU emulator's launch (tests/emu/launch_emu.cpp, whose
// encode_tile_map / encode_h_map follow the driver's rules) both run, so that they encode alike.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common/tensor_map.hpp"
#include "kernels/common/tensor_map_encode.hpp"
#include "kernels/walk_a_bwd/kernel.cuh"

namespace cake::kernels::walk_a_bwd {

// The maps the instantiation reads (ChannelDecay: qg, kg [BT, HV, 128] in Q's and K's places,
// kbar and the gated Q K^T; the dS-walk reads neither V nor h); the first failure, or cudaSuccess.
template <class Decay, bool kDsWalk = false>
cudaError_t encode_maps(KernelParams& kp) {
  Params const& p = kp.p;
  Problem const& pr = p.problem;
  if (!tma_coordinates_fit(pr.num_tokens, pr.num_slots, pr.num_v_heads))
    return cudaErrorInvalidValue;
  bool const channel = Decay::kGatedKkt;
  int const qk_heads = channel ? pr.num_v_heads : pr.num_qk_heads;
  for (cudaError_t err :
       {encode_tile_map(kp.q_map, p.q, pr.num_tokens, qk_heads, kHeadDim),
        encode_tile_map(kp.k_map, p.k, pr.num_tokens, qk_heads, kHeadDim),
        channel ? encode_tile_map(kp.kbar_map, p.kbar, pr.num_tokens, pr.num_v_heads, kHeadDim)
                : cudaSuccess,
        channel ? encode_tile_map(kp.aqk_map, p.aqk, pr.num_tokens, pr.num_v_heads, kChunk)
                : cudaSuccess,
        kDsWalk ? cudaSuccess
                : encode_tile_map(kp.v_map, p.v, pr.num_tokens, pr.num_v_heads, kHeadDim),
        encode_tile_map(kp.dout_map, p.dout, pr.num_tokens, pr.num_v_heads, kHeadDim),
        encode_tile_map(kp.a_map, p.a, pr.num_tokens, pr.num_v_heads, kChunk),
        kDsWalk ? cudaSuccess : encode_h_map(kp.h_map, p.h, pr.num_slots, pr.num_v_heads)})
    if (err != cudaSuccess) return err;
  return cudaSuccess;
}

}  // namespace cake::kernels::walk_a_bwd
