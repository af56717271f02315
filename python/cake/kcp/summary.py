"""Affine summaries of the recurrent state, as exchanged between ranks.

A record is one tensor [HV, K, K + V]: the map S -> M S + B for every value head, M [HV, K, K] in
columns 0..K-1 and B [HV, K, V] in columns K..K+V-1 (the layout of the exchange in
docs/design/context-parallel.md). The forward summary of a fragment is (M, B) with
S_out = M S_in + B; its adjoint is (M^T, C) with dS_in = M^T dS_out + C. Both compose the same way:
(M2, B2) o (M1, B1) = (M2 M1, M2 B1 + B2).
"""

import torch
from torch import Tensor


def linear(record: Tensor, head_dim_k: int) -> Tensor:
    """M [HV, K, K] of a record [HV, K, K + V]."""
    return record[..., :head_dim_k]


def offset(record: Tensor, head_dim_k: int) -> Tensor:
    """B [HV, K, V] of a record [HV, K, K + V]."""
    return record[..., head_dim_k:]


def make(m: Tensor, b: Tensor) -> Tensor:
    """The record [HV, K, K + V] of S -> m S + b, m [HV, K, K], b [HV, K, V]."""
    return torch.cat([m, b], dim=-1)


def apply(record: Tensor, state: Tensor, head_dim_k: int) -> Tensor:
    """M state + B: [HV, K, V] from state [HV, K, V]."""
    return linear(record, head_dim_k) @ state + offset(record, head_dim_k)


def compose(second: Tensor, first: Tensor, head_dim_k: int) -> Tensor:
    """second o first: S -> second(first(S)) = (M2 M1) S + (M2 B1 + B2)."""
    m2 = linear(second, head_dim_k)
    return make(m2 @ linear(first, head_dim_k), m2 @ offset(first, head_dim_k)
                + offset(second, head_dim_k))


def chain(records: list[Tensor], state: Tensor, head_dim_k: int) -> Tensor:
    """records[-1](... records[0](state)): the state after walking the maps in list order."""
    for record in records:
        state = apply(record, state, head_dim_k)
    return state


def adjoint(m: Tensor, c: Tensor) -> Tensor:
    """The adjoint record (M^T, C) [HV, K, K + V] of a walk with linear part m [HV, K, K] and
    gradient c [HV, K, V] reaching its incoming state from its own outputs."""
    return make(m.transpose(-1, -2), c)
