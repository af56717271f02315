// The argument checks shared by the ops' validations (validate.cpp, conv1d_validate.cpp,
// norm_validate.cpp) and their CUDA support rules (conv1d_support.cpp, norm_support.cpp): each
// throws a cake::Error (cakeInvalidArgument) naming the argument, the expected and the actual.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "cake/cake.h"

namespace cake::ops {

void check_present(char const* name, cakeTensor_t const& t);
void check_float(char const* name, cakeTensor_t const& t);
// meaning: the shape in symbols, e.g. "[B, T, HV]".
void check_shape(char const* name, cakeTensor_t const& t, std::vector<int64_t> const& expected,
                 char const* meaning);
// t on the device of `like` (named like_name in the message).
void check_same_device(char const* name, cakeTensor_t const& t, char const* like_name,
                       cakeTensor_t const& like);

// An output (or gradient) tensor: float, the expected shape, on like's device, contiguous.
void check_output(char const* name, cakeTensor_t const& t, std::vector<int64_t> const& shape,
                  char const* meaning, char const* like_name, cakeTensor_t const& like);
// A gradient is optional (absent: not computed); some exist only with their input (allowed).
void check_optional_output(char const* name, cakeTensor_t const& t, bool allowed, char const* needs,
                           std::vector<int64_t> const& shape, char const* meaning,
                           char const* like_name, cakeTensor_t const& like);

// cu_seqlens' dtype and shape [N + 1], and B = 1 with it; returns N.
int64_t check_cu_seqlens(cakeTensor_t const& cu_seqlens, int64_t batch);
// Its contents (start 0, non-decreasing, end seq_len), for CPU tensors only: reading CUDA offsets
// on the host would synchronise the device (cake.h).
void check_cu_seqlens_contents(cakeTensor_t const& cu_seqlens, int64_t seq_len);

// The CUDA kernels' rules on tensors, an absent one passing (name, tensor):
using NamedTensor = std::pair<char const*, cakeTensor_t const*>;
// x bfloat16, float16 or float32, and the tensors read and written in x's dtype with it.
void check_cuda_x_dtype(cakeTensor_t const& x, std::initializer_list<NamedTensor> like_x);
// The small tensors (weights, biases, states), read and written through a runtime dtype:
// float32, bfloat16 or float16, whatever x's.
void check_cuda_small_dtypes(std::initializer_list<NamedTensor> tensors);
void check_cuda_contiguous(std::initializer_list<NamedTensor> tensors);

// No output shares memory with an input or with another output: the kernels read their inputs
// while they write their outputs, so an in-place call (y over x, dx over dy) would read values
// already overwritten. Absent tensors and tensors of no elements pass.
void check_no_overlap(std::vector<NamedTensor> const& outputs,
                      std::vector<NamedTensor> const& inputs);

}  // namespace cake::ops
