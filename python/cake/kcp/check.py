"""That every rank makes the same op call, checked without reading the device on every call.

The all-gathers of a call must have the same size on every rank, and their sizes follow from the
call's shapes: so the first call of each set of sizes (value heads, head dims, state dtype,
device, whether a backward follows) on an exchange is agreed on the host (``agree``: one
synchronisation, raising on every rank where the ranks differ). Every call, the first too, then
sends its whole header in front of its forward records: the ranks compare the gathered headers on
the device, and a difference (or a rank that rejected its arguments) turns the received states
into NaN and is kept as a pending verdict.

Pending verdicts are read where the host waits anyway, at the same point on every rank: on CPU
tensors at the end of the call's forward, on CUDA tensors at the next ``build_context`` on the
exchange or at ``cake.kcp.check_calls``. A rank that rejected its own arguments raises at once;
the others learn it at that point, and a collective they run before it (the op's backward, the
next layer) waits for the rank that raised, until the process group's timeout.

What no check without a host read can catch: a call whose collectives differ in size between
ranks after its sizes were agreed (a rank calling on another batch's context, or under no_grad
where the others are not): the collective itself then fails (gloo aborts the process) or waits
(NCCL, until the timeout). ``CAKE_KCP_CHECK_EVERY_CALL=1`` in every rank's environment agrees
every call on the host before its collectives (one small all-gather and a host read per call, so
no CUDA graph capture): such a call then raises ValueError on every rank. A call given what is not
a tensor (q, k, v, g, beta, x_local, weight) raises TypeError on that rank before any collective,
as a Python error would: the message it would send has no sizes to take.
"""

import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch
from torch import Tensor

from .exchange import Exchange, agree, disagreement, header_bytes
from .plan import upload

# Argument sets validated per exchange before the set starts over (variable packings would
# otherwise add one per distinct local token count).
MAX_VALIDATED = 256


@dataclass
class Pending:
    """The verdict of one kind of call (what, names) not yet read: whether any call of it since
    the last read disagreed (a bool tensor on the device), and the gathered headers
    [W, 1 + len(names)] of the first that did (of the latest call while none did)."""
    names: tuple[str, ...]
    float_fields: tuple[str, ...]
    bad: Tensor
    headers: Tensor

    def add(self, bad: Tensor, headers: Tensor) -> None:
        """One more call's verdict, kept on the device (no host read)."""
        self.headers = torch.where(self.bad, self.headers, headers)
        self.bad = self.bad | bad

    def problem(self, what: str) -> Optional[str]:
        return disagreement(what, self.names, self.headers.tolist(), self.float_fields)


@dataclass
class CallState:
    """Per exchange: the size sets agreed so far, the argument sets this rank has validated, and
    the verdicts not yet read (one per kind of call)."""
    agreed: set = field(default_factory=set)
    validated: set = field(default_factory=set)
    pending: dict = field(default_factory=dict)

    @staticmethod
    def argument_key(tensors) -> tuple:
        """What a validation reads of each argument: shape, strides, dtype, device (None where
        absent)."""
        return tuple(None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.device)
                     for t in tensors)

    def remember_validated(self, key) -> None:
        if len(self.validated) >= MAX_VALIDATED:
            self.validated.clear()
        self.validated.add(key)


def state_of(exchange: Exchange) -> CallState:
    if not hasattr(exchange, "_kcp_calls"):
        exchange._kcp_calls = CallState()
    return exchange._kcp_calls


def every_call() -> bool:
    """Whether every call is agreed on the host (CAKE_KCP_CHECK_EVERY_CALL set, and not 0)."""
    return os.environ.get("CAKE_KCP_CHECK_EVERY_CALL", "0") not in ("", "0")


def agree_sizes(exchange: Exchange, what: str, sizes: tuple, fields: dict, error: Optional[str],
                float_fields: Sequence[str]) -> None:
    """The host agreement of a call whose sizes this exchange has not agreed before, or of every
    call with every_call() (raises ValueError on every rank, as agree does); nothing where they
    were agreed."""
    state = state_of(exchange)
    if sizes in state.agreed and not every_call():
        return
    agree(exchange, what, fields, error, float_fields=float_fields)
    state.agreed.add(sizes)


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
    records) from the gathered messages. The bytes are copied before they are viewed as wider
    types: a message may start at any byte of the collective's buffer."""
    n = header_bytes(len(fields))
    headers = _headers(gathered, n)
    if gathered[0].numel() == n:
        return headers, None
    records = torch.cat([g[n:] for g in gathered]).view(dtype).view(-1, *shape)
    return headers, records


def _headers(gathered: list[Tensor], n: int) -> Tensor:
    return torch.stack([g[:n] for g in gathered]).view(torch.int64)


def verdict(exchange: Exchange, what: str, fields: dict, headers: Tensor,
            float_fields: Sequence[str]) -> Tensor:
    """Whether the gathered headers disagree (a bool tensor on their device, for poisoning), the
    verdict kept pending, and read at once for CPU tensors (raising ValueError)."""
    bad = (headers[:, 0] != 1).any() | (headers[:, 1:] != headers[:1, 1:]).any()
    keep(exchange, what, fields, headers, bad, float_fields)
    if _reads_now(headers):
        raise_pending(exchange)
    return bad


def keep(exchange: Exchange, what: str, fields: dict, headers: Tensor, bad: Tensor,
         float_fields: Sequence[str] = ()) -> None:
    """Adds a call's verdict to the exchange's pending ones (a rank that rejected its own
    arguments keeps it too, so that the next read raises on every rank)."""
    pending = state_of(exchange).pending
    key = (what, tuple(fields))
    if key in pending:
        pending[key].add(bad, headers)
    else:
        pending[key] = Pending(tuple(fields), tuple(float_fields), bad, headers)


def reject(exchange: Exchange, what: str, fields: dict, gathered: list[Tensor]) -> None:
    """On the rank that rejected its own arguments, after the forward's all-gather: keeps the
    verdict where the others read it later, so that their read and its own raise together."""
    headers = _headers(gathered, header_bytes(len(fields)))
    if not _reads_now(headers):
        keep(exchange, what, fields, headers, (headers[:, 0] != 1).any())


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
    pending, state.pending = state.pending, {}
    for (what, _), p in pending.items():
        problem = p.problem(what)
        if problem:
            raise ValueError(problem)


def check_calls(ctx) -> None:
    """Raises ValueError if an earlier op call on ctx's exchange disagreed between ranks (shapes,
    options, or a rank that rejected its arguments). Waits for the device; every rank must call
    it at the same point (build_context does it first)."""
    raise_pending(ctx.exchange)
