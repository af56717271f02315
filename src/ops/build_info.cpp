// cakeGetBuildInfo: what this library was built with and what each implementation accepts, as one
// JSON object (cake.build_info() parses it).
#include <sstream>
#include <string>

#include "cake/cake.h"
#include "ops/activations_cuda.hpp"
#include "ops/conv1d_dispatch.hpp"
#include "ops/dispatch.hpp"
#include "ops/norm_dispatch.hpp"

namespace {

// s as a JSON string literal (the texts here are ASCII without control characters).
std::string quoted(std::string const& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

char const* compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

std::string build_info() {
  cake::ops::CudaBuild const cuda = cake::ops::cuda_build();
  std::ostringstream os;
  os << "{\"cuda_kernels\": " << (cuda.kernels ? "true" : "false") << ", \"cuda_architectures\": ["
     << (cuda.kernels ? quoted(cuda.architectures) : "")
     << "], \"cuda_runtime_version\": " << cuda.runtime_version
     << ", \"compiler\": " << quoted(compiler()) << ", \"ops\": {";
  for (cakeVariant_t variant : {cakeGdn, cakeKda}) {
    os << (variant ? ", " : "") << quoted(cake::ops::op_name(variant)) << ": {";
    bool first = true;
    for (auto* row = cake::ops::implementations_begin(); row != cake::ops::implementations_end();
         ++row) {
      if (row->variant != variant) continue;
      // A CUDA row is listed when its kernels are compiled in.
      if (row->device_type == cakeCUDA && !cuda.kernels) continue;
      os << (first ? "" : ", ") << quoted(row->device_type == cakeCPU ? "cpu" : "cuda") << ": "
         << quoted(row->support);
      first = false;
    }
    os << "}";
  }
  // One op's rows: {"cpu": ..., "cuda": ...}, a CUDA row where its kernels are compiled in.
  auto rows = [&](char const* name, auto const* begin, auto const* end) {
    os << ", " << quoted(name) << ": {";
    bool first = true;
    for (auto* row = begin; row != end; ++row) {
      if (row->device_type == cakeCUDA && !cuda.kernels) continue;
      os << (first ? "" : ", ") << quoted(row->device_type == cakeCPU ? "cpu" : "cuda") << ": "
         << quoted(row->support);
      first = false;
    }
    os << "}";
  };
  rows(cake::ops::kConv1dOpName, cake::ops::conv1d_implementations_begin(),
       cake::ops::conv1d_implementations_end());
  rows(cake::ops::kNormOpName, cake::ops::norm_implementations_begin(),
       cake::ops::norm_implementations_end());
  os << "}}";
  return os.str();
}

}  // namespace

extern "C" const char* cakeGetBuildInfo(void) {
  try {
    static std::string const info = build_info();
    return info.c_str();
  } catch (...) {  // out of host memory: no entry point throws
    return "{}";
  }
}
