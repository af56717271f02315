#include "binding/view.hpp"

#include <string>

#include "core/error.hpp"

namespace nb = nanobind;

namespace cake::binding {

namespace {

cakeDtype_t dtype_of(nb::dlpack::dtype dt, char const* name) {
  using Code = nb::dlpack::dtype_code;
  auto const code = static_cast<Code>(dt.code);
  if (dt.lanes == 1) {
    if (code == Code::Float && dt.bits == 32) return cakeFloat32;
    if (code == Code::Float && dt.bits == 64) return cakeFloat64;
    if (code == Code::Float && dt.bits == 16) return cakeFloat16;
    if (code == Code::Bfloat && dt.bits == 16) return cakeBfloat16;
    if (code == Code::Int && dt.bits == 32) return cakeInt32;
    if (code == Code::Int && dt.bits == 64) return cakeInt64;
  }
  char const* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string const got = (dt.code < 7 ? kinds[dt.code] : "code" + std::to_string(dt.code)) +
                          std::to_string(dt.bits) +
                          (dt.lanes == 1 ? "" : "x" + std::to_string(dt.lanes));
  throw cake::Error(cakeInvalidArgument,
                    cake::concat(name, " has an unsupported dtype ", got,
                                 ": cake takes float16, bfloat16, float32, float64, int32 and "
                                 "int64"));
}

alignas(256) char placeholder_bytes[256];

}  // namespace

void* placeholder() { return placeholder_bytes; }

cakeTensor_t view(OptionalArray const& a, char const* name) {
  cakeTensor_t t{};
  if (!a) return t;
  if (a->ndim() > CAKE_MAX_DIMS) {
    std::string shape;
    for (size_t d = 0; d < a->ndim(); ++d) shape += (d ? ", " : "") + std::to_string(a->shape(d));
    throw cake::Error(cakeInvalidArgument,
                      cake::concat(name, " has ", a->ndim(), " dimensions (shape [", shape,
                                   "]); cake's tensors have at most ", CAKE_MAX_DIMS));
  }
  t.data = a->data();
  t.dtype = dtype_of(a->dtype(), name);
  t.device_type = a->device_type();
  t.device_id = a->device_id();
  t.ndim = static_cast<int32_t>(a->ndim());
  for (size_t d = 0; d < a->ndim(); ++d) {
    t.shape[d] = a->shape(d);
    t.strides[d] = a->stride(d);
  }
  // A tensor with no elements may come without a data pointer; keep "present" meaning present.
  if (t.data == nullptr) t.data = placeholder();
  return t;
}

std::pair<void*, size_t> buffer_of(OptionalArray const& buffer) {
  if (!buffer) return {nullptr, 0};
  return {buffer->data(), buffer->nbytes()};
}

}  // namespace cake::binding
