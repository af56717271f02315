"""The run's outputs: the JSON log and the loss curve as a PNG."""

import json
import pathlib


def write_log(path: pathlib.Path, settings: dict, runs: list[dict]) -> None:
    """{"settings": what ran (model, data, device), "runs": one record per implementation}."""
    path.write_text(json.dumps({"settings": settings, "runs": runs}, indent=1) + "\n")


def write_plot(path: pathlib.Path, title: str, runs: list[dict]) -> bool:
    """Loss against tokens seen per run: every step (faint) and a running mean, with the run's
    tokens/s in the legend. False (nothing written) where matplotlib is not installed: cake
    itself needs only torch."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=120)
    for index, run in enumerate(runs):
        tokens = [s["step"] * run["tokens"] / len(run["steps"]) for s in run["steps"]]
        losses = [s["loss"] for s in run["steps"]]
        # Each step is other text, so single steps are noisy: a running mean over steps on top.
        window = max(1, len(losses) // 30)
        mean = [sum(losses[max(0, i + 1 - window):i + 1]) / (i + 1 - max(0, i + 1 - window))
                for i in range(len(losses))]
        line, = axes.plot(tokens, losses, linewidth=0.6, alpha=0.35)
        # Runs from the same weights on the same batches overlap: later ones dashed, so all show.
        axes.plot(tokens, mean, linewidth=1.6, color=line.get_color(),
                  linestyle="-" if index == 0 else "--",
                  label=f"{run['label']}: mean of {window} steps "
                        f"({run['tokens_per_second']:,.0f} tokens/s)")
    axes.set_xlabel("tokens seen")
    axes.set_ylabel("training loss (nats per byte)")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return True
