"""``python -m cake.train``: the command line, the defaults per device, and what it prints."""

import argparse
import copy
import dataclasses
import math
import pathlib
import platform
import sys
import sysconfig
import warnings

import torch

import cake

from .corpus import source_files
from .loop import LEARNED_MARGIN, TrainConfig, train
from .model import LAYER_KINDS, LanguageModel, ModelConfig
from .report import write_log, write_plot

# Defaults per device. The CPU runs cake's FP64 reference, so its model is small and its run
# takes a few minutes on two cores; the GPU's layers have the head dims cake's kernels take
# (K = V = 128) and it runs GDN only: the GDN kernels are the ones measured on a GPU (KDA's run
# with --layers ... kda where the build has them).
DEFAULTS = {
    "cpu": dict(layers="gdn,kda", d_model=128, heads=2, v_heads=2, head_dim=32,
                tokens=2048, steps=300, lr=3e-3),
    "cuda": dict(layers="gdn,gdn,gdn,gdn,gdn,gdn", d_model=1024, heads=4, v_heads=8,
                 head_dim=128, tokens=32768, steps=300, lr=1e-3),
}

DESCRIPTION = """\
Trains a small byte-level language model built from cake's layers (cake.layers.GatedDeltaNet,
"gdn", and cake.layers.KimiDeltaAttention, "kda": flash-linear-attention's layers on cake's ops)
and shows it learn. The text is the Python standard library's own source files, which every
Python installation has (nothing is downloaded): each file is a document, read as bytes, and the
documents are packed back to back into one row of --tokens tokens per step, with cu_seqlens
marking the documents so that no state crosses from one to the next (each step takes a quarter
of its tokens from each of four files read side by side; a long file is cut and continues in the
next step). Each step is new text, so the training loss also estimates the loss on unseen
text.

The model: a byte embedding, one block per entry of --layers (RMSNorm, the layer, residual,
RMSNorm, SwiGLU MLP of 2/3 x 4 x d_model rounded up to a multiple of 256, as FLA's models
size it, residual), RMSNorm and a byte head; AdamW (betas 0.9, 0.95, weight decay
0.01) with a linear warm-up over the first 10% of the steps and a cosine decay to 10% of --lr,
gradients clipped to norm 1. On CUDA it runs under bfloat16 autocast (cake's kernels take
bfloat16 q, k, v); on the CPU in float32 on cake's FP64 reference.

Defaults depend on the device:
  cpu:  --layers gdn,kda  --d-model 128 --heads 2 --v-heads 2 --head-dim 32 --tokens 2048
        --steps 300 --lr 3e-3  (a few minutes on two cores)
  cuda: --layers gdn x 6  --d-model 1024 --heads 4 --v-heads 8 --head-dim 128 --tokens 32768
        --steps 300 --lr 1e-3  (e.g. --layers gdn,kda,gdn,kda,gdn,kda mixes in KDA layers)"""

