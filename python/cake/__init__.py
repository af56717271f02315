"""cake: chunked linear-attention training kernels (Gated DeltaNet and Kimi Delta Attention).

Drop-in for flash-linear-attention: ``from cake import chunk_gated_delta_rule, chunk_kda`` and
the short convolution before them, ``cake.causal_conv1d``, and the gated RMSNorm after them,
``cake.rms_norm_gated``.
CPU tensors run an FP64 reference in C++; CUDA tensors run cake's Hopper kernels.
Context parallelism (one packed batch split over ranks, exact state passing): ``cake.kcp``.
flash-linear-attention-compatible layers (GatedDeltaNet, KimiDeltaAttention): ``cake.layers``.
What this installation was built with and supports where: ``cake.build_info()``.
"""

from . import abi, kcp, layers
from .api import chunk_gated_delta_rule, chunk_gdn, chunk_kda
from .conv1d import causal_conv1d
from .norm import rms_norm_gated
from .ops import CudaSupportWarning, set_default_save_for_backward

__version__ = "0.1.0"


def build_info() -> dict:
    """How this installation was built: ``version``; ``cuda_kernels`` (whether the sm_90a kernels
    are compiled in: without them CUDA tensors raise), ``cuda_architectures``,
    ``cuda_runtime_version`` (e.g. 13000 for CUDA 13.0, 0 without CUDA) and ``compiler``; and
    ``ops``: for each op, per device ("cpu", "cuda"), one line of what it accepts there (a device
    missing has no implementation in this build).

    Example::

        >>> cake.build_info()["cuda_kernels"]
        True
    """
    return {"version": __version__, **abi.build_info()}


__all__ = ["CudaSupportWarning", "build_info", "causal_conv1d", "chunk_gated_delta_rule",
           "chunk_gdn", "chunk_kda", "kcp", "layers", "rms_norm_gated",
           "set_default_save_for_backward"]
