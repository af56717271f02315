// DLPack arrays (torch, numpy, ...) as the C ABI's cakeTensor_t, for every binding file.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <optional>
#include <utility>

#include "cake/cake.h"

namespace cake::binding {

using OptionalArray = std::optional<nanobind::ndarray<>>;

// The view of a (possibly absent) array; throws cake::Error naming `name` for an unsupported
// dtype or too many dimensions. A present array without a data pointer (no elements) gets
// placeholder() as its data, so that present keeps meaning present.
cakeTensor_t view(OptionalArray const& a, char const* name);

// Stands for the data of a tensor that is present but has no data pointer (no elements, or a
// shape-only query): non-NULL, 256-byte aligned as the kernels require.
void* placeholder();

// A byte buffer (workspace or saved set): None is NULL with 0 bytes.
std::pair<void*, size_t> buffer_of(OptionalArray const& buffer);

}  // namespace cake::binding
