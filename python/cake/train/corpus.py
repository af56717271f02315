"""The corpus: the Python standard library's own source files, which every Python installation
has, read as bytes (a vocabulary of 256), each file a document, packed into batches.

A batch is one row of exactly ``tokens`` tokens holding several documents back to back, with
``cu_seqlens`` marking where each starts: the layers keep no state across a boundary, so the
documents do not see each other. A file longer than the room left in a batch is cut, and its
rest starts the next batch as a new document. Targets are the next byte of the same document.
"""

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

    def to(self, device) -> "Batch":
        return Batch(*(t.to(device, non_blocking=True) for t in
                       (self.inputs, self.targets, self.cu_seqlens)))


def batches(tokens: int, seed: int) -> Iterator[Batch]:
    """Endless batches of `tokens` tokens from the files in an order shuffled by `seed` (the same
    seed gives the same batches)."""
    files = source_files()
    random.Random(seed).shuffle(files)
    inputs, targets, lengths = bytearray(), bytearray(), []
    while True:
        for path in files:
            data = path.read_bytes()
            start = 0
            # A piece of n inputs needs n + 1 bytes: each input's target is the byte after it.
            while len(data) - start >= 2:
                n = min(tokens - len(inputs), len(data) - start - 1)
                inputs += data[start:start + n]
                targets += data[start + 1:start + n + 1]
                lengths.append(n)
                start += n
                if len(inputs) == tokens:
                    yield _batch(inputs, targets, lengths)
                    inputs, targets, lengths = bytearray(), bytearray(), []


def _row(data: bytearray) -> Tensor:
    """[1, len(data)] int64, a copy of the bytes."""
    return torch.frombuffer(data, dtype=torch.uint8).long().unsqueeze(0)


def _batch(inputs: bytearray, targets: bytearray, lengths: list[int]) -> Batch:
    cu_seqlens = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return Batch(_row(inputs), _row(targets), cu_seqlens)
