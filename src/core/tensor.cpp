#include "core/tensor.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.hpp"

namespace cake {

namespace {

// bfloat16 is the top half of a float32; round to nearest even, keep NaN a NaN.
uint16_t float_to_bf16(float f) {
  uint32_t const u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t const rounding = 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// IEEE binary16 <-> double. Written out (no _Float16) so that any host compiler builds it.
double half_to_double(uint16_t h) {
  int const sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double value;
  if (exponent == 0) {
    value = std::ldexp(mantissa, -24);  // subnormal
  } else if (exponent == 31) {
    value = mantissa ? NAN : INFINITY;
  } else {
    value = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -value : value;
}

uint16_t double_to_half(double x) {
  uint16_t const sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7e00;
  double const a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;  // rounds to infinity
  if (a < std::ldexp(1.0, -14)) {          // subnormal range: units of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
  }
  int exponent;
  double const fraction = std::frexp(a, &exponent);                   // a = fraction * 2^exponent
  double mantissa = std::nearbyint(std::ldexp(fraction, 11));         // in [1024, 2048]
  if (mantissa == 2048) {
    mantissa = 1024;
    ++exponent;
  }
  return sign | static_cast<uint16_t>(((exponent + 14) << 10) | (static_cast<int>(mantissa) - 1024));
}

double load(void const* base, int64_t offset, cakeDtype_t dtype) {
  char const* p = static_cast<char const*>(base) + offset * element_size(dtype);
  switch (dtype) {
    case cakeFloat64: { double x; std::memcpy(&x, p, 8); return x; }
    case cakeFloat32: { float x; std::memcpy(&x, p, 4); return x; }
    case cakeBfloat16: { uint16_t x; std::memcpy(&x, p, 2); return bf16_to_float(x); }
    case cakeFloat16: { uint16_t x; std::memcpy(&x, p, 2); return half_to_double(x); }
    case cakeInt32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case cakeInt64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
  }
  return 0;
}

void store(void* base, int64_t offset, cakeDtype_t dtype, double value) {
  char* p = static_cast<char*>(base) + offset * element_size(dtype);
  switch (dtype) {
    case cakeFloat64: { std::memcpy(p, &value, 8); return; }
    case cakeFloat32: { float x = static_cast<float>(value); std::memcpy(p, &x, 4); return; }
    case cakeBfloat16: {
      uint16_t x = float_to_bf16(static_cast<float>(value));  // double->float rounds first
      std::memcpy(p, &x, 2);
      return;
    }
    case cakeFloat16: { uint16_t x = double_to_half(value); std::memcpy(p, &x, 2); return; }
    default: throw Error(cakeInternalError, "store: not a float dtype");
  }
}

// Calls f(dense_index, strided_offset) for every element in row-major order.
template <class F>
void for_each_element(cakeTensor_t const& t, F const& f) {
  int64_t const n = numel(t);
  int64_t index[CAKE_MAX_DIMS] = {};
  int64_t offset = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, offset);
    for (int d = t.ndim - 1; d >= 0; --d) {
      offset += t.strides[d];
      if (++index[d] < t.shape[d]) break;
      offset -= t.strides[d] * t.shape[d];
      index[d] = 0;
    }
  }
}

}  // namespace

int64_t element_size(cakeDtype_t dtype) {
  switch (dtype) {
    case cakeFloat64: case cakeInt64: return 8;
    case cakeFloat32: case cakeInt32: return 4;
    case cakeBfloat16: case cakeFloat16: return 2;
  }
  return 0;
}

bool is_float(cakeDtype_t dtype) {
  return dtype == cakeFloat32 || dtype == cakeFloat64 || dtype == cakeBfloat16 ||
         dtype == cakeFloat16;
}

char const* dtype_name(cakeDtype_t dtype) {
  switch (dtype) {
    case cakeFloat32: return "float32";
    case cakeFloat64: return "float64";
    case cakeBfloat16: return "bfloat16";
    case cakeFloat16: return "float16";
    case cakeInt32: return "int32";
    case cakeInt64: return "int64";
  }
  return "unknown dtype";
}

std::string shape_string(std::vector<int64_t> const& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < shape.size(); ++d) os << (d ? ", " : "") << shape[d];
  os << "]";
  return os.str();
}

std::string shape_string(cakeTensor_t const& t) {
  return shape_string(std::vector<int64_t>(t.shape, t.shape + t.ndim));
}

std::string device_string(cakeTensor_t const& t) {
  if (t.device_type == cakeCPU) return "cpu";
  if (t.device_type == cakeCUDA) return concat("cuda:", t.device_id);
  return concat("device type ", t.device_type);
}

int64_t numel(cakeTensor_t const& t) {
  int64_t n = 1;
  for (int d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return n;
}

cakeTensor_t dense_view(void* data, cakeDtype_t dtype, int32_t device_type,
                        std::vector<int64_t> const& shape) {
  cakeTensor_t t{};
  t.data = data;
  t.dtype = dtype;
  t.device_type = device_type;
  t.ndim = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.strides[d] = stride;
    stride *= shape[d];
  }
  return t;
}

bool is_contiguous(cakeTensor_t const& t) {
  if (numel(t) == 0) return true;  // no element to misplace; torch gives such tensors any strides
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] != 1 && t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

std::vector<double> to_double(cakeTensor_t const& t) {
  std::vector<double> x(numel(t));
  for_each_element(t, [&](int64_t i, int64_t offset) { x[i] = load(t.data, offset, t.dtype); });
  return x;
}

void from_double(std::vector<double> const& x, cakeTensor_t const& t) {
  for_each_element(t, [&](int64_t i, int64_t offset) { store(t.data, offset, t.dtype, x[i]); });
}

std::vector<int64_t> to_int64(cakeTensor_t const& t) {
  std::vector<int64_t> x(numel(t));
  for_each_element(t, [&](int64_t i, int64_t offset) {
    if (t.dtype == cakeInt32) {
      int32_t v;
      std::memcpy(&v, static_cast<char const*>(t.data) + offset * 4, 4);
      x[i] = v;
    } else {
      std::memcpy(&x[i], static_cast<char const*>(t.data) + offset * 8, 8);
    }
  });
  return x;
}

}  // namespace cake
