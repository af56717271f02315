"""Context parallelism ("KCP"): one packed batch of documents split over W ranks, each rank
walking its own tokens, with the recurrent state passed exactly between ranks through affine
summaries (docs/design/context-parallel.md, section "Python API").

    ctx = cake.kcp.build_context(cu_seqlens, group=group, layout="zigzag_per_document")
    q_local = cake.kcp.shard(q, ctx)                      # [1, T, ...] -> [1, T_local, ...]
    o_local, _ = cake.kcp.chunk_gated_delta_rule_kcp(q_local, k_local, v_local, g_local,
                                                     beta_local, ctx)
    o = cake.kcp.unshard(o_local, ctx)                    # all-gather back to [1, T, ...]

After the first call of each shape, a call reads nothing back from the device (it can be captured
in a CUDA graph); ranks that disagree are reported by cake.kcp.check_calls(ctx) or the next
build_context on CUDA tensors, at once on CPU tensors (cake.kcp.check).

The short convolution before them, with its halo exchanged: cake.kcp.causal_conv1d_kcp.
"""

from .context import (LAYOUTS, Context, ExchangeBytes, Fragment, FragmentRef, Shard, TokenRange,
                      build_context, shard, unshard)
from .check import check_calls
from .exchange import DistributedExchange, Exchange, SingleExchange, VirtualExchange, VirtualWorld
from .conv1d import causal_conv1d_kcp
from .ops import chunk_gated_delta_rule_kcp, chunk_kda_kcp

__all__ = [
    "LAYOUTS", "Context", "DistributedExchange", "Exchange", "ExchangeBytes", "Fragment",
    "FragmentRef", "Shard", "check_calls", "SingleExchange", "TokenRange", "VirtualExchange", "VirtualWorld",
    "build_context", "causal_conv1d_kcp", "chunk_gated_delta_rule_kcp", "chunk_kda_kcp", "shard",
    "unshard",
]
