"""cake's C ABI (the extension ``cake._C``) as Python functions that raise.

Every function of ``cake._C`` returns ``(code, message, value)`` so that no C++ exception crosses
the binding; here a failure becomes the Python exception of its code (include/cake/cake.h):
``ValueError`` for invalid arguments, calls a device does not support and short buffers,
``NotImplementedError`` where a device has no implementation, ``RuntimeError`` for CUDA errors and
bugs. The functions take the C ABI's arguments in its order (cake/ops.py passes them).
"""

import functools
import json
import types

from torch import Tensor
from torch.utils.dlpack import to_dlpack

from . import _C

INVALID_ARGUMENT, NOT_SUPPORTED, INSUFFICIENT_WORKSPACE, CUDA_ERROR, INTERNAL_ERROR, \
    NOT_IMPLEMENTED = 1, 2, 3, 4, 5, 6
CPU, CUDA = 1, 2  # cakeDeviceType_t


def error(code: int, message: str) -> Exception:
    """The Python exception of a failed call's code and message."""
    if code in (INVALID_ARGUMENT, NOT_SUPPORTED, INSUFFICIENT_WORKSPACE):
        return ValueError(message)
    if code == NOT_IMPLEMENTED:
        return NotImplementedError(message)
    if code == CUDA_ERROR:
        return RuntimeError(f"CUDA error: {message}")
    return RuntimeError(f"cake internal error (please report it): {message}")


def _exported(x):
    """A tensor as a DLPack capsule of its data, other arguments as they are. Through the capsule
    the binding neither synchronises nor switches streams, whatever the torch version's
    ``__dlpack__`` does by default (some make the legacy default stream wait on every export,
    which breaks CUDA-graph capture); the kernels run on the stream the call names."""
    return to_dlpack(x.detach()) if isinstance(x, Tensor) else x


def _raising(raw):
    @functools.wraps(raw)
    def call(*args, **kwargs):
        code, message, value = raw(*map(_exported, args),
                                   **{k: _exported(v) for k, v in kwargs.items()})
        if code:
            raise error(code, message)
        return value
    return call


forward = _raising(_C.forward)
backward = _raising(_C.backward)
forward_workspace_size = _raising(_C.forward_workspace_size)
forward_saved_size = _raising(_C.forward_saved_size)
backward_workspace_size = _raising(_C.backward_workspace_size)
cuda_saved_size_of_shapes = _raising(_C.cuda_saved_size_of_shapes)
conv1d_forward = _raising(_C.conv1d_forward)
conv1d_backward = _raising(_C.conv1d_backward)
conv1d_forward_workspace_size = _raising(_C.conv1d_forward_workspace_size)
conv1d_backward_workspace_size = _raising(_C.conv1d_backward_workspace_size)
norm_forward = _raising(_C.norm_forward)
norm_backward = _raising(_C.norm_backward)
norm_backward_workspace_size = _raising(_C.norm_backward_workspace_size)


def support_error(*args, device_type: int):
    """The exception that device_type's implementation would raise for this forward call (the
    forward's arguments, as forward_saved_size takes them), or None where it would run it."""
    code, message, _ = _C.check_support(*map(_exported, args), device_type)
    return error(code, message) if code else None


def conv1d_support_error(*args, device_type: int):
    """As support_error, for the conv's forward arguments (as conv1d_forward_workspace_size takes
    them)."""
    code, message, _ = _C.conv1d_check_support(*map(_exported, args), device_type)
    return error(code, message) if code else None


def norm_support_error(*args, device_type: int):
    """As support_error, for the norm's forward arguments (as norm_forward takes them, without
    the stream)."""
    code, message, _ = _C.norm_check_support(*map(_exported, args), device_type)
    return error(code, message) if code else None


def build_info() -> dict:
    """cakeGetBuildInfo, parsed."""
    return json.loads(_raising(_C.build_info)())


kcp = types.SimpleNamespace(
    CHUNK_SIZE=_C.kcp.CHUNK_SIZE,
    MAX_SEGMENTS=_C.kcp.MAX_SEGMENTS,
    **{name: _raising(getattr(_C.kcp, name))
       for name in ("partition", "layout_ranges", "partition_ranges", "summary_exchange",
                    "plan_segments", "segment_bounds")})
