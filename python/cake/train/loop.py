"""One training run: AdamW with a linear warm-up and a cosine decay, gradient clipping, bf16
autocast on CUDA, and a record of every step's loss and time."""

import math
import resource
import time
from dataclasses import dataclass

import torch

from .corpus import batches
from .model import LanguageModel
from .progress import Progress

# Steps left out of the speed figure: the first ones include allocation and autotuning.
WARMUP_STEPS_NOT_TIMED = 3
# The fixed batch's loss must fall by this much (nats per byte) for a run to count as learning:
# untrained (lr 0) it does not move; the default runs take it down by more than 2.
LEARNED_MARGIN = 0.05
# The fixed batch comes from the corpus shuffled by the run's seed plus this.
EVAL_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    tokens_per_step: int
    lr: float
    seed: int
    device: torch.device
    # Give cake's layers each batch's offsets on the host too (cu_seqlens_cpu): their op then
    # walks few long documents as exact segments where its plan predicts a gain.
    host_offsets: bool = False


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up over the first 10% of the steps, then a cosine down to 10% of lr."""
    warmup = max(1, config.steps // 10)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def peak_memory_bytes(device: torch.device) -> int:
    """The peak of this run on CUDA (torch's allocator); on the CPU the process's peak resident
    size (Linux reports it in KiB), which includes everything loaded before the run."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def parameter_groups(model: torch.nn.Module) -> list[dict]:
    """AdamW's groups: weight decay on the matrices, none on vectors (norms, biases) or on what
    the layers mark ``_no_weight_decay`` (A_log, dt_bias), as FLA's models are trained."""
    decay, keep = [], []
    for p in model.parameters():
        no_decay = p.dim() < 2 or getattr(p, "_no_weight_decay", False)
        (keep if no_decay else decay).append(p)
    return [{"params": decay, "weight_decay": 0.01}, {"params": keep, "weight_decay": 0.0}]


def autocast(device: torch.device):
    """The training step's precision: bf16 autocast on CUDA, none on the CPU (FP64 reference)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def fixed_batch_loss(model: LanguageModel, batch, device: torch.device) -> float:
    """The model's loss on one batch, without gradients, at the training step's precision."""
    with torch.no_grad(), autocast(device):
        return model.loss(batch.inputs, batch.targets, batch.cu_seqlens).item()


def train_step(model: LanguageModel, optimizer, batch, host_offsets: bool) -> torch.Tensor:
    """One optimizer step on batch; returns the loss, still on the device (no host wait)."""
    host = batch.cu_seqlens_cpu if host_offsets and model.impl == "cake" else None
    with autocast(batch.inputs.device):
        loss = model.loss(batch.inputs, batch.targets, batch.cu_seqlens, host)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss


def train(model: LanguageModel, config: TrainConfig, label: str) -> dict:
    """Trains model in place; returns the run's record (see cli.EPILOG for its fields)."""
    device = config.device
    model.to(device).train()
    optimizer = torch.optim.AdamW(parameter_groups(model), lr=config.lr, betas=(0.9, 0.95))
    fixed = next(batches(config.tokens_per_step, config.seed + EVAL_SEED_OFFSET)).to(device)
    fixed_before = fixed_batch_loss(model, fixed, device)
    data = batches(config.tokens_per_step, config.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    progress = Progress(label, config.steps)
    losses, seconds = [], []
    start = time.perf_counter()
    for step in range(config.steps):
        batch = next(data).to(device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        loss = train_step(model, optimizer, batch, config.host_offsets)
        losses.append(loss.item())  # synchronises: the step's time is complete
        seconds.append(time.perf_counter() - start)
        progress.update(step + 1, losses[-1], (step + 1) * config.tokens_per_step / seconds[-1])
        if not math.isfinite(losses[-1]):
            break
    timed = len(seconds) - WARMUP_STEPS_NOT_TIMED
    steady = (timed * config.tokens_per_step / (seconds[-1] - seconds[WARMUP_STEPS_NOT_TIMED - 1])
              if timed > 0 else len(seconds) * config.tokens_per_step / seconds[-1])
    window = max(1, min(10, len(losses) // 4))
    fixed_after = fixed_batch_loss(model, fixed, device)
    return {
        "label": label,
        "steps": [{"step": i + 1, "loss": loss, "seconds": s}
                  for i, (loss, s) in enumerate(zip(losses, seconds))],
        "loss_first": sum(losses[:window]) / window,
        "loss_last": sum(losses[-window:]) / window,
        "loss_window": window,
        "fixed_loss_before": fixed_before,
        "fixed_loss_after": fixed_after,
        "learned": math.isfinite(fixed_after) and fixed_after < fixed_before - LEARNED_MARGIN,
        "tokens": len(losses) * config.tokens_per_step,
        "wall_seconds": seconds[-1],
        "tokens_per_second": steady,
        "peak_memory_bytes": peak_memory_bytes(device),
    }
