"""Where one call's GPU time goes: the time of each kernel (and memset or copy) of one run of a
benchmark step, from torch.profiler (CUPTI), summed per kernel name. The benchmarks record it for
cake's arms next to the cell's median, so that a cell that misses its bar says which stage to work
on. One run after a warm-up, L2 not flushed: the shares, not the cell's time."""

import re

import torch


def short_name(name: str) -> str:
    """A kernel's demangled name without namespaces and parameters, its template arguments kept:
    "void cake::kernels::walk_a_bwd::walk_a_bwd_kernel<cake::kernels::ChannelDecay>(...)" ->
    "walk_a_bwd_kernel<ChannelDecay>"."""
    name = re.sub(r"^void\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    depth = 0
    for i, c in enumerate(name):  # cut the parameter list: the first "(" outside <...>
        depth += (c == "<") - (c == ">")
        if c == "(" and depth == 0:
            name = name[:i]
            break
    name = re.sub(r"\b[A-Za-z_]\w*::", "", name)  # every namespace or class qualifier
    return re.sub(r"\s+", " ", name).strip() or "?"


def _profiled_events(run, warmup: int, activities) -> list:
    """The profiler's events of one run() after `warmup` runs; [] without a GPU."""
    if not torch.cuda.is_available():
        return []
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        run()
        torch.cuda.synchronize()
    return prof.events()


def _kernels(events):
    """(event, ms) of every device kernel, memset or copy among events: the GPU-side spans that
    torch.profiler gives user ranges (is_user_annotation) are not kernels."""
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if getattr(event, "is_user_annotation", False):
            continue
        us = getattr(event, "device_time", None)
        if us is None:
            us = getattr(event, "cuda_time", 0.0)
        yield event, us / 1e3


def kernel_times(run, warmup: int = 1) -> dict[str, float]:
    """{kernel: ms} of one run() after `warmup` runs, largest first; {} where the profiler records
    no device activity (no GPU, or no CUPTI)."""
    events = _profiled_events(run, warmup, [torch.profiler.ProfilerActivity.CUDA])
    totals: dict[str, float] = {}
    for event, ms in _kernels(events):
        key = short_name(event.name)
        totals[key] = totals.get(key, 0.0) + ms
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def phase_times(run, prefix: str, warmup: int = 1) -> dict[str, float]:
    """{phase: ms} of one run() after `warmup` runs (phases_of over the profiler's events); {}
    where the profiler records no device activity."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    return phases_of(_profiled_events(run, warmup, activities), prefix)


def _launched_ms(event) -> float:
    """The device time of the kernels launched under a CPU event and its children, without the
    GPU-side span that torch.profiler gives a user range of the same name."""
    own = sum(k.duration for k in event.kernels if k.name != event.name)
    return own / 1e3 + sum(_launched_ms(child) for child in event.cpu_children)


def phases_of(events, prefix: str) -> dict[str, float]:
    """{phase: ms}: the kernels launched under each CPU range named prefix + phase (the prefix
    cut), and under "other" every kernel outside them; {} without device kernels."""
    phases: dict[str, float] = {}
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CUDA and event.name.startswith(prefix):
            name = event.name[len(prefix):]
            phases[name] = phases.get(name, 0.0) + _launched_ms(event)
    kernels = sum(ms for _, ms in _kernels(events))
    if not kernels:
        return {}
    phases["other"] = max(kernels - sum(phases.values()), 0.0)
    return dict(sorted(phases.items(), key=lambda kv: -kv[1]))


def summary(times: dict[str, float], top: int = 8) -> str:
    """The largest entries as "name ms (share %)" on one line."""
    total = sum(times.values()) or 1.0
    return "; ".join(f"{name} {ms:.2f} ms ({100 * ms / total:.0f} %)"
                     for name, ms in list(times.items())[:top])
