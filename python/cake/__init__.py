"""cake: chunked linear-attention training kernels (Gated DeltaNet and Kimi Delta Attention).

Drop-in for flash-linear-attention: ``from cake import chunk_gated_delta_rule, chunk_kda``.
CPU tensors run an FP64 reference in C++; CUDA tensors run cake's Hopper kernels.
Context parallelism (one packed batch split over ranks, exact state passing): ``cake.kcp``.
"""

from . import kcp
from .api import chunk_gated_delta_rule, chunk_kda
from .ops import set_default_save_for_backward

__version__ = "0.1.0"
__all__ = ["chunk_gated_delta_rule", "chunk_kda", "kcp", "set_default_save_for_backward"]
