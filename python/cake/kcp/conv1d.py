"""The causal conv1d under context parallelism: each rank convolves its own tokens; a fragment that
continues a document on another rank gets the W - 1 tokens before it (its halo) from the ranks
holding them, and their gradient goes back to those ranks in the backward.

Forward on one rank: one all-gather of the call's header (context, shapes, dtype, options; checked
on the device, cake.kcp.check, after the first call of its sizes agreed them on the host) and of
every state_out fragment's last min(W - 1, length) tokens at its summary_slot
([forward_slots, W - 1, D], right-aligned); every state_in fragment assembles its halo from the
tails of its document's earlier pieces, nearest first (a piece shorter than W - 1 passes the rest
of the halo on to the one before it), as the columns W - m .. W - 1 of an initial state
[F, D, W] of the rank's local documents, zeros elsewhere; then the single-rank op on the shard with
that initial state. Backward: the initial state's gradient of every state_in fragment (columns
1 .. W - 1, [backward_slots, W - 1, D] at its adjoint_slot) is all-gathered, and each rank adds to
its own tokens' gradients the columns that came from them.
"""

from typing import Optional

import torch
from torch import Tensor

from .. import abi
from ..conv1d import ACTIVATIONS, causal_conv1d
from . import check
from .context import CONV_HEADER_FIELDS, Context, _dtype_code


def _halo_sources(ctx: Context, rank: int, index: int, width: int):
    """Where fragment `index` of rank `rank` gets its halo: (piece's rank, piece, k, column) for
    each earlier piece of its document that supplies tokens, nearest first: the piece's last k
    tokens are the halo's columns [column, column + k)."""
    fragment = ctx.shards[rank].fragments[index]
    need, column, ref = width - 1, width, fragment.previous
    while need > 0 and ref is not None:
        piece = ctx.shards[ref.rank].fragments[ref.index]
        k = min(need, piece.num_tokens)
        column -= k
        yield ref.rank, piece, k, column
        need -= k
        ref = piece.previous


class _Halo(torch.autograd.Function):
    """x_local [1, T_local, D] -> the local documents' initial states [F, D, W] (the halos)."""

    @staticmethod
    def forward(fctx, x_local: Tensor, ctx: Context, width: int, slots: tuple[int, int],
                header: Tensor, fields: dict):
        D = x_local.shape[2]
        halo = x_local.new_zeros(len(ctx.fragments), D, width)
        forward_slots, backward_slots = slots
        fctx.kcp = (ctx, width, backward_slots, x_local.shape)
        sent = None
        if forward_slots:
            sent = x_local.new_zeros(forward_slots, width - 1, D)
            for f in ctx.fragments:
                if f.state_out:
                    k = min(width - 1, f.num_tokens)
                    end = f.local_range.end
                    sent[f.summary_slot, width - 1 - k:] = x_local[0, end - k:end]
        headers, gathered = check.unpack(ctx.exchange.all_gather(check.pack(header, sent)),
                                         fields, x_local.dtype, (width - 1, D))
        bad = check.verdict(ctx.exchange, "causal_conv1d_kcp", fields, headers, ())
        if gathered is None:
            return halo
        for i, f in enumerate(ctx.fragments):
            if not f.state_in:
                continue
            for rank, piece, k, column in _halo_sources(ctx, ctx.rank, i, width):
                tail = gathered[rank * forward_slots + piece.summary_slot, width - 1 - k:]
                halo[i, :, column:column + k] = tail.T                          # [D, k]
        return check.poison(halo, bad)

    @staticmethod
    def backward(fctx, dhalo: Tensor):
        ctx, width, backward_slots, shape = fctx.kcp
        dx = dhalo.new_zeros(shape)
        if width == 1 or backward_slots == 0:
            return dx, None, None, None, None, None
        sent = dhalo.new_zeros(backward_slots, width - 1, shape[2])
        for i, f in enumerate(ctx.fragments):
            if f.state_in:
                sent[f.adjoint_slot] = dhalo[i, :, 1:].T
        gathered = ctx.exchange.all_gather(sent)
        # Every rank's state_in fragments, for the halo columns that came from this rank's tokens.
        for rank, shard in enumerate(ctx.shards):
            for i, f in enumerate(shard.fragments):
                if not f.state_in:
                    continue
                for source, piece, k, column in _halo_sources(ctx, rank, i, width):
                    if source != ctx.rank:
                        continue
                    end = piece.local_range.end
                    dx[0, end - k:end] += gathered[rank][f.adjoint_slot, column - 1:column - 1 + k]
        return dx, None, None, None, None, None


