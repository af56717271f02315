"""How ranks exchange tensors: one collective, all-gather, behind a small interface.

Two implementations:

* DistributedExchange: ``torch.distributed.all_gather`` on a process group (gloo on CPU, NCCL on
  CUDA).
* VirtualWorld: W virtual ranks in one process, one thread each, meeting at a barrier. The C++ ops
  release the GIL, so the ranks' walks run concurrently.

``agree`` all-gathers a small fixed-size header of integers before any variable-size exchange, so
that arguments that differ between ranks (or were rejected on one rank) raise ValueError on every
rank instead of leaving the others blocked in a collective of another size.
"""

import struct
import threading
import time
from typing import Callable, Mapping, Optional, Sequence

import torch
from torch import Tensor


class Exchange:
    """One rank's view of the collective: ``all_gather(t)`` returns every rank's t, in rank order.

    Every rank must call it with a tensor of the same shape and dtype, in the same order.
    """

    rank: int = 0
    world_size: int = 1

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        raise NotImplementedError


class SingleExchange(Exchange):
    """The exchange of a world of one rank."""

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        return [tensor.clone()]


class DistributedExchange(Exchange):
    """all_gather over a torch.distributed process group (None: the default group).

    NCCL gathers CUDA tensors and gloo CPU tensors: tensors are moved to the backend's device for
    the collective and the results come back on the caller's device. ``of(group)`` gives the one
    exchange of a group, so that what its calls have agreed (cake.kcp.check) outlives a batch's
    context.
    """

    _of_group: dict = {}

    @classmethod
    def of(cls, group=None) -> "DistributedExchange":
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("group: torch.distributed is not initialised; call "
                             "torch.distributed.init_process_group first or pass exchange=")
        key = dist.group.WORLD if group is None else group
        if key not in cls._of_group:
            cls._of_group[key] = cls(group)
        return cls._of_group[key]

    def __init__(self, group=None):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("group: torch.distributed is not initialised; call "
                             "torch.distributed.init_process_group first or pass exchange=")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._backend = str(dist.get_backend(group)).lower()

    def _device(self, tensor: Tensor) -> torch.device:
        if self._backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        if self._backend == "gloo":
            return torch.device("cpu")
        return tensor.device

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        import torch.distributed as dist

        device = self._device(tensor)
        sent = tensor.detach().to(device).reshape(-1)
        received = sent.new_empty(self.world_size * sent.numel())
        dist.all_gather_into_tensor(received, sent, group=self.group)
        return list(received.to(tensor.device).view(self.world_size, *tensor.shape).unbind(0))


