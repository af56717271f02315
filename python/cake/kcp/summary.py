"""Affine summaries of the recurrent state, composed in batches.

A record is one tensor [HV, K, K + V]: the map S -> M S + B for every value head, M [HV, K, K] in
columns 0..K-1 and B [HV, K, V] in columns K..K+V-1 (the layout of the exchange in
docs/design/context-parallel.md). The forward summary of a fragment is (M, B) with
S_out = M S_in + B; its adjoint is (M^T, C) with dS_in = M^T dS_out + C. Both compose the same way:
(M2, B2) o (M1, B1) = (M2 M1, M2 B1 + B2).

The compositions run over a call plan's scans (cake.kcp.plan.Scan): every item walks its own list
of maps in lock step, one batched product per step. A step's maps come from ``maps(columns)``:
(m [n_l, HV, K, K], b [n_l, HV, K, X]) for the step's entries, S -> m S + b.
"""

from typing import Optional

import torch
from torch import Tensor


def in_item_order(x: Tensor, order: Tensor) -> Tensor:
    """x [n, ...] in a scan's order (row j is item order[j]) -> [n, ...] in item order."""
    out = torch.empty_like(x)
    out[order] = x  # index_put_: deterministic, unlike index_copy_ on CUDA
    return out


def scan_compose(scan, maps) -> tuple[Tensor, Tensor]:
    """Every item's maps composed in list order (its first map applied first): (m [n, HV, K, K],
    b [n, HV, K, X]) in item order. Every item has at least one map."""
    assert scan.steps, "scan_compose needs at least one map per item"
    steps = iter(scan.steps)
    _, columns = next(steps)
    m, b = (x.clone() for x in maps(columns))
    for n, columns in steps:
        m2, b2 = maps(columns)
        m[:n], b[:n] = m2 @ m[:n], m2 @ b[:n] + b2
    return in_item_order(m, scan.order), in_item_order(b, scan.order)


def scan_apply(scan, maps, state: Tensor, written: Optional[Tensor] = None) -> Tensor:
    """Every item's state [n, HV, K, V] (item order) walked through its maps in list order; the
    states at the end, in item order. With ``written``, the state after each step also goes to
    written[last column of the step] (e.g. the incoming state of each next segment)."""
    state = state.index_select(0, scan.order)
    for n, columns in scan.steps:
        m, b = maps(columns)
        state[:n] = m @ state[:n] + b
        if written is not None:
            written[columns[-1]] = state[:n]
    return in_item_order(state, scan.order)