def _input_error(ctx: Context, x_local, weight, bias, residual, activation) -> Optional[str]:
    """What is wrong with this rank's arguments (shapes against the context; then the single-rank
    validation of the local call, so that no rank fails after the others have gone on: once per
    set of argument shapes, strides, dtypes and devices, as it reads nothing else)."""
    T = ctx.num_tokens
    if activation not in ACTIVATIONS:
        return f"activation must be None, 'silu' or 'swish', got {activation!r}"
    if x_local.dim() != 3 or x_local.shape[0] != 1 or x_local.shape[1] != T:
        return (f"x_local must be [1, T_local, D] with T_local = {T} (rank {ctx.rank}'s shard of "
                f"the context), got {tuple(x_local.shape)}")
    if residual is not None and residual.shape != x_local.shape:
        return (f"residual must have x_local's shape {tuple(x_local.shape)}, got "
                f"{tuple(residual.shape)}")
    if weight.dim() != 2 or weight.shape[0] != x_local.shape[2]:
        return (f"weight must be [D, W] with D = {x_local.shape[2]} (x_local.shape[2]), got "
                f"{tuple(weight.shape)}")
    if not ctx.fragments:
        return None
    state = check.state_of(ctx.require_exchange("causal_conv1d_kcp"))
    key = ("conv1d", len(ctx.fragments), activation,
           check.CallState.argument_key((x_local, weight, bias, residual)))
    if key in state.validated:
        return None
    F, W = len(ctx.fragments), weight.shape[1]
    halo = x_local.new_empty(F, x_local.shape[2], W)
    try:
        abi.conv1d_forward_workspace_size(x_local, weight, bias, residual, halo,
                                          ctx.cu_seqlens_on(x_local.device),
                                          torch.empty_like(x_local), None,
                                          ACTIVATIONS[activation])
    except ValueError as e:
        return str(e)
    state.remember_validated(key)
    return None


def causal_conv1d_kcp(x_local: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
                      residual: Optional[Tensor] = None, activation: Optional[str] = None,
                      ctx: Optional[Context] = None):
    """cake.causal_conv1d on this rank's shard of a context-parallel batch; every rank of ctx must
    call it (and run its backward) with the same shapes and options.

    Args:
        x_local: ``[1, T_local, D]``, this rank's tokens (``cake.kcp.shard`` of ``[1, T, D]``).
        weight: ``[D, W]``, the same on every rank. bias: ``[D]``. residual: x_local's shape.
        activation: None, ``"silu"`` or ``"swish"``.
        ctx: the rank's context (``cake.kcp.build_context``).

    Returns:
        ``(y_local [1, T_local, D], None)``, as flash-linear-attention's causal_conv1d with a
        cp_context (no states under context parallelism). Gradients of x_local and residual are
        this rank's tokens'; those of weight and bias are this rank's partial sums (summed over
        ranks they are the single-rank gradients). Bytes exchanged per call:
        ``ctx.exchange_bytes(conv_dim=D, conv_width=W, dtype=x_local.dtype)``.
    """
    name = "causal_conv1d_kcp"
    if not isinstance(ctx, Context):
        raise TypeError(f"{name}: ctx must be a cake.kcp.Context (build_context), got "
                        f"{type(ctx).__name__}")
    for arg, t in (("x_local", x_local), ("weight", weight)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    exchange = ctx.require_exchange(name)
    x_local, weight, bias, residual = (t.contiguous() if isinstance(t, Tensor) else t
                                       for t in (x_local, weight, bias, residual))
    error = _input_error(ctx, x_local, weight, bias, residual, activation)
    D = x_local.shape[-1] if x_local.dim() else 0
    W = weight.shape[-1] if weight.dim() == 2 else 0
    needs_x_grad = torch.is_grad_enabled() and x_local.requires_grad
    header = {"context": ctx.fingerprint, "dim": D, "width": W,
              "dtype": _dtype_code(x_local.dtype), "device_type": 1 if x_local.is_cuda else 0,
              "activation": ACTIVATIONS.get(activation, -1),
              "flags": int(bias is not None) | int(residual is not None) << 1,
              "x_requires_grad": int(needs_x_grad)}
    assert tuple(header) == CONV_HEADER_FIELDS
    check.agree_sizes(exchange, name, ("conv1d", D, W, x_local.dtype, x_local.device.type,
                                       needs_x_grad), header, error and f"{name}: {error}", ())
    plan = ctx.exchange_bytes(conv_dim=D, conv_width=W, dtype=x_local.dtype)
    message = ctx.call_header(header, error is None, x_local.device)
    if error is not None:  # its sizes were agreed before: send the flag and zeros, then raise
        sent = x_local.new_zeros(plan.forward_slots, W - 1, D) if plan.forward_slots else None
        check.reject(exchange, name, header, exchange.all_gather(check.pack(message, sent)))
        raise ValueError(f"{name}: {error}")
    halo = _Halo.apply(x_local, ctx, W, (plan.forward_slots, plan.backward_slots), message,
                       header)
    if not ctx.fragments:
        # No token here. The halo, weight and bias still join the graph: this rank's backward
        # takes part in the gradients' all-gather, and its partial dweight and dbias are zeros.
        joined = halo.sum() + weight.sum() + (bias.sum() if bias is not None else 0)
        y = x_local.new_zeros(x_local.shape) + joined * 0
        if residual is not None:
            y = y + residual
        return y, None
    y, _ = causal_conv1d(x_local, weight, bias, residual, halo, False, activation,
                         cu_seqlens=ctx.cu_seqlens_on(x_local.device))
    return y, None
