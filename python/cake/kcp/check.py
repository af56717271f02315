"""That every rank makes the same op call, checked without reading the device on every call.

The all-gathers of a call must have the same size on every rank, and their sizes follow from the
call's shapes: so the first call of each set of sizes (value heads, head dims, state dtype,
device, whether a backward follows) on an exchange is agreed on the host (``agree``: one
synchronisation, raising on every rank where the ranks differ). Every call, the first too, then
sends its whole header in front of its forward records: the ranks compare the gathered headers on
the device, and a difference (or a rank that rejected its arguments) turns the received states
into NaN and is kept as a pending verdict.

Pending verdicts are read where the host waits anyway, at the same point on every rank (so that
every rank raises, and none is left in a collective): on CPU tensors at the end of the call's
forward, on CUDA tensors at the next ``build_context`` on the exchange or at ``cake.kcp.check``.
"""

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from .exchange import Exchange, agree, disagreement
from .plan import upload


@dataclass
class CallState:
    """Per exchange: the size sets agreed so far, the argument sets this rank has validated, and
    the verdicts not yet read."""
    agreed: set = field(default_factory=set)
    validated: set = field(default_factory=set)
    pending: list = field(default_factory=list)


def state_of(exchange: Exchange) -> CallState:
    if not hasattr(exchange, "_kcp_calls"):
        exchange._kcp_calls = CallState()
    return exchange._kcp_calls


@dataclass(frozen=True)
class Pending:
    """A call's gathered headers [W, 1 + len(names)] (int64, on the call's device)."""
    what: str
    names: tuple[str, ...]
    headers: Tensor
    float_fields: tuple[str, ...]

    def problem(self) -> Optional[str]:
        return disagreement(self.what, self.names, self.headers.tolist(), self.float_fields)


def agree_sizes(exchange: Exchange, what: str, sizes: tuple, fields: dict, error: Optional[str],
                float_fields: Sequence[str]) -> None:
    """The host agreement of a call whose sizes this exchange has not agreed before (raises
    ValueError on every rank, as agree does); nothing where they were agreed."""
    state = state_of(exchange)
    if sizes in state.agreed:
        return
    agree(exchange, what, fields, error, float_fields=float_fields)
    state.agreed.add(sizes)


def header_bytes(fields: dict) -> int:
    return 8 * (len(fields) + 1)


def header_tensor(fields: dict, ok: bool, device: torch.device) -> Tensor:
    """A rank's header on the device: the ok flag, then the fields (int64 [1 + len(fields)])."""
    return upload([int(ok)] + [int(v) for v in fields.values()], torch.int64, device)


def pack(header: Tensor, records: Optional[Tensor]) -> Tensor:
    """One rank's forward message: the header and the records, as bytes."""
    parts = [header.view(torch.uint8)]
    if records is not None:
        parts.append(records.contiguous().view(-1).view(torch.uint8))
    return torch.cat(parts)


def unpack(gathered: list[Tensor], fields: dict, dtype: torch.dtype,
           shape: tuple[int, ...]) -> tuple[Tensor, Optional[Tensor]]:
    """Every rank's header [W, 1 + len(fields)] and records [W * slots, *shape] (None without
    records) from the gathered messages."""
    n = header_bytes(fields)
    headers = torch.stack([g[:n].view(torch.int64) for g in gathered])
    if gathered[0].numel() == n:
        return headers, None
    records = torch.cat([g[n:].view(dtype).view(-1, *shape) for g in gathered])
    return headers, records


def verdict(exchange: Exchange, what: str, fields: dict, headers: Tensor,
            float_fields: Sequence[str]) -> Tensor:
    """Whether the gathered headers disagree (a bool tensor on their device, for poisoning), the
    verdict kept pending, and read at once for CPU tensors (raising ValueError)."""
    bad = (headers[:, 0] != 1).any() | (headers[:, 1:] != headers[:1, 1:]).any()
    pending = Pending(what, tuple(fields), headers, tuple(float_fields))
    if _reads_now(headers):
        problem = pending.problem()
        if problem:
            raise ValueError(problem)
    else:
        state_of(exchange).pending.append(pending)
    return bad


def _reads_now(headers: Tensor) -> bool:
    """Whether reading the headers costs no wait: on the CPU."""
    return headers.device.type == "cpu"


def poison(x: Tensor, bad: Tensor) -> Tensor:
    """x, or NaN everywhere where the ranks disagreed (no host read)."""
    return torch.where(bad, torch.full_like(x, float("nan")), x)


def raise_pending(exchange: Optional[Exchange]) -> None:
    """Reads the pending verdicts of the exchange (waiting for the device) and raises ValueError
    for the first disagreement; the verdicts are cleared either way."""
    if exchange is None:
        return
    state = state_of(exchange)
    pending, state.pending = state.pending, []
    for p in pending:
        problem = p.problem()
        if problem:
            raise ValueError(problem)


def check_calls(ctx) -> None:
    """Raises ValueError if an earlier op call on ctx's exchange disagreed between ranks (shapes,
    options, or a rank that rejected its arguments). Waits for the device; every rank must call
    it at the same point (build_context does it first)."""
    raise_pending(ctx.exchange)
