"""The corpus: the Python standard library's own source files, which every Python installation
has, read as bytes (a vocabulary of 256), each file a document, packed into batches.

A batch is one row of exactly ``tokens`` tokens holding several documents back to back, with
``cu_seqlens`` marking where each starts: the layers keep no state across a boundary, so the
documents do not see each other. A batch takes its tokens from a few files read side by side; a
file longer than its part of a batch is cut, and its rest starts that part of the next batch as a
new document. Targets are the next byte of the same document.
"""

import itertools
import pathlib
import random
import sysconfig
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor

VOCAB_SIZE = 256


def source_files() -> list[pathlib.Path]:
    """The standard library's .py files (not site-packages), sorted by path."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py")
                   if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    if not files:
        raise SystemExit(f"no Python source files found under {stdlib}")
    return files


@dataclass
class Batch:
    inputs: Tensor      # [1, tokens] int64 bytes
    targets: Tensor     # [1, tokens] int64: the next byte of the same document
    cu_seqlens: Tensor  # [documents + 1] int32 offsets of the documents in the row
    cu_seqlens_cpu: Tensor  # the same offsets, kept on the host (cake's cu_seqlens_cpu)

    def to(self, device) -> "Batch":
        """The batch on device; cu_seqlens_cpu stays on the host."""
        return Batch(*(t.to(device, non_blocking=True) for t in
                       (self.inputs, self.targets, self.cu_seqlens)), self.cu_seqlens_cpu)


class _Stream:
    """Reads the files of a shared iterator one after the other, a piece at a time."""

    def __init__(self, files: Iterator[pathlib.Path]):
        self.files, self.data, self.start = files, b"", 0

    def take(self, room: int, inputs: bytearray, targets: bytearray) -> int:
        """Appends the next piece of at most room inputs (and their targets); returns its
        length. A piece of n inputs needs n + 1 bytes: each input's target is the byte after."""
        while len(self.data) - self.start < 2:
            self.data, self.start = next(self.files).read_bytes(), 0
        n = min(room, len(self.data) - self.start - 1)
        inputs += self.data[self.start:self.start + n]
        targets += self.data[self.start + 1:self.start + n + 1]
        self.start += n
        return n


def batches(tokens: int, seed: int, streams: int = 4) -> Iterator[Batch]:
    """Endless batches of `tokens` tokens from the files in an order shuffled by `seed` (the same
    seed gives the same batches). Each batch takes a part of about tokens / streams from each of
    `streams` files read side by side, so that a step sees several files, not one long one."""
    files = source_files()
    random.Random(seed).shuffle(files)
    shared = itertools.cycle(files)
    readers = [_Stream(shared) for _ in range(min(streams, tokens))]
    parts = [tokens // len(readers) + (i < tokens % len(readers)) for i in range(len(readers))]
    while True:
        inputs, targets, lengths = bytearray(), bytearray(), []
        for reader, room in zip(readers, parts):
            while room:
                n = reader.take(room, inputs, targets)
                lengths.append(n)
                room -= n
        yield _batch(inputs, targets, lengths)


def _row(data: bytearray) -> Tensor:
    """[1, len(data)] int64, a copy of the bytes."""
    return torch.frombuffer(data, dtype=torch.uint8).long().unsqueeze(0)


def _batch(inputs: bytearray, targets: bytearray, lengths: list[int]) -> Batch:
    cu_seqlens = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return Batch(_row(inputs), _row(targets), cu_seqlens, cu_seqlens)
