"""The states before every chunk (chunk_kda's return_intermediate_states, an inference feature).

h[c] of a document is the state before its tokens [c C, (c + 1) C), C the caller's chunk size:
the initial state for c = 0, else the final state of the document's first c C tokens. They are
computed with the op itself, walking all documents one chunk at a time: step c runs the op on
the c-th chunk of every document that has one more after it, from the states of step c - 1. The
result is the op's own recurrence, on any device, at the cost of one call per chunk of the
longest document.
"""

import torch
from torch import Tensor

from .options import RECOMPUTE_ORDERED, DeltaOptions


def states(opts: DeltaOptions, inputs: tuple, scale: float, forward) -> Tensor:
    """h [B, NT, HV, K, V] in k's dtype (K-first), NT = ceil(T / C) per batch row, or with
    cu_seqlens B = 1 and NT the chunks of all documents in order.

    inputs: the validated (q, k, v, g, beta, initial_state [N, HV, K, V] or None, cu_seqlens,
    A_log, dt_bias) of a call that has run; forward: the op's custom forward (cake.ops). cu_seqlens
    on a GPU is read by the host here (a synchronisation; this path is for inference and checks,
    not training).
    """

    q, k, v, g, beta, h0, cu_seqlens, A_log, dt_bias = inputs
    B, T, HV, K, V = q.shape[0], q.shape[1], v.shape[2], q.shape[3], v.shape[3]
    if cu_seqlens is None:
        flat = [x.reshape(1, B * T, *x.shape[2:]) for x in (q, k, v, g, beta)]
        bounds = [b * T for b in range(B + 1)]
    else:
        flat = [q, k, v, g, beta]
        bounds = [int(x) for x in cu_seqlens.tolist()]
    N, C = len(bounds) - 1, opts.chunk_size
    state_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    state = (h0.to(state_dtype).clone() if h0 is not None else
             torch.zeros(N, HV, K, V, dtype=state_dtype, device=q.device))
    num_chunks = [-(-(bounds[n + 1] - bounds[n]) // C) for n in range(N)]
    h = [[] for _ in range(N)]
    for c in range(max(num_chunks, default=0)):
        walking = []  # documents with a chunk after chunk c
        for n in range(N):
            if c < num_chunks[n]:
                h[n].append(state[n].to(k.dtype, copy=True))
                if c + 1 < num_chunks[n]:
                    walking.append(n)
        if not walking:
            break
        ranges = [(bounds[n] + c * C, bounds[n] + (c + 1) * C) for n in walking]
        pieces = [torch.cat([x[:, a:b] for a, b in ranges], dim=1) for x in flat]
        cu = torch.tensor([0] + [C * (i + 1) for i in range(len(walking))],
                          dtype=torch.int64, device=q.device)
        _, final, _ = forward(opts.variant, *pieces, state[walking].contiguous(), cu, A_log,
                              dt_bias, scale, True, *opts.flags(), *RECOMPUTE_ORDERED)
        state[walking] = final.to(state_dtype)
    empty = torch.empty(0, HV, K, V, dtype=k.dtype, device=q.device)
    if cu_seqlens is None:
        return torch.stack([torch.stack(h[n]) if h[n] else empty for n in range(N)])
    return torch.cat([torch.stack(h[n]) for n in range(N) if h[n]] or [empty]).unsqueeze(0)
