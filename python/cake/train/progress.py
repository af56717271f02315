"""A progress bar on stderr: one line redrawn in place on a terminal, else a line every tenth of
the run (so that logs stay short)."""

import sys
import time


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60:02d}:{int(seconds) % 60:02d}"


class Progress:
    def __init__(self, label: str, steps: int, stream=sys.stderr):
        self.label, self.steps, self.stream = label, steps, stream
        self.tty = stream.isatty()
        self.start = time.perf_counter()

    def update(self, step: int, loss: float, tokens_per_s: float) -> None:
        """After step (1-based) of self.steps: its loss and the tokens per second so far."""
        if not self.tty and step not in (1, self.steps) and step % max(1, self.steps // 10):
            return
        elapsed = time.perf_counter() - self.start
        left = elapsed / step * (self.steps - step)
        width = 24
        filled = width * step // self.steps
        line = (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {step}/{self.steps} "
                f"loss {loss:.3f}  {tokens_per_s:,.0f} tok/s  {_clock(elapsed)} elapsed, "
                f"{_clock(left)} left")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if step == self.steps else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
