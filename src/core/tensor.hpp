// Host-side helpers over cakeTensor_t: names for messages, and conversion of CPU tensors of any
// float dtype and any strides to and from dense FP64 arrays (the reference computes in FP64).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cake/cake.h"

namespace cake {

inline bool present(cakeTensor_t const& t) { return t.data != nullptr; }

bool is_float(cakeDtype_t dtype);
char const* dtype_name(cakeDtype_t dtype);   // "bfloat16", ...
int64_t element_size(cakeDtype_t dtype);     // bytes of one element
std::string shape_string(cakeTensor_t const& t);          // "[1, 128, 4, 64]"
std::string shape_string(std::vector<int64_t> const& shape);
std::string device_string(cakeTensor_t const& t);  // "cpu", "cuda:0"
int64_t numel(cakeTensor_t const& t);

// A dense row-major view of data with the given shape (at most CAKE_MAX_DIMS dimensions).
cakeTensor_t dense_view(void* data, cakeDtype_t dtype, int32_t device_type,
                        std::vector<int64_t> const& shape);
bool is_contiguous(cakeTensor_t const& t);

// Reads a CPU tensor into a dense row-major FP64 array (strides honoured).
std::vector<double> to_double(cakeTensor_t const& t);

// Writes a dense row-major FP64 array into a CPU tensor, rounding to its dtype (nearest even).
void from_double(std::vector<double> const& x, cakeTensor_t const& t);

// Reads an int32/int64 CPU tensor of one dimension.
std::vector<int64_t> to_int64(cakeTensor_t const& t);

}  // namespace cake