class VirtualWorld:
    """W virtual ranks in one process: ``world.exchange(r)`` is rank r's Exchange, and
    ``world.run(fn)`` calls ``fn(exchange)`` on one thread per rank.

    The all-gather is two barrier waits (all ranks have written their slot; all have read every
    slot). A rank that fails aborts the world, so the others fail too instead of waiting; a wait
    longer than ``timeout`` seconds aborts it the same way. A wait that every rank has reached
    completes even if the world is aborted just after, so an error raised on every rank right after
    an all-gather stays that error on every rank. An aborted world stays aborted: use a new one.

    Each rank's thread runs its backward passes itself (autograd's multithreading off on that
    thread): by default autograd runs the backward of CUDA tensors on one worker thread per
    device, where the first rank's backward would wait in an all-gather for ranks whose backward
    is queued behind it on that same thread, for ever.
    """

    def __init__(self, world_size: int, timeout: float = 60.0):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        self.world_size = world_size
        self.timeout = timeout
        self._cond = threading.Condition()
        self._arrived = 0
        self._generation = 0
        self._aborted = False
        self._slots: list[Optional[Tensor]] = [None] * world_size
        self._exchanges = [VirtualExchange(self, r) for r in range(world_size)]

    def exchange(self, rank: int) -> "VirtualExchange":
        """Rank ``rank``'s exchange (the same object on every call)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {rank}")
        return self._exchanges[rank]

    def abort(self) -> None:
        """Fails every rank waiting in (or later entering) an all-gather."""
        with self._cond:
            self._aborted = True
            self._cond.notify_all()

    def _wait(self, rank: int) -> None:
        with self._cond:
            if not self._aborted:
                generation = self._generation
                self._arrived += 1
                if self._arrived == self.world_size:
                    self._arrived = 0
                    self._generation += 1
                    self._cond.notify_all()
                    return
                self._cond.wait_for(lambda: self._generation != generation or self._aborted,
                                    self.timeout)
                if self._generation != generation:
                    return
                self._aborted = True
                self._cond.notify_all()
        raise RuntimeError(f"virtual rank {rank}: the all-gather was abandoned (another rank "
                           f"failed, or the ranks did not all arrive within {self.timeout} s)")

    def run(self, fn: Callable[[Exchange], object], *, return_exceptions: bool = False,
            timeout: Optional[float] = None) -> list:
        """Runs ``fn(exchange)`` for every rank on its own thread and returns the results in rank
        order. An exception on one rank aborts the all-gathers of the others; it is re-raised
        (the lowest failing rank's) unless return_exceptions, which puts it in that rank's place.
        Raises TimeoutError when the ranks are not all done after ``timeout`` (default: the
        world's timeout plus a minute).
        """
        results: list = [None] * self.world_size
        failed = [False] * self.world_size

        def body(rank: int) -> None:
            try:
                with torch.autograd.set_multithreading_enabled(False):
                    results[rank] = fn(self.exchange(rank))
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                results[rank] = e
                failed[rank] = True
                self.abort()

        threads = [threading.Thread(target=body, args=(r,), daemon=True, name=f"kcp-rank-{r}")
                   for r in range(self.world_size)]
        for t in threads:
            t.start()
        limit = self.timeout + 60.0 if timeout is None else timeout
        deadline = time.monotonic() + limit
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            self.abort()
            raise TimeoutError(f"virtual ranks still running after {limit} s")
        if not return_exceptions:
            for r in range(self.world_size):
                if failed[r]:
                    raise results[r]
        return results


class VirtualExchange(Exchange):
    """Rank ``rank`` of a VirtualWorld."""

    def __init__(self, world: VirtualWorld, rank: int):
        self.world = world
        self.rank = rank
        self.world_size = world.world_size

    def all_gather(self, tensor: Tensor) -> list[Tensor]:
        world = self.world
        world._slots[self.rank] = tensor.detach().clone()
        world._wait(self.rank)
        gathered = [t.clone() for t in world._slots]
        world._wait(self.rank)
        first = gathered[0]
        for r, t in enumerate(gathered):
            if t.shape != first.shape or t.dtype != first.dtype:
                raise ValueError(f"all_gather: every rank must send the same shape and dtype, got "
                                 f"{tuple(first.shape)} {first.dtype} on rank 0 and "
                                 f"{tuple(t.shape)} {t.dtype} on rank {r}")
        return [t.to(tensor.device) for t in gathered]


def float_bits(x: float) -> int:
    """A float as the int64 of its IEEE-754 bits, so that a header of int64 can carry it exactly."""
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def bits_float(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def header_bytes(num_fields: int) -> int:
    """Bytes one rank sends in ``agree`` with num_fields fields: those and the ok flag, int64."""
    return 8 * (num_fields + 1)


def agree(exchange: Exchange, what: str, fields: Mapping[str, int], error: Optional[str],
          float_fields: Sequence[str] = (), per_rank: Sequence[str] = ()) -> list[list[int]]:
    """All-gathers this rank's header (an ok flag and ``fields``, int64 [len(fields) + 1]) and
    raises ValueError on every rank when a rank reported an ``error`` (that rank raises its own
    message) or when the ranks' fields differ (naming each field and every rank's value). Fields
    named in ``per_rank`` may differ. Returns every rank's fields, [W][len(fields)].
    ``float_fields`` are shown as floats (see float_bits).
    """
    names = list(fields)
    header = torch.tensor([0 if error else 1] + [int(fields[n]) for n in names], dtype=torch.int64)
    rows = [t.tolist() for t in exchange.all_gather(header)]
    if error:
        raise ValueError(error)
    problem = disagreement(what, names, rows, float_fields, per_rank)
    if problem:
        raise ValueError(problem)
    return [row[1:] for row in rows]


def disagreement(what: str, names: Sequence[str], rows: Sequence[Sequence[int]],
                 float_fields: Sequence[str] = (), per_rank: Sequence[str] = ()) -> Optional[str]:
    """What is wrong with the gathered headers rows [W][1 + len(names)] (an ok flag, then the
    fields), or None when every rank accepted its arguments and the fields agree."""
    rejected = [r for r, row in enumerate(rows) if row[0] != 1]
    if rejected:
        return f"{what}: rank(s) {rejected} rejected their arguments (their own errors say why)"
    show = lambda n, x: bits_float(x) if n in float_fields else x  # noqa: E731
    differ = []
    for i, name in enumerate(names, start=1):
        if name in per_rank:
            continue
        values = [row[i] for row in rows]
        if any(x != values[0] for x in values):
            differ.append(f"{name} (" + ", ".join(f"rank {r}: {show(name, x)}"
                                                  for r, x in enumerate(values)) + ")")
    if differ:
        return f"{what}: the ranks disagree on " + "; ".join(differ)
    return None