EPILOG = """\
output:
  stderr: a progress bar per run: step, loss of the last step, tokens/s so far, time elapsed
          and left (one line per tenth of the run when stderr is not a terminal).
  stdout, at the end, per run:
    <impl> on <device>: <blocks> blocks (<layers>), d_model D, H q/k heads, HV value heads,
        head dim K, T tokens per step, S steps[, host offsets]
    loss A -> B        the mean training loss (nats per byte; ln 256 = 5.55 is a uniform
                       guess) over the first and over the last steps (up to 10 each)
    fixed batch A -> B the loss on one fixed batch (not a training batch) before the first
                       step and after the last: what the run learned, on the same bytes
    tokens/s           tokens per second of the whole step (forward, backward, AdamW),
                       from step 4 on (the first steps include one-off set-up)
    wall               seconds for all the steps
    peak memory        CUDA: the peak of torch's allocator during the run; CPU: the peak
                       resident memory of the whole process
  and the paths of:
    loss.png           training loss against tokens seen: every step (faint) and a running
                       mean, per run (its tokens/s in the legend)
    log.json           {"settings": the model, data and device; "runs": per run "steps"
                       (step, loss, seconds since the start), loss_first, loss_last,
                       fixed_loss_before, fixed_loss_after, learned, tokens_per_second,
                       wall_seconds, peak_memory_bytes}
  with --compare fla, also the speed of cake's step over FLA's.
exit status: 0 when every run's loss stayed finite and its fixed batch's loss fell by more
than 0.05 nats per byte; 1 otherwise; 2 for a bad option (argparse's).

examples:
  python -m cake.train                          CPU or GPU defaults, whichever is here
  python -m cake.train --device cpu --steps 40  a shorter CPU run
  python -m cake.train --layers gdn,gdn,gdn     three GDN blocks
  python -m cake.train --compare fla            GPU: the same model with FLA's layers too
  bash tools/demo.sh                            the same after tools/setup.sh (arguments pass)"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m cake.train", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where to train; auto: cuda when a GPU is present and cake has its "
                             "CUDA kernels, else cpu (default: %(default)s)")
    parser.add_argument("--layers",
                        help="the layer of each block, comma-separated, from gdn and kda "
                             "(default: per device, above)")
    parser.add_argument("--d-model", type=int, help="the model's hidden size")
    parser.add_argument("--heads", type=int, help="q/k heads per layer")
    parser.add_argument("--v-heads", type=int,
                        help="value heads per layer, a multiple of --heads (grouped value heads)")
    parser.add_argument("--head-dim", type=int,
                        help="head dim K = V of q, k and v (cake's CUDA kernels take 128)")
    parser.add_argument("--tokens", type=int, help="tokens per step, packed in one row")
    parser.add_argument("--steps", type=int, help="optimizer steps")
    parser.add_argument("--lr", type=float, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the weights and of the order of the files "
                             "(default: %(default)s)")
    parser.add_argument("--save-for-backward", choices=("inverse", "saved", "recompute"),
                        help="what cake's GDN forward keeps for the backward on CUDA "
                             "(cake.chunk_gated_delta_rule; default: cake's default, inverse)")
    parser.add_argument("--cu-seqlens-cpu", action="store_true",
                        help="give cake's layers each batch's document offsets on the host too "
                             "(cu_seqlens_cpu): cake's op then walks a few long documents as "
                             "exact segments in parallel where its plan predicts a gain "
                             "(measured slower than without at the GPU defaults' batches)")
    parser.add_argument("--checkpoint", action="store_true",
                        help="recompute each block in the backward (torch.utils.checkpoint): "
                             "less activation memory, more time")
    parser.add_argument("--compare", choices=("fla",),
                        help="fla: then train the same model from the same initial weights on "
                             "the same batches with flash-linear-attention's layers, for a side "
                             "by side loss curve and speed (needs a GPU and "
                             "flash-linear-attention installed)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("cake-train"),
                        help="folder for loss.png and log.json (default: %(default)s)")
    args = parser.parse_args(argv)
    check(parser, args)
    return args


def cuda_usable() -> bool:
    return torch.cuda.is_available() and cake.build_info()["cuda_kernels"]


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Resolves --device and the per-device defaults; parser.error (exit 2) on what cannot run."""
    if args.device == "auto":
        args.device = "cuda" if cuda_usable() else "cpu"
    for name, value in DEFAULTS[args.device].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.layers = tuple(kind.strip() for kind in args.layers.split(","))
    unknown = sorted(set(args.layers) - set(LAYER_KINDS))
    if unknown or not args.layers:
        parser.error(f"--layers takes gdn and kda, comma-separated; got {unknown}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch finds no CUDA device here")
    if args.device == "cuda" and not cake.build_info()["cuda_kernels"]:
        parser.error("--device cuda: this cake was built without its CUDA kernels "
                     "(reinstall with nvcc found, or CAKE_CUDA=ON); or use --device cpu")
    if args.compare == "fla":
        if args.device != "cuda":
            parser.error("--compare fla needs a CUDA GPU: flash-linear-attention's layers run "
                         "Triton kernels (its forward cannot run on the CPU)")
        try:
            import fla.layers  # noqa: F401
        except ImportError as e:
            parser.error(f"--compare fla needs flash-linear-attention: {e} (pip install "
                         "flash-linear-attention==0.6.0)")
    for name in ("d_model", "heads", "v_heads", "head_dim", "tokens", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.v_heads % args.heads:
        parser.error(f"--v-heads {args.v_heads} must be a multiple of --heads {args.heads}")


def describe(run: dict, settings: dict) -> str:
    m, t = settings["model"], settings["training"]
    host = ", host offsets" if t.get("host_offsets") and run["label"] == "cake" else ""
    return (f"{run['label']} on {settings['device']}: {len(m['layers'])} blocks "
            f"({','.join(m['layers'])}), d_model {m['d_model']}, {m['num_heads']} q/k heads, "
            f"{m['num_v_heads']} value heads, head dim {m['head_dim']}, {t['tokens_per_step']} "
            f"tokens per step, {len(run['steps'])} steps{host}\n"
            f"  loss {run['loss_first']:.3f} -> {run['loss_last']:.3f} (mean of the first and "
            f"last {run['loss_window']} steps); fixed batch {run['fixed_loss_before']:.3f} -> "
            f"{run['fixed_loss_after']:.3f}\n"
            f"  {run['tokens_per_second']:,.0f} tokens/s, wall {run['wall_seconds']:.1f} s, "
            f"peak memory {run['peak_memory_bytes'] / 2**30:.2f} GiB")


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        # The CPU model's heads are small on purpose (the FP64 reference's speed): no warning
        # that CUDA would refuse them.
        warnings.simplefilter("ignore", cake.CudaSupportWarning)
    model_config = ModelConfig(layers=args.layers, d_model=args.d_model, num_heads=args.heads,
                               num_v_heads=args.v_heads, head_dim=args.head_dim,
                               save_for_backward=args.save_for_backward,
                               checkpoint=args.checkpoint)
    train_config = TrainConfig(steps=args.steps, tokens_per_step=args.tokens, lr=args.lr,
                               seed=args.seed, device=device, host_offsets=args.cu_seqlens_cpu)
    torch.manual_seed(args.seed)
    model = LanguageModel(model_config, impl="cake")
    initial_weights = copy.deepcopy(model.state_dict())
    settings = {
        "model": {**dataclasses.asdict(model_config),
                  "parameters": sum(p.numel() for p in model.parameters())},
        "training": {k: v for k, v in dataclasses.asdict(train_config).items() if k != "device"},
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"),
        "corpus": {"stdlib": sysconfig.get_paths()["stdlib"], "files": len(source_files())},
        "versions": {"cake": cake.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
    }
    runs = [train(model, train_config, "cake")]
    if args.compare == "fla":
        fla_model = LanguageModel(model_config, impl="fla")
        fla_model.load_state_dict(initial_weights)  # the same names: the same start
        runs.append(train(fla_model, train_config, "fla"))

    args.out.mkdir(parents=True, exist_ok=True)
    log_path, plot_path = args.out / "log.json", args.out / "loss.png"
    write_log(log_path, settings, runs)
    plotted = write_plot(plot_path, f"{settings['model']['parameters']:,}-parameter byte LM, "
                                    f"{','.join(args.layers)}, on {settings['device']}", runs)
    for run in runs:
        print(describe(run, settings))
    if len(runs) == 2:
        ratio = runs[0]["tokens_per_second"] / runs[1]["tokens_per_second"]
        print(f"speed: cake's training step at {ratio:.2f}x FLA's (tokens/s)")
    print(f"wrote {plot_path}" if plotted else
          "no loss.png: matplotlib is not installed (pip install matplotlib, or cake[train])")
    print(f"wrote {log_path}")
    failed = [r["label"] for r in runs
              if not all(math.isfinite(s["loss"]) for s in r["steps"]) or not r["learned"]]
    if failed:
        print(f"the loss did not stay finite or the fixed batch's loss did not fall by more "
              f"than {LEARNED_MARGIN} for: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)
