#include "ops/checks.hpp"

#include <cstdint>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace cake::ops {

void check_present(char const* name, cakeTensor_t const& t) {
  CAKE_CHECK(present(t), cakeInvalidArgument, name, " is required but was not given");
}

void check_float(char const* name, cakeTensor_t const& t) {
  CAKE_CHECK(is_float(t.dtype), cakeInvalidArgument, name,
             " must be a float tensor (float16, bfloat16, float32 or float64), got ",
             dtype_name(t.dtype));
}

void check_shape(char const* name, cakeTensor_t const& t, std::vector<int64_t> const& expected,
                 char const* meaning) {
  bool same = t.ndim == static_cast<int>(expected.size());
  for (int d = 0; same && d < t.ndim; ++d) same = t.shape[d] == expected[d];
  CAKE_CHECK(same, cakeInvalidArgument, name, " must have shape ", meaning, " = ",
             cake::shape_string(expected), ", got ", cake::shape_string(t));
}

void check_same_device(char const* name, cakeTensor_t const& t, char const* like_name,
                       cakeTensor_t const& like) {
  CAKE_CHECK(t.device_type == like.device_type && t.device_id == like.device_id,
             cakeInvalidArgument, name, " must be on ", like_name, "'s device (",
             device_string(like), "), got ", device_string(t));
}

void check_output(char const* name, cakeTensor_t const& t, std::vector<int64_t> const& shape,
                  char const* meaning, char const* like_name, cakeTensor_t const& like) {
  check_float(name, t);
  check_shape(name, t, shape, meaning);
  check_same_device(name, t, like_name, like);
  CAKE_CHECK(is_contiguous(t), cakeInvalidArgument, name, " must be contiguous, got shape ",
             cake::shape_string(t), " with non-row-major strides");
}

void check_optional_output(char const* name, cakeTensor_t const& t, bool allowed, char const* needs,
                           std::vector<int64_t> const& shape, char const* meaning,
                           char const* like_name, cakeTensor_t const& like) {
  if (!present(t)) return;
  CAKE_CHECK(allowed, cakeInvalidArgument, name, " can only be computed with ", needs);
  check_output(name, t, shape, meaning, like_name, like);
}

int64_t check_cu_seqlens(cakeTensor_t const& cu, int64_t batch) {
  CAKE_CHECK(cu.dtype == cakeInt32 || cu.dtype == cakeInt64, cakeInvalidArgument,
             "cu_seqlens must be int32 or int64, got ", dtype_name(cu.dtype));
  CAKE_CHECK(cu.ndim == 1 && cu.shape[0] >= 2, cakeInvalidArgument,
             "cu_seqlens must have shape [N + 1] with N >= 1 documents, got shape ",
             cake::shape_string(cu));
  CAKE_CHECK(batch == 1, cakeInvalidArgument,
             "the batch size B must be 1 when cu_seqlens is given (flatten the packed "
             "documents into [1, T, ...]), got B = ",
             batch);
  return cu.shape[0] - 1;
}

void check_cu_seqlens_contents(cakeTensor_t const& cu_seqlens, int64_t seq_len) {
  std::vector<int64_t> const cu = to_int64(cu_seqlens);
  CAKE_CHECK(cu.front() == 0, cakeInvalidArgument, "cu_seqlens must start at 0, got ", cu.front());
  for (size_t i = 1; i < cu.size(); ++i) {
    CAKE_CHECK(cu[i] >= cu[i - 1], cakeInvalidArgument,
               "cu_seqlens must be non-decreasing, got cu_seqlens[", i - 1, "] = ", cu[i - 1],
               " > cu_seqlens[", i, "] = ", cu[i]);
  }
  CAKE_CHECK(cu.back() == seq_len, cakeInvalidArgument,
             "cu_seqlens must end at the number of tokens T = ", seq_len, ", got ", cu.back());
}

void check_cuda_x_dtype(cakeTensor_t const& x, std::initializer_list<NamedTensor> like_x) {
  CAKE_CHECK(x.dtype == cakeBfloat16 || x.dtype == cakeFloat16 || x.dtype == cakeFloat32,
             cakeInvalidArgument,
             "x must be bfloat16, float16 or float32 for the CUDA kernels, got ",
             dtype_name(x.dtype));
  for (auto [name, t] : like_x) {
    if (!present(*t)) continue;
    CAKE_CHECK(t->dtype == x.dtype, cakeInvalidArgument, name, " must have x's dtype (",
               dtype_name(x.dtype), ") for the CUDA kernels, got ", dtype_name(t->dtype));
  }
}

void check_cuda_small_dtypes(std::initializer_list<NamedTensor> tensors) {
  for (auto [name, t] : tensors) {
    if (!present(*t)) continue;
    CAKE_CHECK(t->dtype == cakeFloat32 || t->dtype == cakeBfloat16 || t->dtype == cakeFloat16,
               cakeInvalidArgument, name,
               " must be float32, bfloat16 or float16 for the CUDA kernels, got ",
               dtype_name(t->dtype));
  }
}

void check_cuda_contiguous(std::initializer_list<NamedTensor> tensors) {
  for (auto [name, t] : tensors) {
    if (!present(*t)) continue;
    CAKE_CHECK(is_contiguous(*t), cakeInvalidArgument, name,
               " must be contiguous for the CUDA kernels (call .contiguous()), got strides that "
               "are not row-major for shape ",
               shape_string(*t));
  }
}

namespace {

// The bytes a strided view can reach: [first, last) as addresses, empty when it has no elements.
struct ByteSpan {
  uintptr_t first = 0, last = 0;
};

ByteSpan span_of(cakeTensor_t const& t) {
  if (numel(t) == 0) return {};
  int64_t low = 0, high = 0;  // element offsets of the lowest and highest reachable elements
  for (int d = 0; d < t.ndim; ++d) {
    int64_t const reach = (t.shape[d] - 1) * t.strides[d];
    (reach < 0 ? low : high) += reach;
  }
  int64_t const size = element_size(t.dtype);
  auto const base = reinterpret_cast<uintptr_t>(t.data);
  return {base + static_cast<uintptr_t>(low * size),
          base + static_cast<uintptr_t>((high + 1) * size)};
}

void check_apart(NamedTensor a, NamedTensor b) {
  auto [a_name, a_t] = a;
  auto [b_name, b_t] = b;
  if (!present(*a_t) || !present(*b_t) || a_t->device_type != b_t->device_type ||
      a_t->device_id != b_t->device_id) {
    return;
  }
  ByteSpan const x = span_of(*a_t), y = span_of(*b_t);
  bool const apart =
      x.first == x.last || y.first == y.last || x.last <= y.first || y.last <= x.first;
  CAKE_CHECK(apart, cakeInvalidArgument, a_name, " must not share memory with ", b_name,
             " (the kernels read their inputs while they write their outputs; in-place calls "
             "are not supported): pass a separate tensor");
}

}  // namespace

void check_no_overlap(std::vector<NamedTensor> const& outputs,
                      std::vector<NamedTensor> const& inputs) {
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    for (NamedTensor in : inputs) check_apart(*out, in);
    for (auto other = outputs.begin(); other != out; ++other) check_apart(*out, *other);
  }
}

}  // namespace cake::ops
